"""Named registries refuse a name registered twice and list the known names when one is missing."""

import pytest

from patchgym.registry import Registry, UnknownName


def test_an_entry_is_found_by_its_name_and_a_name_is_taken_once():
    table = Registry("parser")

    @table.register("plain")
    def plain(log):
        return {}

    assert table["plain"] is plain and list(table) == ["plain"]
    with pytest.raises(ValueError, match="parser 'plain' is registered twice"):
        table.register("plain")(lambda log: {})
    assert table["plain"] is plain


def test_a_missing_name_lists_the_known_ones():
    table = Registry("advantage estimator")
    table.register("rloo")(len)
    table.register("grpo")(len)
    with pytest.raises(UnknownName) as err:
        table["dr-grpo"]
    assert str(err.value) == "unknown advantage estimator 'dr-grpo'; known: grpo, rloo"
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert table.get("dr-grpo") is None and "dr-grpo" not in table
