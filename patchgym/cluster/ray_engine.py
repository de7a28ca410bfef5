"""The policy's inference engine as one Ray actor, and `RemoteEngine`, the Engine that rollout workers anywhere in the
cluster call it through: every worker samples from the same weights, and the trainer pushes new ones to one place."""

import asyncio
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from patchgym.cluster.config import ClusterConfig
from patchgym.inference import Generation, SamplingParams
from patchgym.inference.config import InferenceConfig

# Torch in every actor would otherwise start one thread per core and fight the sandboxes for them.
ACTOR_ENV = {"env_vars": {"OMP_NUM_THREADS": "1"}}


def connect(cluster: ClusterConfig) -> None:
    """Join the Ray cluster at `cluster.address` (or start a private one when null), once per process."""
    if ray.is_initialized():
        return
    if cluster.address is None:
        ray.init(runtime_env=ACTOR_ENV, include_dashboard=False)
    else:
        ray.init(address=cluster.address, runtime_env=ACTOR_ENV)


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Pins an actor to one node; it dies with that node rather than move (what it holds lives there)."""
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


@ray.remote(num_cpus=0)
class EngineActor:
    """Holds the engine (make_engine of an `inference:` config); async methods, so requests from every worker are
    in flight together and the engine batches them."""

    def __init__(self, config: InferenceConfig):
        from patchgym.inference.factory import make_engine

        self.engine = make_engine(config)

    def tokenizer(self):
        return self.engine.tokenizer

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await self.engine.agenerate(prompt_ids, params)

    async def load_weights(self, state_dict: dict) -> None:
        await asyncio.to_thread(self.engine.load_weights, state_dict)  # the swap waits for a decode step

    def state_dict(self) -> dict:
        """The engine model's weights, on the CPU (to check what the trainer pushed)."""
        return {k: v.detach().cpu() for k, v in self.engine.model.state_dict().items()}

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.close)


class RemoteEngine:
    """The Engine protocol over an EngineActor. It pickles (a handle and a tokenizer), so a ModelAgent holding it
    can be shipped to rollout workers on other nodes."""

    needs_messages = False

    def __init__(self, actor, tokenizer):
        self.actor, self.tokenizer = actor, tokenizer

    @classmethod
    def start(cls, config: InferenceConfig) -> "RemoteEngine":
        """An engine actor on this process's node (where the trainer's weights are), and its proxy."""
        gpus = 1 if str(config.device).startswith("cuda") else 0
        actor = EngineActor.options(num_gpus=gpus, runtime_env=ACTOR_ENV,
                                    scheduling_strategy=on_node(ray.get_runtime_context().get_node_id())
                                    ).remote(config)
        return cls(actor, ray.get(actor.tokenizer.remote()))

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        return ray.get(self.actor.agenerate.remote(list(prompt_ids), params or SamplingParams()))

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Generation:
        return await self.actor.agenerate.remote(list(prompt_ids), params or SamplingParams())

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        items = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
        ray.get(self.actor.load_weights.remote({name: tensor.detach().cpu() for name, tensor in items}))

    def close(self) -> None:
        try:
            ray.get(self.actor.close.remote())
        except RayActorError:
            pass  # already gone with its node: nothing left to close
        finally:
            ray.kill(self.actor)
