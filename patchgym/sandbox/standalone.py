"""The source of a script that runs inside sandboxes on its own (the runner, the agent's tools): one file, with the
source of the patchgym modules it imports in place of their import statements.

A sandbox has no patchgym installed, so such a script can import only the standard library and the modules named in
SHARED, whose source travels with it. Those modules are stdlib-only too and must not import each other.
"""

import ast
from pathlib import Path

# The modules a standalone script may import from patchgym, by import name: each is inlined where it is imported.
SHARED = {"patchgym.sandbox.process_tree": Path(__file__).parent / "process_tree.py",
          "patchgym.env.tools.text_edits": Path(__file__).parents[1] / "env" / "tools" / "text_edits.py"}


def standalone_source(path: Path) -> str:
    """`path`'s source with each top-level `from <shared module> import ...` replaced by that module's source."""
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    for node in reversed(ast.parse(source).body):  # from the end, so earlier line numbers stay right
        if isinstance(node, ast.ImportFrom) and node.module in SHARED:
            shared = SHARED[node.module].read_text()
            lines[node.lineno - 1: node.end_lineno] = [f"# --- {node.module}, inlined ---\n", shared,
                                                       f"# --- end of {node.module} ---\n"]
    inlined = "".join(lines)
    imported = [name for n in ast.walk(ast.parse(inlined)) for name in (
        [n.module or ""] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names] if isinstance(n, ast.Import)
        else [])]
    leftover = [name for name in imported if name == "patchgym" or name.startswith("patchgym.")]
    if leftover:
        raise ImportError(f"{path} imports {', '.join(leftover)}, which a sandbox does not have: import it at the "
                          "top level, and only from patchgym.sandbox.standalone.SHARED")
    return inlined
