"""The `rollout:` section of a patchgym config: how many trajectories run at once, and how failures are retried."""

from pydantic import BaseModel, ConfigDict, Field


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_sandboxes: int = Field(8, ge=1, description="sandboxes in use at once (episodes plus gradings)")
    max_generations: int = Field(8, ge=1, description="generation requests in flight at once (match the engine's "
                                                       "batch size)")
    retries: int = Field(2, ge=0, description="reruns of a trajectory after an infrastructure error (dead sandbox, "
                                              "engine crash); then it is recorded as infra_error")
    grade_timeout_s: float = Field(1800.0, gt=0, description="time limit of the hidden tests when grading")
    resolved_reward: float = Field(1.0, description="Harbor tasks: a verifier's reward at least this is resolved "
                                                     "(the reward itself is the score training sees)")
    harbor_score: str = Field("auto", min_length=1, description="Harbor tasks whose verifier writes several named "
                              "rewards (reward.json): which is the score training sees. auto: its \"reward\", else "
                              "its only one, else their mean; mean, min, max or sum of them; or one reward's name")
    grade_empty_patches: bool = Field(False, description="grade a trajectory that changed nothing (otherwise it is "
                                                         "unresolved without a test run)")
    max_staleness: int = Field(0, ge=0, description="train: S, how many policy updates a trajectory may lag behind "
                                                     "(rollouts of the next S iterations run while one trains); "
                                                     "0 = synchronous")
