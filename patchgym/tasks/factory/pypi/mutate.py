"""Procedural bugs in Python: every site in a source file where one small AST mutation applies, as a text edit of
that node's span only (the rest of the file keeps its formatting)."""

import ast
import re
from collections.abc import Iterator

from patchgym.tasks.factory.mutate import Mutation, site_choice

STRATEGIES = ("flip_compare", "flip_bool", "off_by_one", "remove_cond", "remove_stmt", "invert_if",
              "swap_args", "change_return")
# Compare operators: source text, and what each one becomes (ordering ops get a boundary or a negation).
_OP_TEXT = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
            ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_OP_FLIPS = {"==": ("!=",), "!=": ("==",), "<": ("<=", ">="), "<=": ("<", ">"), ">": (">=", "<="),
             ">=": (">", "<"), "is": ("is not",), "is not": ("is",), "in": ("not in",), "not in": ("in",)}
_OP_RE = {op: re.compile(r"\b" + r"\s+".join(op.split()) + r"\b" if op[0].isalpha() else
                       r"(?<![=!<>])" + re.escape(op) + r"(?![=<>])") for op in _OP_FLIPS}
# Swapping these arguments gives a TypeError on the first call: a bug nobody would need to debug.
_NO_SWAP = {"isinstance", "issubclass", "getattr", "setattr", "hasattr", "print", "super"}
_BIG_LITERAL = 8  # ints inside bigger literal containers are data tables, not logic


class _Source:
    """A file's text with ast positions (1-based lines, UTF-8 byte columns) turned into string offsets."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def seg(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def line_span(self, first: int, last: int) -> tuple[int, int]:
        """Whole lines `first..last`, newline of the last included."""
        return self.starts[first - 1], self.starts[last]

    def owns_lines(self, node: ast.AST) -> bool:
        """Whether `node` alone fills its lines (no other statement before or after it on them)."""
        before = self.lines[node.lineno - 1].encode()[: node.col_offset].decode(errors="replace")
        after = self.lines[node.end_lineno - 1].encode()[node.end_col_offset:].decode(errors="replace")
        return not before.strip() and (not after.strip() or after.strip().startswith("#"))

    def indent(self, lineno: int) -> str:
        line = self.lines[lineno - 1]
        return line[: len(line) - len(line.lstrip())]


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _skipped_nodes(tree: ast.AST, src: _Source) -> set[ast.AST]:
    """Code tests cannot reach or only typing tools read: `if TYPE_CHECKING`, `if __name__`, `# pragma: no cover`."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        roots = []
        if isinstance(node, ast.If) and re.search(r"TYPE_CHECKING|__name__", ast.unparse(node.test)):
            roots = [node]
        elif hasattr(node, "lineno") and "no cover" in src.lines[node.lineno - 1]:
            roots = [node]
        for root in roots:
            skipped.update(ast.walk(root))
    return skipped


def _in_function(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
    return False


def _is_elif(parent: ast.AST, node: ast.AST, src: _Source) -> bool:
    """Whether `node` is written as an `elif` of the `if` statement `parent`."""
    return (isinstance(parent, ast.If) and parent.orelse == [node]
            and src.lines[node.lineno - 1].lstrip().startswith("elif"))


def _delete_stmt(src: _Source, node: ast.stmt, parent: ast.AST) -> tuple[int, int, str]:
    """An edit removing a statement's lines, leaving `pass` where it was the only one in its block."""
    start, end = src.line_span(node.lineno, node.end_lineno)
    alone = any(getattr(parent, field, None) == [node] for field in ("body", "orelse", "finalbody"))
    return start, end, f"{src.indent(node.lineno)}pass\n" if alone else ""


# Each finder takes (node, its parent, the source, the file's parent map) and yields
# (strategy, start, end, replacement) for the mutations that apply at that node.

def _flip_compare(node: ast.Compare, parent, src: _Source, parents) -> Iterator[tuple]:
    for i, op in enumerate(node.ops):
        left = node.left if i == 0 else node.comparators[i - 1]
        gap_start, gap_end = src.span(left)[1], src.span(node.comparators[i])[0]
        gap, text = src.text[gap_start:gap_end], _OP_TEXT[type(op)]
        matches = list(_OP_RE[text].finditer(gap))
        if len(matches) == 1 and "#" not in gap:
            new_op = site_choice(f"{node.lineno}:{node.col_offset}:{i}", _OP_FLIPS[text])
            yield "flip_compare", gap_start + matches[0].start(), gap_start + matches[0].end(), new_op


def _flip_bool(node: ast.BoolOp, parent, src: _Source, parents) -> Iterator[tuple]:
    for left, right in zip(node.values, node.values[1:]):
        gap_start, gap_end = src.span(left)[1], src.span(right)[0]
        gap = src.text[gap_start:gap_end]
        m = re.search(r"\b(and|or)\b", gap)
        if m and "#" not in gap:
            yield "flip_bool", gap_start + m.start(), gap_start + m.end(), "or" if m.group() == "and" else "and"


def _off_by_one_constant(node: ast.Constant, parent, src: _Source, parents) -> Iterator[tuple]:
    if type(node.value) is not int:
        return
    if len(getattr(parent, "elts", None) or getattr(parent, "keys", None) or ()) > _BIG_LITERAL:
        return
    negated = isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)
    site = f"{node.lineno}:{node.col_offset}"
    step = 1 if node.value == 0 or (negated and node.value == 1) else site_choice(site, (1, -1))
    literal = src.seg(node).lower()
    yield "off_by_one", *src.span(node), {"0x": hex, "0o": oct, "0b": bin}.get(literal[:2], str)(node.value + step)


