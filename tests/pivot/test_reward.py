"""The local reward at the states of a real expert demo (in memory): format errors and other tools earn 0, edits by
their effect on the file as it was, views and searches by reaching the expert's file, finish only where the expert
finished; the program rule of the bash check. The bash check itself runs in tests/pivot/test_sandbox.py."""

import pytest

from patchgym.env.tools import ToolCall, render_call_json, render_call_xml
from patchgym.pivot.config import CreditConfig
from patchgym.pivot.reward import InvalidEdit, apply_edit, local_reward, program


def xml(name, **arguments):
    return render_call_xml(ToolCall(name, arguments))


def edit(old, new, path="calc.py", command="str_replace"):
    return xml("file_editor", command=command, path=path, old_str=old, new_str=new)


def verdict(point, text, credit=None):
    found = local_reward(point, text, credit)
    return found.reward, found.reason


def test_text_without_a_call_or_with_another_tool_earns_nothing(points):
    for point in points.values():
        assert verdict(point, "The bug is in calc.py, I will fix it.") == (0.0, "format_error")
        assert verdict(point, xml("search", search_term="add") + xml("finish")) == (0.0, "format_error")
    assert verdict(points["str_replace"], xml("search", search_term="add")) == (0.0, "other_tool")
    assert verdict(points["search"], xml("finish")) == (0.0, "other_tool")
    assert verdict(points["finish"], xml("finish")) == (1.0, "finish")
    assert verdict(points["finish"], render_call_json(ToolCall("submit", {}))) == (1.0, "finish")


def test_an_edit_earns_by_the_file_it_leaves(points):
    point = points["str_replace"]
    assert verdict(point, point.action) == (1.0, "edit_matches")
    assert verdict(point, edit("a - b", "a + b")) == (1.0, "edit_matches")  # another old_str, the same file
    assert verdict(point, edit("a - b", "a + b", path="/testbed/./calc.py")) == (1.0, "edit_matches")
    assert verdict(point, edit("a - b", "b + a")) == (0.25, "edit_valid")
    assert verdict(point, edit("a - b", "b + a"), CreditConfig(edit_valid=0.1)) == (0.1, "edit_valid")
    assert verdict(point, edit("a * b", "a + b")) == (0.0, "edit_invalid")  # not in the file
    assert verdict(point, edit("a", "c")) == (0.0, "edit_invalid")  # more than once
    assert verdict(point, edit("a - b", "a - b")) == (0.0, "edit_invalid")
    assert verdict(point, edit("a - b", "a + b", path="other.py")) == (0.0, "other_file")
    assert verdict(point, xml("file_editor", command="create", path="calc.py", file_text="x")) == (0.0, "edit_invalid")
    assert verdict(point, xml("file_editor", command="view", path="calc.py")) == (0.0, "other_command")
    whole = "def add(a, b):\n    return a + b\n"
    assert verdict(point, xml("file_editor", command="insert", path="calc.py", insert_line=1,
                              new_str="    return a + b")) == (0.25, "edit_valid")  # applies, keeps the bug below
    assert apply_edit(point.files["/testbed/calc.py"], {"command": "str_replace", "old_str": "a - b",
                                                        "new_str": "a + b"}) == whole


def test_a_view_or_search_earns_by_reaching_the_expert_s_file(points):
    view = points["view"]
    assert verdict(view, view.action) == (1.0, "view_reaches")
    for path in ("calc.py", "/testbed/calc.py", "./sub/../calc.py"):
        assert verdict(view, xml("file_editor", command="view", path=path, view_range=[1, 2])) == (1.0, "view_reaches")
    assert verdict(view, xml("file_editor", command="view", path="setup.py")) == (0.0, "other_file")
    assert verdict(view, edit("a - b", "a + b")) == (0.0, "other_command")

    search = points["search"]
    term = search.call["arguments"]["search_term"]
    assert term in search.files["/testbed/calc.py"]
    assert verdict(search, search.action) == (1.0, "search_reaches")
    assert verdict(search, xml("search", search_term=f"def {term}", path="/testbed")) == (1.0, "search_reaches")
    assert verdict(search, xml("search", search_term="return")) == (0.25, "search_finds_file")
    assert verdict(search, xml("search", search_term="return", path="docs")) == (0.0, "search_misses")
    assert verdict(search, xml("search", search_term="multiply")) == (0.0, "search_misses")


def test_a_bash_state_needs_the_bash_check(points):
    with pytest.raises(ValueError, match=r"state memory.calc.0#0@3: the expert runs a command there"):
        local_reward(points["execute_bash"], xml("execute_bash", command="ls"))
    assert verdict(points["execute_bash"], xml("finish")) == (0.0, "other_tool")  # no command to run


def test_the_program_of_a_command_line():
    assert program("python3 -m pytest -q tests/test_x.py") == "python -m pytest"
    assert program("PYTHONPATH=. python3.11 -m py_compile a.py") == "python -m py_compile"
    assert program("env A=1 /usr/bin/git status && ls") == "git"
    assert program("python -c 'print(1)'") == "python"
    assert program("echo 'unclosed") is None
    assert program("# only a comment") is None


def test_edits_the_editor_refuses_are_invalid():
    with pytest.raises(InvalidEdit, match="exactly once"):
        apply_edit("aa\n", {"command": "str_replace", "old_str": "a", "new_str": "b"})
    with pytest.raises(InvalidEdit, match="exactly once"):  # overlapping matches count
        apply_edit("aaa\n", {"command": "str_replace", "old_str": "aa", "new_str": "b"})
    with pytest.raises(InvalidEdit, match="out of the file"):
        apply_edit("one\ntwo\n", {"command": "insert", "insert_line": 3, "new_str": "x"})
    with pytest.raises(InvalidEdit, match="does not exist"):
        apply_edit(None, {"command": "str_replace", "old_str": "a", "new_str": "b"})
    assert apply_edit("one\ntwo", {"command": "insert", "insert_line": 2, "new_str": "x"}) == "one\ntwo\nx\n"
    assert apply_edit(None, {"command": "create", "file_text": "x"}) == "x\n"
