"""Procedural bugs in JavaScript: every site where one small mutation applies, found with tree-sitter's JavaScript
parser (never regular expressions), as a text edit of that node's span only; a mutant that no longer parses is
dropped before anything runs."""

from collections.abc import Iterator

import tree_sitter
import tree_sitter_javascript

from patchgym.tasks.factory.mutate import Mutation, site_choice

STRATEGIES = ("flip_compare", "flip_bool", "off_by_one", "swap_logic", "invert_if", "drop_not", "change_return")
_FLIPS = {"===": ("!==",), "!==": ("===",), "==": ("!=",), "!=": ("==",), "<": ("<=", ">="), "<=": ("<", ">"),
          ">": (">=", "<="), ">=": (">", "<")}
_LOGIC = {"&&": "||", "||": "&&"}
_PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_javascript.language()))


def parses(text: str, path: str = "") -> bool:
    """Whether `text` is JavaScript tree-sitter reads without an error node."""
    return not _PARSER.parse(text.encode()).root_node.has_error


def find_mutations(path: str, text: str) -> list[Mutation]:
    """Every mutation site of one source file; none when it does not parse."""
    raw = text.encode()
    tree = _PARSER.parse(raw)
    if tree.root_node.has_error:
        return []

    def at(byte: int) -> int:  # tree-sitter counts bytes; edits are string offsets
        return len(raw[:byte].decode(errors="replace"))

    def edit(strategy: str, node, new: str) -> Mutation:
        return Mutation(path, strategy, at(node.start_byte), at(node.end_byte), new, node.start_point[0] + 1)

    found = []
    for node in _walk(tree.root_node):
        found += list(_sites(node, edit, path))
    return found


def _walk(node) -> Iterator:
    yield node
    for child in node.children:
        yield from _walk(child)


def _inside_function(node) -> bool:
    while node.parent is not None:
        node = node.parent
        if node.type in ("function_declaration", "function_expression", "arrow_function", "method_definition",
                         "generator_function_declaration"):
            return True
    return False


def _sites(node, edit, path: str) -> Iterator[Mutation]:
    if not _inside_function(node):
        return  # module-level code runs at import: a bug there breaks every test at once
    kind = node.type
    if kind == "binary_expression":
        operator = node.child_by_field_name("operator")
        op = operator.type if operator is not None else ""
        if op in _FLIPS:
            yield edit("flip_compare", operator, site_choice(f"{path}:{operator.start_byte}", _FLIPS[op]))
        elif op in _LOGIC:
            yield edit("swap_logic", operator, _LOGIC[op])
    elif kind in ("true", "false"):
        yield edit("flip_bool", node, "false" if kind == "true" else "true")
    elif kind == "number":
        text = node.text.decode()
        if text.isdigit() and int(text) < 1000:
            yield edit("off_by_one", node, str(int(text) + site_choice(f"{path}:{node.start_byte}", (1, -1)))
                       if text != "0" else "1")
    elif kind == "if_statement":
        condition = node.child_by_field_name("condition")
        if condition is not None and condition.type == "parenthesized_expression":
            inner = condition.text.decode()[1:-1]
            yield edit("invert_if", condition, f"(!({inner}))")
    elif kind == "unary_expression":
        operator = node.child_by_field_name("operator")
        argument = node.child_by_field_name("argument")
        if (operator is not None and operator.type == "!" and argument is not None
                and argument.type != "unary_expression"):
            yield edit("drop_not", node, argument.text.decode())
    elif kind == "return_statement":
        value = next((c for c in node.named_children if c.type != "comment"), None)
        if value is not None and value.type in ("identifier", "member_expression", "call_expression"):
            yield edit("change_return", node, "return undefined;")
