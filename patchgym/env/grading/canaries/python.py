"""Planting canaries in a pytest test file: twins, inverses and mismatches of chosen test functions (module-level, or
methods of test classes), each inserted right after the function it copies, with a name made from the words of the
file's own test names."""

import ast
import random
import re
import threading

from patchgym.env.grading.canaries import Canary

# unittest assertions whose negation is exact: method -> (method of the negation, how many arguments it keeps).
_UNITTEST_NEGATIONS = {"assertTrue": "assertFalse", "assertFalse": "assertTrue", "assertIsNone": "assertIsNotNone",
                       "assertIsNotNone": "assertIsNone", "assertIs": "assertIsNot", "assertIsNot": "assertIs",
                       "assertIn": "assertNotIn", "assertNotIn": "assertIn", "assertIsInstance": "assertNotIsInstance",
                       "assertNotIsInstance": "assertIsInstance"}
# CPython 3.11's ast.parse is not thread-safe ("AST constructor recursion depth mismatch"), and grades run in
# threads.
_PARSE_LOCK = threading.Lock()
_EQUALITIES = ("assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual",
               "assertSetEqual", "assertMultiLineEqual", "assertSequenceEqual")


def _find(tree: ast.Module, classes: tuple[str, ...], name: str):
    body = tree.body
    for cls in classes:
        found = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if found is None:
            return None
        body = found.body
    return next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)


def _whole_lines(node: ast.stmt, lines: list[str]) -> bool:
    """Whether `node` alone fills the lines it is on (no other statement shares them)."""
    before = lines[node.lineno - 1][:node.col_offset]
    after = lines[node.end_lineno - 1][node.end_col_offset:]
    return not before.strip() and (not after.strip() or after.strip().startswith("#"))


def negated(node: ast.stmt) -> str | None:
    """The text of `node` negated, when it is an assertion whose negation is exact; else None."""
    if isinstance(node, ast.Assert):
        message = f", {ast.unparse(node.msg)}" if node.msg is not None else ""
        return f"assert not ({ast.unparse(node.test)}){message}"
    call = node.value if isinstance(node, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "self" and not call.keywords):
        return None
    method, args = call.func.attr, [ast.unparse(a) for a in call.args]
    if method in _EQUALITIES and len(args) in (2, 3):  # `if not first == second: fail` is what they check
        return f"self.assertFalse(({args[0]}) == ({args[1]}){', ' + args[2] if len(args) == 3 else ''})"
    if method in _UNITTEST_NEGATIONS:
        return f"self.{_UNITTEST_NEGATIONS[method]}({', '.join(args)})"
    return None


