"""The policy being trained as a Ray actor on a node of its own (a GPU node, typically): it owns the model, the
optimizer and the schedule, takes batches of training sequences, and pushes its weights straight into the engine
actor, so the driver never holds a copy of the model.

Not wired into `patchgym train` yet: the Trainer still trains in its own process (see patchgym.train.loop).
"""

import ray
import torch

from patchgym.cluster.ray_engine import ACTOR_ENV, RemoteEngine, on_node
from patchgym.config import Config
from patchgym.inference.models import load_model
from patchgym.rl.config import AlgorithmConfig
from patchgym.train.batch import TrainSequence
from patchgym.train.prepare import (enable_gradient_checkpointing, full_state_dict, make_optimizer, make_scheduler,
                                    maybe_lora)
from patchgym.train.update import policy_update


class TrainerWorker:
    """One trainer process: the policy from `config.inference.model`, the optimizer and LR schedule of
    `config.train`, and the reference model when the algorithm's KL needs one."""

    def __init__(self, config: Config):
        train, spec, device = config.train, config.inference.model, config.inference.device
        torch.manual_seed(config.seed)
        model, _ = load_model(spec, device)
        if train.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.model = maybe_lora(model, train.lora)
        self.train = train
        self.optimizer = make_optimizer(self.model, train.lr, train.weight_decay, train.betas)
        self.scheduler = make_scheduler(self.optimizer, train.warmup_steps, train.iterations * train.mini_batches,
                                        train.lr_schedule)
        kl = config.algorithm.kl_coef > 0
        self.ref_model = load_model(spec, device)[0].requires_grad_(False) if kl else None

    def update(self, sequences: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        """K = train.mini_batches optimizer steps on `sequences` (policy_update); its metrics."""
        return policy_update(self.model, self.optimizer, sequences, algo,
                             micro_token_budget=self.train.micro_token_budget, mini_batches=self.train.mini_batches,
                             max_grad_norm=self.train.max_grad_norm, scheduler=self.scheduler,
                             ref_model=self.ref_model)

    def push_weights(self, engine: RemoteEngine) -> None:
        """Load this policy's weights into the engine actor (from this node to the engine's, not via the driver)."""
        engine.load_weights(full_state_dict(self.model))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in full_state_dict(self.model).items()}


def start_trainer_worker(config: Config, node_id: str):
    """A TrainerWorker actor on node `node_id` (with a GPU reserved when inference.device is CUDA)."""
    gpus = 1 if str(config.inference.device).startswith("cuda") else 0
    return ray.remote(TrainerWorker).options(num_cpus=0, num_gpus=gpus, runtime_env=ACTOR_ENV,
                                             scheduling_strategy=on_node(node_id)).remote(config)
