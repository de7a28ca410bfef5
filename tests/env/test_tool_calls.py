"""Parsing one tool call out of model text: R2E-Gym XML, Hermes and bare JSON; every malformed turn is a FormatError."""

import json

import pytest

from patchgym.env.tools import TOOL_NAMES, TOOL_SCHEMAS
from patchgym.env.tools.calls import FormatError, ToolCall, parse_tool_call, render_call_xml


def error_of(text: str) -> str:
    with pytest.raises(FormatError) as info:
        parse_tool_call(text)
    return str(info.value)


# -- R2E-Gym XML -----------------------------------------------------------------------------------------------
def test_xml_call_after_reasoning():
    text = ("Let me look at the file first.\n<function=file_editor>\n<parameter=command>view</parameter>\n"
            "<parameter=path>/testbed/calc/ops.py</parameter>\n</function>")
    call = parse_tool_call(text)
    assert call == ToolCall("file_editor", {"command": "view", "path": "/testbed/calc/ops.py"}, call.raw)
    assert call.raw.startswith("<function=file_editor>") and call.raw.endswith("</function>")


def test_plain_values_are_stripped_like_r2egym():
    text = "<function=execute_bash>\n<parameter=command>\n  ls -la /testbed  \n</parameter>\n</function>"
    call = parse_tool_call(text)
    assert call.arguments == {"command": "ls -la /testbed"}


def test_code_values_keep_indentation_and_inner_newlines():
    text = ("<function=file_editor>\n<parameter=command>str_replace</parameter>\n<parameter=path>/testbed/a.py"
            "</parameter>\n<parameter=old_str>\n        return a - b\n\n    x = 1\n</parameter>\n"
            "<parameter=new_str>    return a + b\n</parameter>\n</function>")
    args = parse_tool_call(text).arguments
    assert args["old_str"] == "        return a - b\n\n    x = 1"  # one wrapping newline dropped on each side
    assert args["new_str"] == "    return a + b"  # first-line indentation kept: a de-indent is not lost


def test_only_one_wrapping_newline_is_dropped():
    text = "<function=file_editor><parameter=command>create</parameter><parameter=path>a.txt</parameter>" \
           "<parameter=file_text>\n\nline\n\n</parameter></function>"
    assert parse_tool_call(text).arguments["file_text"] == "\nline\n"


def test_value_may_contain_parameter_and_function_tags():
    old = 'pattern = "</parameter> and <function=x>"\nend = "</function>"'
    text = (f"<function=file_editor>\n<parameter=command>str_replace</parameter>\n<parameter=path>/testbed/p.py"
            f"</parameter>\n<parameter=old_str>{old}</parameter>\n<parameter=new_str>pass</parameter>\n</function>")
    call = parse_tool_call(text)
    assert call.arguments["old_str"] == old and call.arguments["new_str"] == "pass"


def test_code_with_braces_and_json_is_a_value_not_a_call():
    code = 'def f():\n    return {"name": "search", "arguments": {}}\n'
    text = (f"<function=file_editor><parameter=command>create</parameter><parameter=path>/testbed/f.py</parameter>"
            f"<parameter=file_text>{code}</parameter></function>")
    assert parse_tool_call(text).arguments["file_text"] == code.rstrip("\n")


def test_missing_closing_function_tag_is_accepted():
    # Serving stacks often use </function> as the stop sequence and cut it off.
    call = parse_tool_call("<function=search>\n<parameter=search_term>def add</parameter>\n")
    assert call == ToolCall("search", {"search_term": "def add"}, call.raw)


def test_calls_inside_reasoning_are_ignored():
    text = ("<think>maybe <function=finish></function> now? no.</think>\n"
            "<function=search><parameter=search_term>add</parameter></function>")
    assert parse_tool_call(text).name == "search"
    assert parse_tool_call("thinking ...</think><function=finish></function>").name == "finish"
    value = parse_tool_call("a</think><function=execute_bash><parameter=command>echo '</think>'</parameter></function>")
    assert value.arguments == {"command": "echo '</think>'"}


