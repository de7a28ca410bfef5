"""The task factory's method for Python: PyPI sdists that ship their pytest suite (recipes in recipes.yaml), mutated
through Python's AST, validated and graded from patchgym's pytest report plugin (never printed output)."""

from patchgym.tasks.factory.pypi.ecosystem import PypiEcosystem

__all__ = ["PypiEcosystem"]
