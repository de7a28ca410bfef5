"""The update's logprobs are those of the distribution rollouts sampled from: at agent.sampling.temperature T, the
hf engine reports log softmax(logits / T) for each token it samples, and policy_update (temperature=T) computes the
same, so its rollout_logprob_gap stays at float noise; at T = 1 against rollouts at T = 0.5 the gap is large."""

import pytest
import torch

from patchgym.inference import SamplingParams
from patchgym.inference.hf import HFEngine
from patchgym.rl.config import load_preset
from patchgym.train.batch import TrainSequence
from patchgym.train.logprobs import sampling_temperature, sequence_logprobs
from patchgym.train.update import make_optimizer, policy_update

torch.set_num_threads(1)


def rollouts(tiny, temperature: float) -> list[TrainSequence]:
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, max_batch=2)
    try:
        out = []
        for i, text in enumerate(["def add(a, b):", "The issue says"]):
            prompt = tokenizer.encode(text)
            gen = engine.generate(prompt, SamplingParams(temperature=temperature, max_new_tokens=12, seed=i))
            out.append(TrainSequence(prompt + gen.token_ids, [0] * len(prompt) + [1] * len(gen.token_ids),
                                     [0.0] * len(prompt) + list(gen.logprobs), advantage=1.0 - 2 * i))
        return out
    finally:
        engine.close()


@pytest.mark.parametrize("trainer_temperature, gap_below, gap_above", [(0.5, 1e-4, None), (1.0, None, 0.05)])
def test_the_update_takes_its_logprobs_at_the_sampling_temperature(tiny, trainer_temperature, gap_below, gap_above):
    model = tiny[0]
    sequences = rollouts(tiny, 0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = policy_update(model, make_optimizer(model, 0.0), sequences, load_preset("grpo++"),
                            micro_token_budget=256, temperature=trainer_temperature)
    model.load_state_dict(before)  # the tiny model is shared by the session's tests
    model.eval()
    gap = metrics["rollout_logprob_gap"]
    if gap_below is not None:
        assert gap < gap_below, gap
    else:
        assert gap > gap_above, gap


def test_sampling_temperature_scales_the_logits_and_is_undone_outside(tiny):
    model = tiny[0]
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = sequence_logprobs(model, ids, mask)
        with sampling_temperature(0.5):
            hot = sequence_logprobs(model, ids, mask)
        again = sequence_logprobs(model, ids, mask)
        logits = model(input_ids=ids).logits[0, :-1].float()
    want = torch.log_softmax(logits / 0.5, -1).gather(1, ids[0, 1:, None])[:, 0]
    assert torch.allclose(hot[0, 1:], want, atol=1e-5)
    assert torch.equal(plain, again) and not torch.allclose(plain, hot, atol=1e-3)
    with pytest.raises(ValueError, match="> 0"):
        with sampling_temperature(0.0):
            pass
