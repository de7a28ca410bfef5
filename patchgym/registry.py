"""Named registries: a table of functions (or objects) that configs and tasks refer to by name, each registered by a
decorator beside its definition (advantage estimators, loss aggregations, test-log parsers). A name registered twice
is refused; a name that is missing is an error that lists the known ones."""

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F")


class UnknownName(KeyError, ValueError):
    """A name no entry of a registry has; the message lists the ones it has."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(dict[str, F]):
    """A table of named entries: `@table.register("name")` adds one, `table["name"]` finds it."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def register(self, name: str) -> Callable[[F], F]:
        """The decorator that adds its function (or object) under `name`, unchanged; a name taken already is a
        ValueError naming both entries."""

        def add(entry: F) -> F:
            if name in self:
                raise ValueError(f"{self.what} {name!r} is registered twice: {self[name]!r} and {entry!r}")
            self[name] = entry
            return entry

        return add

    def __missing__(self, name: str) -> F:
        raise UnknownName(f"unknown {self.what} {name!r}; known: {', '.join(sorted(self)) or 'none'}")
