"""Load a run's config: YAML files merged in order, then `a.b.c=value` overrides, validated by Pydantic models.

Every mistake becomes one ConfigError whose message names the key path, the bad value, what is allowed, and
the file or override that set it.
"""

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from patchgym.agent.config import AgentConfig
from patchgym.cluster.config import ClusterConfig
from patchgym.errors import UserError
from patchgym.files import read_text
from patchgym.inference.config import InferenceConfig, turn_token_budget
from patchgym.rl.config import AlgorithmConfig
from patchgym.rollout.config import RolloutConfig
from patchgym.sandbox.config import SandboxConfig
from patchgym.train.config import TrainConfig
from patchgym.verify.config import VerifierConfig

M = TypeVar("M", bound=BaseModel)
KeyPath = tuple[Any, ...]


class ConfigError(UserError, ValueError):
    """A config that cannot be loaded; the message is meant for the user as is."""


class Config(BaseModel):
    """The whole run config; each pipeline stage owns one section."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str = Field("runs", description="where run directories are created")
    seed: int = Field(0, description="seed for every random choice of the run")
    sandbox: SandboxConfig = SandboxConfig()
    agent: AgentConfig = AgentConfig()
    inference: InferenceConfig = InferenceConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    verifier: VerifierConfig = VerifierConfig()
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _consistent(self) -> "Config":
        """Training settings that are valid one by one but not together. (What also needs the tasks file or the
        processes of a run, the trainer checks at its start.)"""
        train, algo, agent, staleness = self.train, self.algorithm, self.agent, self.rollout.max_staleness
        if agent.sampling.max_new_tokens is None:  # the model's turn budget (copies: defaults are shared objects)
            budget = turn_token_budget(self.inference.model)
            self.agent = agent = agent.model_copy(update={
                "sampling": agent.sampling.model_copy(update={"max_new_tokens": budget})})
        if algo.stages and len(train.stage_iterations) != len(algo.stages) - 1:
            raise ValueError(f"train.stage_iterations needs {len(algo.stages) - 1} entries (one per algorithm.stages "
                             f"entry but the last), got {train.stage_iterations}")
        if not algo.stages and train.stage_iterations:
            raise ValueError("train.stage_iterations is set but algorithm.stages is empty")
        threshold = algo.turn_penalty_threshold
        if threshold is not None and not algo.stages and agent.max_steps <= threshold:
            raise ValueError(f"agent.max_steps ({agent.max_steps}) must exceed algorithm.turn_penalty_threshold "
                             f"({threshold}): it is T_max of the turn penalty")
        if staleness and algo.stages:
            raise ValueError("rollout.max_staleness > 0 with algorithm.stages: a stage's curriculum reads outcomes "
                             "of iterations that have not trained yet; use max_staleness 0")
        if staleness and algo.tis_cap is None:
            raise ValueError("rollout.max_staleness > 0 needs algorithm.tis_cap: stale samples come from an older "
                             "policy, which truncated importance sampling corrects for")
        if self.cluster.backend == "ray" and staleness:
            # Workers get a snapshot of the agent: its policy-version gate cannot hold their generations back while
            # the trainer pushes weights, so rollouts running ahead would be stamped with wrong versions.
            raise ValueError("rollout.max_staleness > 0 is not supported with cluster.backend=ray yet: set it to 0")
        if train.bf16 and not str(self.inference.device).startswith("cuda"):
            raise ValueError(f"train.bf16 needs a CUDA inference.device, got '{self.inference.device}'")
        if (train.param_dtype, train.reduce_dtype, train.offload) != ("fp32", "fp32", "none") and not train.fsdp:
            raise ValueError("train.param_dtype, train.reduce_dtype and train.offload are FSDP2 policies: they need "
                             "train.fsdp (under torchrun)")
        if train.offload == "optimizer":
            raise ValueError("train.offload: optimizer has no FSDP2 equivalent (its CPUOffloadPolicy moves the "
                             "parameter shards, their gradients and so the optimizer states and step together): "
                             "use 'params', or 'none'")
        if train.offload == "params" and not str(self.inference.device).startswith("cuda"):
            raise ValueError(f"train.offload: params needs a CUDA inference.device, got '{self.inference.device}' "
                             "(on CPU the shards are in host memory already)")
        if train.warm_start is not None and train.sequence_parallel > 1:
            raise ValueError("train.warm_start with train.sequence_parallel > 1 is not supported yet (the warm start "
                             "splits its steps over all ranks, not over the dp groups): run `patchgym sft` first")
        return self


def load_config(
    files: Sequence[str | Path] = (), overrides: Sequence[str] = (), model: type[M] = Config
) -> M:
    """Merge `files` in order (dicts recursively; lists and scalars replace), apply `overrides`, validate.

    An override `a.b.c=value` is merged like a one-key file; `value` is read as YAML, empty means "".
    """
    data: dict = {}
    origins: dict[KeyPath, str] = {}  # key path -> the file or override that set it last
    for file in files:
        _merge(data, _read_yaml(Path(file)), f"file '{file}'", origins)
    for text in overrides:
        _merge(data, _parse_override(text), f"override '{text}'", origins)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(err, origins, model) for err in exc.errors(include_url=False)]
    # Raised outside the except block so pydantic's traceback is not chained under the user's message.
    if len(lines) == 1:
        raise ConfigError(f"invalid config: {lines[0]}")
    raise ConfigError(f"invalid config ({len(lines)} errors):\n" + "\n".join(f"  {line}" for line in lines))


def dump_config(cfg: BaseModel) -> str:
    """The full resolved config as YAML, loadable again with `load_config`."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def _read_yaml(path: Path) -> dict:
    text = read_text(path, "config file", ConfigError)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file '{path}'{where}: invalid YAML: {problem}") from None
    if data is None:  # an empty file, or only comments
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file '{path}': the top level must be a mapping of keys (like 'sandbox:'), "
            f"got a {type(data).__name__}: {_show(data)}"
        )
    return data


