"""The pivot stage's settings: group size, states per iteration, how often the set of states is measured again, the
partial credits of the local reward, and the limits of its bash check. Not part of the run's config yet."""

from pydantic import BaseModel, ConfigDict, Field


class CreditConfig(BaseModel):
    """Partial credits of the local reward (patchgym.pivot.reward), each below the full credit of 1 so that a group
    holding both a partial and a full action has an advantage to learn from."""

    model_config = ConfigDict(extra="forbid")

    edit_valid: float = Field(0.25, ge=0, lt=1, description=(
        "a file_editor edit of the expert's file that applies (str_replace: old_str found exactly once; insert: a "
        "line in range; create: a new file) but leaves another text than the expert's edit"))
    search_finds_file: float = Field(0.25, ge=0, lt=1, description=(
        "a search that would list the file the expert edits next, for another term than the expert's"))
    bash_runs: float = Field(0.5, ge=0, lt=1, description=(
        "a command that runs at the state (exit status 0, or the expert's own) with another program than the "
        "expert's"))


class PivotConfig(BaseModel):
    """RL on decision points: G samples per state, GRPO-family advantages over them, states kept while mixed."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(8, ge=2, description="G: actions sampled per state; the group its advantages compare")
    states_per_iteration: int = Field(16, ge=1, description="states drawn from the kept set per iteration")
    refresh_every: int = Field(1, ge=1, description=(
        "iterations between measurements of the whole pool under the current policy; the kept set is rebuilt "
        "from them (between them, states whose G samples came out all equal are dropped)"))
    credit: CreditConfig = Field(default_factory=CreditConfig)
    bash_timeout_s: float = Field(30.0, gt=0, description="how long a sampled command may run in the bash check")
    bash_sandboxes: int = Field(4, ge=1, description="sandboxes the bash check keeps open, one per state")
