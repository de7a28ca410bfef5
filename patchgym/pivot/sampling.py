"""Actions sampled at decision points: G per state, through the inference engine and the agent loop's own turn
sampler (patchgym.agent.loop.sample_turn) with the agent's sampling settings, so that an action is sampled, split
and recorded exactly as the same turn of an episode would be (its ids, logprobs and action text); and the training
sequence of one sampled action.

All the states' samples are requested at once, so a batching engine (hf, vllm) decodes them together. With
agent.sampling.seed set, every sample has a seed of its own, drawn from it, the state and a salt (the iteration):
the G samples of a state differ, and the same run samples the same actions again.
"""

import asyncio
import random
from collections.abc import Sequence
from dataclasses import replace

from patchgym.agent.config import AgentConfig
from patchgym.agent.loop import engine_generate, sample_turn
from patchgym.agent.trajectory import Turn
from patchgym.errors import UserError
from patchgym.inference import Engine
from patchgym.pivot.states import DecisionPoint, prompt_ids
from patchgym.train.batch import TrainSequence


def sample_actions(engine: Engine, points: Sequence[DecisionPoint], agent: AgentConfig, group_size: int, *,
                   salt: object = 0) -> dict[str, list[Turn]]:
    """{state key: its `group_size` sampled turns}; each turn's prompt_ids are the state's whole prompt."""
    if engine.needs_messages or engine.tokenizer is None:
        raise UserError("the pivot stage samples token ids to train on: it needs an engine that takes them "
                        "(inference.engine hf or vllm)")
    prompts = {p.key: prompt_ids(p, engine.tokenizer) for p in points}
    for point in points:
        if agent.max_context_tokens - len(prompts[point.key]) < 1:
            raise UserError(f"state {point.key}: its prompt of {len(prompts[point.key])} tokens leaves no room to "
                            f"sample in agent.max_context_tokens ({agent.max_context_tokens})")

    async def group(point: DecisionPoint) -> list[Turn]:
        return list(await asyncio.gather(*(
            _sample(engine, point, prompts[point.key], agent, _seed(agent, salt, point.key, g))
            for g in range(group_size))))

    async def every() -> list[list[Turn]]:
        return list(await asyncio.gather(*(group(p) for p in points)))

    return dict(zip(prompts, asyncio.run(every())))


async def _sample(engine: Engine, point: DecisionPoint, ids: list[int], agent: AgentConfig,
                  seed: int | None) -> Turn:
    """One turn at the state, as the agent loop samples its turn `point.turn` (with the sample's own seed)."""
    def generate(prompt, messages, params):
        return engine_generate(engine, prompt, messages, replace(params, seed=seed))

    room = agent.max_context_tokens - len(ids)
    return await sample_turn(generate, engine.tokenizer, agent, list(point.messages), list(ids), list(ids), point.turn,
                             room, point.tools)


def _seed(agent: AgentConfig, salt: object, key: str, g: int) -> int | None:
    if agent.sampling.seed is None:
        return None
    return random.Random(f"{agent.sampling.seed}/{salt}/{key}/{g}").randrange(2**31)


def action_sequence(turn: Turn, advantage: float, trajectory_id: str) -> TrainSequence:
    """The prompt and the sampled action as one sequence: loss on the sampled ids only (an inserted thought closing
    is not sampled), each with the engine's logprob."""
    prompt = turn.prompt_ids
    return TrainSequence(prompt + turn.output_ids, [0] * len(prompt) + turn.output_mask,
                         [0.0] * len(prompt) + turn.output_logprobs, advantage, trajectory_id)
