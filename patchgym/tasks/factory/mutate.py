"""Procedural bugs, whatever the language: a mutation is a text edit of one node's span (the rest of the file keeps
its formatting); each ecosystem finds its own sites, and a seed orders them."""

import hashlib
import itertools
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    """Replace `text[start:end]` of the file at `path` with `new`."""

    path: str
    strategy: str
    start: int
    end: int
    new: str
    line: int  # where the edit starts, for logs only: tasks must never reveal it

    def apply(self, text: str) -> str:
        return text[: self.start] + self.new + text[self.end:]


def site_choice(key: str, options):
    """A choice fixed by the site (`key` names it; not the seed), so a site always gives the same bug."""
    return options[int(hashlib.sha1(key.encode()).hexdigest(), 16) % len(options)]


def order_mutations(mutations: list[Mutation], seed: int, strategies: tuple[str, ...]) -> list[Mutation]:
    """Shuffle each strategy's mutations by `seed`, then interleave `strategies` so every kind gets tried early."""
    rng = random.Random(seed)
    groups = {s: [m for m in mutations if m.strategy == s] for s in strategies}
    for group in groups.values():
        rng.shuffle(group)
    order = [s for s in strategies if groups[s]]
    rng.shuffle(order)
    rounds = itertools.zip_longest(*(groups[s] for s in order))
    return [m for round_ in rounds for m in round_ if m is not None]
