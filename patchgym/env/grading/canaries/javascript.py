"""Planting canaries in a tape test file: twins and inverses of chosen tests (`test('name', function (t) {...})`
calls at the top level, or `t.test(...)` inside another test), each inserted right after the call it copies, with a
name made from the words of the file's own test names. Found with tree-sitter's JavaScript grammar."""

import json
import random
import re

import tree_sitter
import tree_sitter_javascript

from patchgym.env.grading.canaries import Canary

_LANGUAGE = tree_sitter.Language(tree_sitter_javascript.language())  # a parser per call: grades run in threads
# tape's assertions whose negation is exact (tape 5: `equal` is Object.is, `deepEqual` strict deep-equal, ...).
_EQUAL = ("equal", "equals", "isEqual", "strictEqual", "strictEquals", "is")
_NOT_EQUAL = ("notEqual", "notEquals", "isNotEqual", "doesNotEqual", "isNot", "not", "notStrictEqual",
              "notStrictEquals", "isInequal")
_DEEP = ("deepEqual", "deepEquals", "isEquivalent", "same")
_NOT_DEEP = ("notDeepEqual", "notDeepEquals", "notEquivalent", "notDeeply", "notSame", "isNotDeepEqual",
             "isNotDeeply", "isNotEquivalent", "isInequivalent")
_LOOSE = ("looseEqual", "looseEquals")
_NOT_LOOSE = ("notLooseEqual", "notLooseEquals")
_DEEP_LOOSE = ("deepLooseEqual",)
_NOT_DEEP_LOOSE = ("notDeepLooseEqual",)
_TRUE = ("ok", "true", "assert")
_FALSE = ("notOk", "false", "notok")
NEGATIONS = {**dict.fromkeys(_EQUAL, "notEqual"), **dict.fromkeys(_NOT_EQUAL, "equal"),
             **dict.fromkeys(_DEEP, "notDeepEqual"), **dict.fromkeys(_NOT_DEEP, "deepEqual"),
             **dict.fromkeys(_LOOSE, "notLooseEqual"), **dict.fromkeys(_NOT_LOOSE, "looseEqual"),
             **dict.fromkeys(_DEEP_LOOSE, "notDeepLooseEqual"), **dict.fromkeys(_NOT_DEEP_LOOSE, "deepLooseEqual"),
             **dict.fromkeys(_TRUE, "notOk"), **dict.fromkeys(_FALSE, "ok")}
_FUNCTIONS = ("function_expression", "arrow_function", "function")
_UNARY = _TRUE + _FALSE  # the rest take two values; then a message, then options (`{ skip: ... }`) we never copy


def _string_value(node) -> str | None:
    """The value of a string literal node (a template without substitutions included), or None."""
    text = node.text.decode()
    if node.type == "string":
        try:
            return json.loads('"' + text[1:-1].replace('\\\'', "'").replace('"', '\\"') + '"') if text[0] == "'" \
                else json.loads(text)
        except ValueError:
            return None
    if node.type == "template_string" and not any(c.type == "template_substitution" for c in node.named_children):
        return text[1:-1]
    return None


