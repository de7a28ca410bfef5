"""The task factory's method for JavaScript: npm packages whose published tarball ships its tape tests, mutated with
tree-sitter's JavaScript parser, validated and graded from patchgym's own tape reporter (never printed output)."""

from patchgym.tasks.factory.npm.ecosystem import NpmEcosystem

__all__ = ["NpmEcosystem"]