def test_no_call_is_a_format_error_with_the_expected_format():
    message = error_of("I think the bug is in ops.py.")
    assert "no tool call" in message and "<function=TOOL_NAME>" in message and "file_editor(" in message
    assert isinstance(FormatError("x"), ValueError)


def test_several_calls_are_a_format_error():
    text = ("<function=search><parameter=search_term>a</parameter></function>\n"
            "<function=search><parameter=search_term>b</parameter></function>")
    assert "more than one tool call" in error_of(text)


@pytest.mark.parametrize("text, expected", [
    ("<function=rm_rf><parameter=path>/</parameter></function>", "Unknown tool 'rm_rf'"),
    ("<function=file_editor><parameter=command>view</parameter></function>", "Missing required parameter 'path'"),
    ("<function=search><parameter=search_term>a</parameter><parameter=regex>1</parameter></function>",
     "Unknown parameter 'regex' for search. Its parameters are: search_term, path"),
    ("<function=file_editor><parameter=command>view</parameter><parameter=path>a</parameter>"
     "<parameter=concise>True</parameter></function>", "Unknown parameter 'concise'"),
    ("<function=search><parameter=search_term>a</parameter><parameter=search_term>b</parameter></function>",
     "given twice"),
    ("<function=search><parameter=search_term>a</function>", "not closed with </parameter>"),
    ("<function=search>look: <parameter=search_term>a</parameter></function>", "Unexpected text inside"),
    ("<function=file_editor><parameter=command>view</parameter><parameter=path>a</parameter>"
     "<parameter=view_range>[1]</parameter></function>", "must be [10, 40]"),
    ("<function=file_editor><parameter=command>insert</parameter><parameter=path>a</parameter>"
     "<parameter=insert_line>five</parameter><parameter=new_str>x</parameter></function>", "must be an integer"),
])
def test_invalid_calls_say_what_is_wrong(text, expected):
    assert expected in error_of(text)


def test_submit_and_r2egym_parameter_names_are_accepted():
    text = "<function=submit><parameter=command>submit</parameter><parameter=result>fixed</parameter></function>"
    assert parse_tool_call(text).name == "finish" and parse_tool_call(text).arguments == {"result": "fixed"}
    call = parse_tool_call("<function=execute_bash><parameter=cmd>git status</parameter></function>")
    assert call.arguments == {"command": "git status"}


@pytest.mark.parametrize("value, expected", [
    ("[1, 20]", [1, 20]), ("1,20", [1, 20]), ("(5 -1)", [5, -1]), ([3, -1], [3, -1]), (["3", "-1"], [3, -1])])
def test_view_range_is_coerced(value, expected):
    call = {"name": "file_editor", "arguments": {"command": "view", "path": "a", "view_range": value}}
    assert parse_tool_call(json.dumps(call)).arguments["view_range"] == expected


def test_insert_line_is_coerced_and_booleans_refused():
    args = {"command": "insert", "path": "a", "new_str": "x"}
    assert parse_tool_call(json.dumps({"name": "file_editor", "arguments": {**args, "insert_line": " 7 "}})) \
        .arguments["insert_line"] == 7
    assert "must be an integer" in error_of(json.dumps({"name": "file_editor", "arguments": {**args,
                                                                                              "insert_line": True}}))


# -- JSON forms ------------------------------------------------------------------------------------------------
def test_hermes_tool_call():
    code = "if x:\n    y = {'a': [1, 2]}\n"
    payload = {"name": "file_editor", "arguments": {"command": "create", "path": "/testbed/n.py", "file_text": code}}
    call = parse_tool_call(f"I'll create it.\n<tool_call>\n{json.dumps(payload)}\n</tool_call>")
    assert call.name == "file_editor" and call.arguments["file_text"] == code  # JSON values are exact
    assert call.raw.startswith("<tool_call>") and call.raw.endswith("</tool_call>")


