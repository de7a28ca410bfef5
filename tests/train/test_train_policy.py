"""The Policy protocol is what the Trainer calls: LocalPolicy and RayPolicy each take every call it states."""

import inspect

import pytest

from patchgym.train.policy import LocalPolicy, Policy


def calls(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_")}


@pytest.mark.parametrize("name", ["local", "ray"])
def test_each_policy_takes_every_call_of_the_protocol(name):
    if name == "ray":
        pytest.importorskip("ray")
        from patchgym.train.ray_trainer import RayPolicy as cls
    else:
        cls = LocalPolicy
    mine = calls(cls)
    for call, wanted in calls(Policy).items():
        assert call in mine, f"{cls.__name__} lacks {call}"
        have = mine[call].parameters
        for param in wanted.parameters.values():  # each of the protocol's parameters, as it names and passes them
            assert param.name in have and have[param.name].kind == param.kind, f"{cls.__name__}.{call}: {param}"
            assert have[param.name].default == param.default, f"{cls.__name__}.{call}: {param.name}'s default"
        extra = [p for p in have.values() if p.name not in wanted.parameters and p.default is inspect.Parameter.empty]
        assert not extra, f"{cls.__name__}.{call} needs {extra}, which the Trainer does not pass"


def test_bf16_autocast_over_optimizer_steps_computes_with_the_current_weights():
    """A region of bf16_autocast that takes optimizer steps: each forward uses the weights as the last step left
    them (autocast's cast cache would hand back the first step's bf16 copies), within bf16's rounding."""
    import torch

    from patchgym.train.policy import bf16_autocast

    torch.manual_seed(0)
    layer, x = torch.nn.Linear(16, 16), torch.randn(4, 16)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with bf16_autocast("cpu"):
        for _ in range(3):
            out = layer(x)
            assert out.dtype == torch.bfloat16
            with torch.autocast("cpu", enabled=False):
                exact = layer(x)  # the current fp32 weights
            torch.testing.assert_close(out.float(), exact, atol=0.05, rtol=0.02)
            out.float().pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
