"""The `cluster:` section of a patchgym config: where rollouts, engines and trainer workers run.

`backend: local` keeps everything in this process (one machine); `backend: ray` spreads the same work over a Ray
cluster. The rest of the config reads the same either way.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "ray"] = Field("local", description="local (this process) or ray (actors on a Ray "
                                                                  "cluster)")
    address: str | None = Field(None, description="ray: cluster address (e.g. 10.0.0.1:6379, 'auto'); null = "
                                                  "start a private single-node Ray")
    rollout_resource: str | None = Field(None, description="ray: only nodes that advertise this custom resource "
                                                           "get a rollout worker; null = every alive node")
    trainer_resource: str | None = Field(None, description="ray: the trainer worker (the policy, its optimizer) goes "
                                                           "on a node with this custom resource, with a GPU of its "
                                                           "own; null = the driver's node, beside the engine actor")