def mismatched(node: ast.stmt) -> str | None:
    """The text of `node`, an equality assertion, with its expected value `R` replaced by `[R]`: a value nothing that
    equals R equals too, except an object that says it equals anything. None for other statements."""
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
            and isinstance(node.test.ops[0], ast.Eq):
        message = f", {ast.unparse(node.msg)}" if node.msg is not None else ""
        return f"assert {ast.unparse(node.test.left)} == [{ast.unparse(node.test.comparators[0])}]{message}"
    call = node.value if isinstance(node, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
            and call.func.value.id == "self" and not call.keywords and call.func.attr in _EQUALITIES \
            and len(call.args) in (2, 3):
        args = [ast.unparse(a) for a in call.args]
        return f"self.{call.func.attr}({args[0]}, [{args[1]}]{', ' + args[2] if len(args) == 3 else ''})"
    return None


def _ends(body: list[ast.stmt], lines: list[str], rewrite) -> list[ast.stmt] | None:
    """The statements to rewrite so that running `body` through reaches one of them last among them: the last
    statement `rewrite` can rewrite (alone on its lines), or, for an `if` with an `else`, such statements at the end
    of every branch; None when there is none."""
    for node in reversed(body):
        if rewrite(node) is not None and _whole_lines(node, lines):
            return [node]
        if isinstance(node, ast.If) and node.orelse:
            taken, other = _ends(node.body, lines, rewrite), _ends(node.orelse, lines, rewrite)
            if taken and other:
                return taken + other
    return None


def _returns_early(function) -> bool:
    """Whether `function` has a `return` of its own (then a statement after it may never run)."""
    todo = list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _vocabulary(tree: ast.Module) -> list[str]:
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            words.update(w for w in node.name.split("_")[1:] if w.isidentifier() and not w[0].isdigit())
    return sorted(words) or ["case", "value", "result", "input"]


def _new_name(prefix: str, words: list[str], taken: set[str], rng: random.Random) -> str:
    while True:
        name = "_".join([prefix, *rng.sample(words, min(len(words), rng.choice((1, 2, 2, 3))))])
        if name not in taken:
            taken.add(name)
            return name
        words = [*words, rng.choice(("again", "more", "other", "extra", "second", "also"))]


def _copy(lines: list[str], start: int, end: int, name: str, new_name: str, def_line: int,
          replace: list[tuple[int, int, str]] = ()) -> list[str]:
    """Lines start..end (0-based, end exclusive) of the function named `name`, renamed; `replace`: lines (first,
    last, both 0-based inclusive) of statements, each with the text to put there at its indentation."""
    block = list(lines[start:end])
    at = def_line - start
    block[at] = re.sub(rf"\bdef\s+{re.escape(name)}\b", f"def {new_name}", block[at], count=1)
    for first, last, text in sorted(replace, reverse=True):
        indent = re.match(r"\s*", block[first - start]).group(0)
        block[first - start:last - start + 1] = [f"{indent}{text}\n"]
    if block and not block[-1].endswith("\n"):
        block[-1] += "\n"
    return block


def plant(path: str, text: str, targets: list[tuple[tuple[str, ...], str, str]], rng: random.Random,
          known: frozenset[str] = frozenset()) -> tuple[str, list[Canary]]:
    """`text` (the test file at `path`) with canaries planted after each target, and the canaries.

    `targets`: (class names, function name, which): which is "both" (a twin, an inverse and, where its last equality
    allows, a mismatch), "twin", or "inverse" (an inverse and a mismatch).
    A function that is not found, or has no assertion whose negation is exact, gets what it can; a file that does not
    parse gets none. `known`: names no canary may take (the task's test functions, inherited ones included)."""
    try:
        with _PARSE_LOCK:
            tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return text, []
    lines = text.splitlines(keepends=True)
    taken = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    taken |= known
    words = _vocabulary(tree)
    inserts, canaries = [], []
    for classes, name, which in targets:
        function = _find(tree, classes, name)
        if function is None or any(re.search(r"\b(xfail|skip|skipif)\b", ast.unparse(d)) for d in
                                   function.decorator_list):
            continue  # an expected failure's result does not mean what a test's does
        start = min([function.lineno, *(d.lineno for d in function.decorator_list)]) - 1
        end = function.end_lineno
        prefix = name.split("_", 1)[0] if "_" in name else "test"
        source = "::".join([path, *classes, name])
        blocks = []
        if which in ("both", "twin"):
            twin = _new_name(prefix, words, taken, rng)
            blocks.append(_copy(lines, start, end, name, twin, function.lineno - 1))
            canaries.append(Canary("twin", source, "::".join([path, *classes, twin])))
        for kind, rewrite in (("inverse", negated), ("mismatch", mismatched)):
            ends = _ends(function.body, lines, rewrite) if which in ("both", "inverse") and not _returns_early(
                function) else None
            if ends:
                copy = _new_name(prefix, words, taken, rng)
                blocks.append(_copy(lines, start, end, name, copy, function.lineno - 1,
                                    [(n.lineno - 1, n.end_lineno - 1, rewrite(n)) for n in ends]))
                canaries.append(Canary(kind, source, "::".join([path, *classes, copy])))
        rng.shuffle(blocks)
        inserts.append((end, [line for block in blocks for line in ["\n", *block]]))
    for at, block in sorted(inserts, key=lambda pair: pair[0], reverse=True):
        if at > 0 and not lines[at - 1].endswith("\n"):
            lines[at - 1] += "\n"
        lines[at:at] = block
    return "".join(lines), canaries