def _parse_override(text: str) -> dict:
    key, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError(f"malformed override '{text}': expected key=value, e.g. 'sandbox.memory_mb=8192'")
    keys = key.split(".")
    if not all(keys):
        raise ConfigError(f"malformed override '{text}': empty key in '{key}', expected a dotted path like 'a.b.c'")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"malformed override '{text}': value {raw!r} is not valid YAML: {problem}") from None
    for k in reversed(keys):
        value = {k: value}
    return value


def _merge(base: dict, layer: dict, source: str, origins: dict[KeyPath, str], prefix: KeyPath = ()) -> None:
    """Merge `layer` into `base` in place, recording `source` as the origin of every key path it sets."""
    for key, value in layer.items():
        path = (*prefix, key)
        origins[path] = source
        if not (isinstance(value, dict) and isinstance(base.get(key), dict)):
            # A replaced value takes its sub-keys with it, so their old origins no longer apply.
            for stale in [p for p in origins if len(p) > len(path) and p[: len(path)] == path]:
                del origins[stale]
            base[key] = {} if isinstance(value, dict) else value
        if isinstance(value, dict):
            _merge(base[key], value, source, origins, path)


def _describe(err: dict, origins: dict[KeyPath, str], model: type[BaseModel]) -> str:
    """One line for one pydantic error: key path, where it was set, what was wrong, what is allowed."""
    loc = tuple(err["loc"])
    path = ".".join(map(str, loc)) or "(top level)"
    # List items have no origin of their own: the list was set as a whole.
    origin = next((origins[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in origins), None)
    head = f"{path} (from {origin})" if origin else path
    if err["type"] == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        line = f"{head}: unknown key, set to {_show(err['input'])}"
        section = _model_at(model, parent)
        if section is None:
            return line
        allowed = sorted(section.model_fields)
        where = f"in '{'.'.join(map(str, parent))}'" if parent else "at the top level"
        line += f"; allowed keys {where}: {', '.join(allowed)}"
        close = difflib.get_close_matches(str(key), allowed, n=1)
        return line + (f"; did you mean '{close[0]}'?" if close else "")
    if err["type"] == "missing":
        return f"{head}: required key is missing"
    msg = err["msg"].removeprefix("Value error, ")  # our validators' own words need no pydantic preamble
    if not loc:  # a check across sections (Config._consistent): its message names the keys
        return msg
    expected = f"should be {msg.removeprefix('Input should be ')}" if msg.startswith("Input should be ") else msg
    return f"{head}: got {_show(err['input'])}, {expected}"


def _model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc`, following fields, list items and dict values."""
    tp: Any = model
    for part in loc:
        tp = _strip_optional(tp)
        if _is_model(tp):
            field = tp.model_fields.get(part)
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) in (list, dict):
            tp = get_args(tp)[-1]  # list[X] -> X, dict[K, V] -> V: the type one key or index down
        else:
            return None
    tp = _strip_optional(tp)
    return tp if _is_model(tp) else None


def _strip_optional(tp: Any) -> Any:
    """`X | None` -> X; pydantic adds no key path step for the None branch."""
    args = [a for a in get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 and type(None) in get_args(tp) else tp


def _is_model(tp: Any) -> bool:
    # Generic aliases like list[int] pass isinstance(..., type) but break issubclass.
    return get_origin(tp) is None and isinstance(tp, type) and issubclass(tp, BaseModel)


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
