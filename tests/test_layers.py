"""patchgym's imports follow the stage order: a module imports only from its own layer or an earlier one, and no
modules import each other in a circle.

LAYERS is that order, listed once. A module belongs to the longest entry that names it or a package above it, so
`patchgym.tasks.factory` is a layer of its own after `patchgym.env` while the rest of `patchgym.tasks` comes before.

Every `import` and `from ... import` statement counts, wherever it is written. A lazy import inside a function is
still a dependency (it only changes when the import is paid for), and so is one under `if TYPE_CHECKING:` (the
module's types come from there). `from a.b import c` is an edge to a.b.c when that is a module, else to a.b; the
package __init__ files that an import runs on the way are not edges of their own (each __init__ is checked as a
module). Module names handed to importlib as strings (the sandbox backends) are not read.

A cycle that spans two layers always has a back edge, so cycles are looked for between modules, where they can hide
inside one layer.
"""

import ast
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (
    # leaves any stage may use
    "patchgym.errors",
    "patchgym.registry",
    "patchgym.paths",
    "patchgym.files",
    "patchgym.termination",
    # the pipeline, upstream first
    "patchgym.sandbox",
    "patchgym.tasks.task",  # the record every stage shares
    # How each row is graded (the grading families, their harnesses and parsers) comes before the rest of tasks: the
    # loaders derive a row's spec with the harnesses' own code, and the factory makes tasks by grading them.
    "patchgym.env.workspace",
    "patchgym.env.grading",
    "patchgym.tasks",
    "patchgym.env",
    "patchgym.tasks.factory",  # it makes tasks by grading them, so it comes after env
    "patchgym.tasks.harbor",  # its export writes the grader's pytest report into the folders it makes
    "patchgym.inference",
    "patchgym.rl",  # the math, on tensors and records of its own: train/selection.py turns trajectories into them
    "patchgym.agent",
    "patchgym.rollout",
    "patchgym.cluster",
    "patchgym.pivot",  # RL on decision points of expert trajectories: the states, their local reward, their selection
    # The whole run's config gathers every stage's section, and train is the first stage that reads all of it, so
    # the sections of train and verify sit before it and the rest of those two stages after it.
    "patchgym.train.config",
    "patchgym.verify.config",
    "patchgym.config",
    "patchgym.train",
    # The pivot stage's training step samples through the engines and updates through train's policy and metrics.
    "patchgym.pivot.sampling",
    "patchgym.pivot.train",
    "patchgym.eval",
    "patchgym.verify",
    "patchgym.report",
    "patchgym.viewer",
    # the command
    "patchgym.doctor",
    "patchgym.cli",
    "patchgym.__main__",
)


def layer_problems(root: Path, package: str, layers: Sequence[str]) -> list[str]:
    """Every back edge, import cycle and unplaced module of `package` (a directory under `root`), one line each."""
    paths = {_module_name(path.relative_to(root)): path for path in sorted((root / package).rglob("*.py"))}
    edges = {name: _imports(name, path, set(paths)) for name, path in paths.items()}
    order = (package, *layers)  # the package's own __init__ comes first; it is no prefix of the layers below it

    def layer(name: str) -> int | None:
        owners = [i for i, unit in enumerate(order) if name == unit or (i and name.startswith(unit + "."))]
        return max(owners, key=lambda i: len(order[i])) if owners else None

    problems = [f"LAYERS entry {unit} names no module" for unit in layers
                if not any(name == unit or name.startswith(unit + ".") for name in paths)]
    for name, path in paths.items():
        here = path.relative_to(root)
        rank = layer(name)
        if rank is None:
            problems.append(f"{here}: {name} is in no layer; add it to LAYERS where it belongs")
            continue
        for target, line in edges[name]:
            target_rank = layer(target)
            if target_rank is None:
                problems.append(f"{here}:{line}: {name} imports {target}, which is in no layer")
            elif target_rank > rank:
                problems.append(f"{here}:{line}: {name} imports {target}: back edge, layer {order[target_rank]} "
                                f"comes after {order[rank]}")
    graph = {name: [target for target, _ in targets if target in paths] for name, targets in edges.items()}
    for cycle in _cycles(graph):
        hops = [f"{paths[a].relative_to(root)}:{min(ln for t, ln in edges[a] if t == b)}"
                for a, b in zip(cycle, cycle[1:])]
        problems.append(f"import cycle: {' -> '.join(cycle)} ({', '.join(hops)})")
    return problems


def _module_name(relative: Path) -> str:
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement of the module, at any depth of the file."""
    found = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: each dot past the first climbs one package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in modules else base, node.lineno))
    top = name.split(".")[0]
    return sorted({(target, line) for target, line in found if target.split(".")[0] == top and target != name})


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One cycle (first module repeated last) per group of modules that import each other, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(group[0], set(group), graph) for group in sorted(groups)]


def _cycle_through(start: str, group: set[str], graph: dict[str, list[str]]) -> list[str]:
    """The shortest path from `start` back to itself inside `group` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(set(graph[node]) & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_imports_follow_the_stage_order() -> None:
    problems = layer_problems(ROOT, "patchgym", LAYERS)
    assert not problems, "imports against the stage order (tests/test_layers.py):\n" + "\n".join(problems)


def test_the_check_reports_back_edges_cycles_and_unplaced_modules(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "def load():\n    from pkg.high import a  # lazy, and still a dependency\n    return a\n",
        "pkg/high/__init__.py": "",
        "pkg/high/a.py": "from . import b\n",
        "pkg/high/b.py": "from typing import TYPE_CHECKING\n\nfrom .. import low\n\nif TYPE_CHECKING:\n"
                         "    from .a import A\n",
        "pkg/stray.py": "import pkg.low\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    problems = layer_problems(tmp_path, "pkg", ("pkg.low", "pkg.high", "pkg.gone"))

    assert problems == [
        "LAYERS entry pkg.gone names no module",
        "pkg/low.py:2: pkg.low imports pkg.high.a: back edge, layer pkg.high comes after pkg.low",
        "pkg/stray.py: pkg.stray is in no layer; add it to LAYERS where it belongs",
        "import cycle: pkg.high.a -> pkg.high.b -> pkg.high.a (pkg/high/a.py:1, pkg/high/b.py:6)",
    ]
