"""The offline task factory: PyPI sdists that ship their tests, procedural bugs, validation in sandboxes.

    build_tasks(["toolz", "boltons"], per_package=20, seed=0, out_dir=Path("runs/factory"))
"""

from patchgym.tasks.factory.build import build_tasks
from patchgym.tasks.factory.sources import Recipe, load_recipes

__all__ = ["Recipe", "build_tasks", "load_recipes"]