def _test_call(statement):
    """(name node, callback node) when `statement` is `X(name, [opts,] function (t) {...})` with X `test`, `tape` or
    `something.test`; else None."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    call = statement.named_children[0]
    if call.type != "call_expression":
        return None
    function = call.child_by_field_name("function")
    if function is None or not (
            (function.type == "identifier" and function.text.decode() in ("test", "tape"))
            or (function.type == "member_expression" and function.child_by_field_name("property").text == b"test")):
        return None
    arguments = [a for a in call.child_by_field_name("arguments").named_children if a.type != "comment"]
    if len(arguments) < 2 or _string_value(arguments[0]) is None:
        return None
    callback = next((a for a in arguments[1:3] if a.type in _FUNCTIONS), None)
    return (arguments[0], callback, arguments[1] is not callback) if callback is not None else None


def _tests_in(block) -> dict[str, tuple]:
    """name -> (statement, name node, callback, whether it has options) of the test calls directly in `block`; a
    repeated name is left out (its ids get ' #2' suffixes, which a copy would shift)."""
    found, repeated = {}, set()
    for statement in block.named_children:
        call = _test_call(statement)
        if call is None:
            continue
        name = _string_value(call[0])
        if name in found:
            repeated.add(name)
        found[name] = (statement, *call)
    return {name: found[name] for name in found if name not in repeated}


def _body(callback):
    body = callback.child_by_field_name("body")
    return body if body is not None and body.type == "statement_block" else None


def _parameter(callback) -> str | None:
    parameters = callback.child_by_field_name("parameters") or callback.child_by_field_name("parameter")
    if parameters is None:
        return None
    if parameters.type == "identifier":
        return parameters.text.decode()
    first = next((p for p in parameters.named_children if p.type == "identifier"), None)
    return first.text.decode() if first is not None else None


def _plans(callback, body) -> bool:
    """Whether the test whose callback is `callback` calls `t.plan(...)` in its own `body`."""
    name = _parameter(callback)
    for statement in body.named_children:
        call = statement.named_children[0] if statement.type == "expression_statement" and statement.named_children \
            else None
        function = call.child_by_field_name("function") if call is not None and call.type == "call_expression" else None
        if function is not None and function.type == "member_expression" and \
                function.child_by_field_name("object").text.decode() == name and \
                function.child_by_field_name("property").text == b"plan":
            return True
    return False


def _last_assertion(callback):
    """The property node of the last top-level `t.<assertion>(...)` statement of `callback`'s body whose negation is
    exact, or None."""
    body, name = _body(callback), _parameter(callback)
    if body is None or name is None:
        return None
    for statement in reversed(body.named_children):
        call = statement.named_children[0] if statement.type == "expression_statement" and statement.named_children \
            else None
        function = call.child_by_field_name("function") if call is not None and call.type == "call_expression" else None
        if function is not None and function.type == "member_expression":
            target, prop = function.child_by_field_name("object"), function.child_by_field_name("property")
            arguments = [a for a in call.child_by_field_name("arguments").named_children if a.type != "comment"]
            most = 2 if prop.text.decode() in _UNARY else 3
            plain = len(arguments) <= most and not any(a.type == "object" for a in arguments[most - 1:])
            if target.type == "identifier" and target.text.decode() == name and prop.text.decode() in NEGATIONS \
                    and plain:
                return prop
    return None


def _quoted(value: str, quote: str) -> str:
    """`value` as a string literal in the quotes the file used (' " or `)."""
    if quote == '"':
        return json.dumps(value)
    escaped = value.replace("\\", "\\\\").replace(quote, "\\" + quote)
    return f"{quote}{escaped}{quote}"


def _vocabulary(root) -> list[str]:
    words = set()
    stack = [root]
    while stack:
        node = stack.pop()
        call = _test_call(node)
        if call is not None:
            words.update(w for w in re.findall(r"[A-Za-z]+", _string_value(call[0]) or "") if len(w) > 1)
        stack.extend(node.named_children)
    return sorted(words) or ["works", "with", "value", "input"]


def _new_name(words: list[str], taken: set[str], rng: random.Random) -> str:
    while True:
        name = " ".join(rng.sample(words, min(len(words), rng.choice((2, 3, 3, 4)))))
        if name not in taken:
            taken.add(name)
            return name
        words = [*words, rng.choice(("again", "more", "other", "also", "too", "as well"))]


def plant(path: str, text: str, targets: list[tuple[str, str]], rng: random.Random,
          known: frozenset[str] = frozenset()) -> tuple[str, list[Canary]]:
    """`text` (the test file at `path`) with canaries planted after each target, and the canaries.

    `targets`: (test name, with nested tests as "PARENT > CHILD", which) with which "both", "twin" or "inverse".
    `known`: test names no canary may take (the task's)."""
    raw = text.encode()
    root = tree_sitter.Parser(_LANGUAGE).parse(raw).root_node
    if root.has_error:
        return text, []
    words = _vocabulary(root)
    edits, canaries = [], []
    for name, which in targets:
        block, found = root, None
        parts = name.split(" > ")
        for depth, part in enumerate(parts):
            tests = _tests_in(block)
            if part not in tests:
                found = None
                break
            found = tests[part]
            if depth < len(parts) - 1:
                block = _body(found[2])
                if block is None or _plans(found[2], block):  # a planned parent counts its subtests: one more fails it
                    found = None
                    break
        if found is None or found[3]:  # options (skip, todo, ...) change what a result means: not copied
            continue
        statement, name_node, callback, _ = found
        taken = set(_tests_in(block)) | known
        indent = raw[raw.rfind(b"\n", 0, statement.start_byte) + 1:statement.start_byte].decode()
        parent = " > ".join(parts[:-1])
        copies = []

        def copy(kind: str, prop=None):
            new = _new_name(words, taken, rng)
            pieces = [(name_node.start_byte, name_node.end_byte, _quoted(new, name_node.text.decode()[0]).encode())]
            if prop is not None:
                pieces.append((prop.start_byte, prop.end_byte, NEGATIONS[prop.text.decode()].encode()))
            chunk, at = b"", statement.start_byte
            for start, end, replacement in sorted(pieces):
                chunk += raw[at:start] + replacement
                at = end
            chunk += raw[at:statement.end_byte]
            copies.append(chunk.decode())
            canaries.append(Canary(kind, f"{path}::{name}", f"{path}::{parent + ' > ' if parent else ''}{new}"))

        if which in ("both", "twin"):
            copy("twin")
        prop = _last_assertion(callback) if which in ("both", "inverse") else None
        if prop is not None:
            copy("inverse", prop)
        rng.shuffle(copies)
        edits.append((statement.end_byte, "".join(f"\n\n{indent}{c}" for c in copies).encode()))
    for at, addition in sorted(edits, reverse=True):
        raw = raw[:at] + addition + raw[at:]
    return raw.decode(), canaries
