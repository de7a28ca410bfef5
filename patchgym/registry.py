"""Named registries: a table of functions that configs and tasks refer to by name, each function registered by a
decorator beside its definition (advantage estimators, loss aggregations, test-log parsers)."""

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def registrar(table: dict[str, F]) -> Callable[[str], Callable[[F], F]]:
    """The decorator factory of `table`: `@register("name")` adds the function under that name, unchanged."""

    def register(name: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            table[name] = fn
            return fn

        return add

    return register
