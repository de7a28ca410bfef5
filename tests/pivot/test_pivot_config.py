"""The pivot stage's config: defaults, unknown keys refused, partial credits kept below full credit."""

import pytest
from pydantic import ValidationError

from patchgym.pivot.config import PivotConfig


def test_defaults_and_refusals():
    config = PivotConfig()
    assert (config.group_size, config.credit.edit_valid, config.credit.bash_runs) == (8, 0.25, 0.5)
    loaded = PivotConfig.model_validate({"group_size": 4, "credit": {"search_finds_file": 0}})
    assert (loaded.group_size, loaded.credit.search_finds_file) == (4, 0)
    for bad in ({"group": 4}, {"credit": {"edit": 0.5}}, {"group_size": 1}, {"credit": {"bash_runs": 1.0}},
                {"refresh_every": 0}):
        with pytest.raises(ValidationError):
            PivotConfig.model_validate(bad)