def test_hermes_arguments_as_json_string_and_closing_tag_in_a_value():
    inner = json.dumps({"command": "echo '</tool_call>' {}"})
    call = parse_tool_call(f'<tool_call>{json.dumps({"name": "execute_bash", "arguments": inner})}</tool_call>')
    assert call.arguments == {"command": "echo '</tool_call>' {}"}


def test_hermes_with_xml_inside_as_qwen3_coder_writes_it():
    text = "<tool_call>\n<function=search>\n<parameter=search_term>\nadd\n</parameter>\n</function>\n</tool_call>"
    assert parse_tool_call(text).arguments == {"search_term": "add"}


def test_hermes_errors():
    assert "malformed" in error_of('<tool_call>{"name": "search", "arguments": {"search_term": }}</tool_call>')
    two = '<tool_call>{"name": "finish"}</tool_call><tool_call>{"name": "finish"}</tool_call>'
    assert "more than one tool call" in error_of(two)
    assert '"arguments" is a string but not valid JSON' in error_of(
        '<tool_call>{"name": "search", "arguments": "{oops"}</tool_call>')
    assert '<tool_call>\n{"name": "TOOL_NAME"' in error_of('<tool_call>[1, 2]</tool_call>')


def test_bare_json_objects():
    plain = parse_tool_call('Running the tests.\n{"name": "execute_bash", "arguments": {"command": "pytest -q"}}')
    assert plain.arguments == {"command": "pytest -q"}
    fenced = parse_tool_call('```json\n{"arguments": {"search_term": "add"}, "name": "search"}\n```')
    assert fenced.name == "search"
    openai = {"type": "function", "function": {"name": "search", "arguments": json.dumps({"search_term": "x"})}}
    assert parse_tool_call(json.dumps(openai)).arguments == {"search_term": "x"}


def test_bare_json_ignores_other_objects_but_reports_malformed_calls():
    text = 'The config is {"debug": true}.\n{"name": "finish", "arguments": {}}'
    assert parse_tool_call(text).name == "finish"
    assert "malformed" in error_of('{"name": "search", "arguments": {"search_term": "x"}')
    assert "more than one tool call" in error_of('{"name": "finish"} {"name": "finish"}')


# -- rendering and schemas -------------------------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    ToolCall("execute_bash", {"command": "cd /testbed && python -c 'print({1: 2})'"}),
    ToolCall("file_editor", {"command": "str_replace", "path": "/testbed/a.py", "old_str": "\n  x = 1\n\n",
                             "new_str": "  x = 2\n"}),
    ToolCall("file_editor", {"command": "view", "path": "/testbed/a.py", "view_range": [3, -1]}),
    ToolCall("file_editor", {"command": "insert", "path": "a", "insert_line": 0, "new_str": "</parameter>"}),
    ToolCall("finish", {}),
])
def test_render_then_parse_gives_the_same_call(call):
    text = render_call_xml(call)
    assert text.startswith(f"<function={call.name}>") and text.endswith("</function>")
    parsed = parse_tool_call(text)
    assert (parsed.name, parsed.arguments) == (call.name, call.arguments)


def test_schemas_describe_the_four_tools():
    assert [s["function"]["name"] for s in TOOL_SCHEMAS] == list(TOOL_NAMES)
    for schema in TOOL_SCHEMAS:
        params = schema["function"]["parameters"]
        assert schema["type"] == "function" and schema["function"]["description"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])


def test_tool_schemas_tell_the_run_s_workdir_and_timeout():
    from patchgym.env.tools import TOOL_SCHEMAS, tool_schemas

    schemas = tool_schemas("/work/repo", 30)
    text = str(schemas)
    assert "/testbed" not in text and "/work/repo" in text and "killed after 30 seconds" in text
    assert tool_schemas() == TOOL_SCHEMAS  # the defaults are the published descriptions


def test_a_native_call_round_trips():
    from patchgym.env.tools import render_call_json

    call = ToolCall("file_editor", {"command": "view", "path": "a.py", "view_range": [1, 5]})
    parsed = parse_tool_call(render_call_json(call))
    assert (parsed.name, parsed.arguments) == (call.name, call.arguments)
