"""State selection: mixed groups are kept, the fraction is reported, the set is rebuilt on refresh iterations and
shrinks between them, and draws are seeded."""

import pytest

from patchgym.pivot.selection import Selection, draw, mixed, refresh, select

POOL = {"a@0": [1.0, 0.0, 1.0], "a@1": [1.0, 1.0, 1.0], "b@0": [0.25, 0.25, 0.0], "b@1": [0.0, 0.0, 0.0]}


def test_states_whose_samples_differ_are_kept_and_counted():
    assert mixed([0.0, 0.25]) and not mixed([0.5, 0.5]) and not mixed([])
    chosen = select(POOL)
    assert chosen == Selection(("a@0", "b@0"), 4) and chosen.fraction_kept == 0.5
    assert select({}).fraction_kept == 0.0
    with pytest.raises(ValueError, match="state a@0: 1 reward"):
        select({"a@0": [1.0]})
    with pytest.raises(ValueError, match="state a@0: a reward that is not a finite number"):
        select({"a@0": [1.0, float("nan")]})


def test_refresh_rebuilds_on_its_iterations_and_only_drops_between_them():
    first = refresh(None, POOL, iteration=3, every=2)  # no set yet: built whatever the iteration
    assert first.kept == ("a@0", "b@0")
    learned = refresh(first, {"a@0": [1.0, 1.0, 1.0], "b@0": [0.0, 0.25, 0.0]}, iteration=5, every=2)
    assert learned == Selection(("b@0",), 4)  # a@0 is solved now; b@1 is not measured between refreshes
    again = refresh(learned, {**POOL, "b@1": [0.0, 1.0, 0.0]}, iteration=6, every=2)
    assert again.kept == ("a@0", "b@0", "b@1")
    with pytest.raises(ValueError, match="iteration 7: states a@1 were sampled but are not kept"):
        refresh(again, {"a@1": [0.0, 1.0]}, iteration=7, every=2)
    with pytest.raises(ValueError, match="refresh interval 0"):
        refresh(again, POOL, iteration=1, every=0)


def test_draws_are_seeded_without_repeats():
    chosen = Selection(tuple(f"s@{i}" for i in range(10)), 20)
    batch = draw(chosen, 4, iteration=1, seed=7)
    assert len(set(batch)) == 4 and set(batch) <= set(chosen.kept)
    assert batch == draw(chosen, 4, iteration=1, seed=7) != draw(chosen, 4, iteration=2, seed=7)
    assert sorted(draw(chosen, 50, iteration=0)) == sorted(chosen.kept)