def _off_by_one_slice(node: ast.Slice, parent, src: _Source, parents) -> Iterator[tuple]:
    for bound in (node.lower, node.upper):
        if bound is None or isinstance(bound, (ast.Constant, ast.UnaryOp)):
            continue  # constant bounds are the int-constant case
        text = src.seg(bound)
        simple = isinstance(bound, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        sign = site_choice(f"{node.lineno}:{node.col_offset}:{bound.col_offset}", ("+", "-"))
        yield "off_by_one", *src.span(bound), f"{text if simple else f'({text})'} {sign} 1"


def _if_statement(node: ast.If, parent, src: _Source, parents) -> Iterator[tuple]:
    """remove_cond (a guard `if` without else, or one `elif` branch) and invert_if (swap if/else bodies)."""
    elif_ = _is_elif(parent, node, src)
    if not node.orelse and not elif_ and src.owns_lines(node):
        yield "remove_cond", *_delete_stmt(src, node, parent)
    if elif_:
        last = _else_line(node, src) - 1 if node.orelse else node.end_lineno
        yield "remove_cond", *src.line_span(node.lineno, last), ""
    if not node.orelse or _is_elif(node, node.orelse[0], src):
        return
    body, orelse = node.body, node.orelse
    if body[0].lineno == node.lineno or not all(src.owns_lines(s) for s in (body[0], orelse[0])):
        return
    if src.indent(body[0].lineno) != src.indent(orelse[0].lineno):
        return
    body_start, body_end = src.line_span(body[0].lineno, body[-1].end_lineno)
    else_start, else_end = src.line_span(orelse[0].lineno, orelse[-1].end_lineno)
    if src.text[body_start:body_end] != src.text[else_start:else_end]:
        new = src.text[else_start:else_end] + src.text[body_end:else_start] + src.text[body_start:body_end]
        yield "invert_if", body_start, else_end, new


def _else_line(node: ast.If, src: _Source) -> int:
    """The line of the `elif` or `else` keyword that starts `node`'s orelse."""
    line = node.orelse[0].lineno
    if _is_elif(node, node.orelse[0], src):
        return line
    while not src.lines[line - 1].lstrip().startswith("else"):
        line -= 1
    return line


def _invert_ternary(node: ast.IfExp, parent, src: _Source, parents) -> Iterator[tuple]:
    body, orelse = src.seg(node.body), src.seg(node.orelse)
    if body != orelse:
        middle = src.text[src.span(node.body)[1]: src.span(node.orelse)[0]]
        yield "invert_if", src.span(node.body)[0], src.span(node.orelse)[1], orelse + middle + body


def _remove_stmt(node: ast.stmt, parent, src: _Source, parents) -> Iterator[tuple]:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return  # a docstring
    if isinstance(node, ast.AnnAssign) and node.value is None:
        return
    if _in_function(node, parents) and src.owns_lines(node):
        yield "remove_stmt", *_delete_stmt(src, node, parent)


def _swap_args(node: ast.Call, parent, src: _Source, parents) -> Iterator[tuple]:
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    if name in _NO_SWAP or len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args[:2]):
        return
    a, b = node.args[0], node.args[1]
    if src.seg(a) != src.seg(b):
        middle = src.text[src.span(a)[1]: src.span(b)[0]]
        yield "swap_args", src.span(a)[0], src.span(b)[1], src.seg(b) + middle + src.seg(a)


def _change_return(node: ast.Return, parent, src: _Source, parents) -> Iterator[tuple]:
    value = node.value
    if value is None or (isinstance(value, ast.Constant) and not isinstance(value.value, bool)):
        return  # None, and constants other strategies change
    if isinstance(value, ast.Constant):
        new = "False" if value.value else "True"
    elif isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not):
        new = src.seg(value.operand)
    elif isinstance(value, (ast.Compare, ast.BoolOp)):
        new = f"not ({src.seg(value)})"
    else:
        new = "None"
    yield "change_return", *src.span(value), new


_FINDERS = {
    ast.Compare: _flip_compare, ast.BoolOp: _flip_bool, ast.Constant: _off_by_one_constant,
    ast.Slice: _off_by_one_slice, ast.If: _if_statement, ast.IfExp: _invert_ternary, ast.Call: _swap_args,
    ast.Return: _change_return, **dict.fromkeys((ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise),
                                                _remove_stmt),
}


def find_mutations(path: str, text: str) -> list[Mutation]:
    """Every site of the file at `path` where a strategy applies; whether the result compiles is checked later,
    for the few that are tried (re-parsing a big file per site costs minutes)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    src = _Source(text)
    parents, skipped = _parents(tree), _skipped_nodes(tree, src)
    found, seen = [], set()
    for node in ast.walk(tree):
        finder = _FINDERS.get(type(node))
        if finder is None or node in skipped:
            continue
        for strategy, start, end, new in finder(node, parents.get(node), src, parents):
            if (start, end, new) not in seen:
                seen.add((start, end, new))
                found.append(Mutation(path, strategy, start, end, new, node.lineno))
    return found


def compiles(text: str, path: str) -> bool:
    """Whether a mutant is still Python that compiles."""
    try:
        compile(text, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True
