"""Which states train, as PivotRL picks them: those whose G sampled actions, under the current policy, are neither all
right nor all wrong (their rewards are not all equal), so that the group's advantages are not all zero.

Pure functions on {state key: the rewards of its G samples}. `select` keeps the mixed states of one measurement and
says what fraction that is; `refresh` gives the kept set for an iteration: rebuilt from a measurement of the whole
pool every `every` iterations, and between those the previous set less the states the iteration's own samples found
uniform; `draw` picks an iteration's states from the kept set, seeded.
"""

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Selection:
    """The kept states (in the order measured) out of `measured` states."""

    kept: tuple[str, ...]
    measured: int

    @property
    def fraction_kept(self) -> float:
        return len(self.kept) / self.measured if self.measured else 0.0


def mixed(rewards: Sequence[float]) -> bool:
    """True when the rewards are not all equal (within float noise)."""
    return bool(rewards) and max(rewards) - min(rewards) > 1e-9


def _check(rewards: Mapping[str, Sequence[float]]) -> None:
    for key, group in rewards.items():
        if len(group) < 2:
            raise ValueError(f"state {key}: {len(group)} reward(s); a group needs at least 2 samples to compare")
        if any(not math.isfinite(r) for r in group):
            raise ValueError(f"state {key}: a reward that is not a finite number: {list(group)}")


def select(rewards: Mapping[str, Sequence[float]]) -> Selection:
    """The mixed states among those measured."""
    _check(rewards)
    return Selection(tuple(key for key, group in rewards.items() if mixed(group)), len(rewards))


def refresh(previous: Selection | None, rewards: Mapping[str, Sequence[float]], iteration: int,
            every: int) -> Selection:
    """The kept set for `iteration` (from 0). On a refresh iteration (a multiple of `every`, or with no previous
    set) `rewards` must be the whole pool's, measured under the current policy, and the set is rebuilt from them.
    Between refreshes `rewards` are the iteration's own samples, of kept states; those found uniform are dropped."""
    if every < 1:
        raise ValueError(f"refresh interval {every}: it must be at least 1")
    if previous is None or iteration % every == 0:
        return select(rewards)
    _check(rewards)
    strangers = [key for key in rewards if key not in previous.kept]
    if strangers:
        raise ValueError(f"iteration {iteration}: states {', '.join(strangers[:5])} were sampled but are not kept; "
                         "between refreshes only kept states are sampled")
    uniform = {key for key, group in rewards.items() if not mixed(group)}
    return Selection(tuple(key for key in previous.kept if key not in uniform), previous.measured)


def draw(selection: Selection, count: int, iteration: int, seed: int = 0) -> list[str]:
    """`count` kept states for `iteration`, without repeats (all of them when fewer are kept), in an order seeded by
    `seed` and the iteration."""
    keys = list(selection.kept)
    random.Random(f"{seed}/{iteration}").shuffle(keys)
    return keys[:count]
