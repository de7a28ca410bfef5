"""The engine contract of the inference stage: token ids in, sampled token ids and their logprobs out."""

from dataclasses import dataclass
from typing import Any, Mapping, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. The defaults are the unbiased policy (T = 1, no truncation) that RL needs;
    an engine never fills them in from the model's generation_config.

    temperature 0 means greedy. top_k 0, top_p 1 and min_p 0 mean "off". The engine always stops at the model's
    end-of-turn/eos tokens; stop_token_ids adds more.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_new_tokens: int = 512
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """One completion, exactly as sampled.

    token_ids: the sampled ids, including the stop token when finish_reason is "stop" (never re-tokenised text).
    logprobs: per sampled token, log softmax(logits / T) of the model at the sampling temperature T, *before*
        top-k/top-p/min-p truncation (vLLM's "processed" logprobs); for greedy (T = 0) it is log softmax(logits).
        With the default params this is exactly the behaviour policy's logprob that PPO/IS ratios need.
    finish_reason: "stop" (a stop/eos token was sampled) or "length" (max_new_tokens or the model's context).
    exact: False when token_ids were re-tokenised from a remote server's text (it did not return its ids).
    text: the completion's text, from an engine without a tokenizer (a script), which samples no ids.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    exact: bool = True
    text: str | None = None


class Engine(Protocol):
    """What every engine (hf, vllm, openai) offers. `generate` is thread-safe; concurrent callers are batched.

    An engine takes token ids (`generate`), or, when `needs_messages` is true, only the chat itself
    (`generate_chat`: hosted chat APIs, and scripts, whose tokenizer is None and whose generations
    carry `text` and no ids).
    """

    tokenizer: Any  # a Hugging Face tokenizer that carries the chat template; None for a text-only engine
    needs_messages: bool

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...

    def generate_chat(self, messages: list[dict], params: SamplingParams) -> Generation:
        """One assistant turn after `messages`; called instead of `generate` when `needs_messages`."""
        ...

    async def agenerate_chat(self, messages: list[dict], params: SamplingParams) -> Generation: ...

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Push new policy weights (a trainer's state_dict, or (name, tensor) pairs); takes effect at the next step."""
        ...

    def close(self) -> None: ...
