"""Packed micro-batches: logprobs, entropies, the policy loss and its gradients equal those of one sequence at a
time (fp32, within 1e-5) on the tiny Llama and Qwen3 models, under sdpa and eager attention; the KL reference pass
and pi_old use the same packing; the update reports its padding fraction."""

import copy

import pytest
import torch

from patchgym.inference.models import tiny_qwen3_model
from patchgym.rl.config import AlgorithmConfig
from patchgym.train.batch import collate, collate_packed, pack_sequences
from patchgym.train.logprobs import batch_logprobs, packed_forward_kwargs
from patchgym.train.update import accumulate_policy_gradients, make_optimizer, policy_update
from tests.train.test_train_update import flat_grad, make_sequences

ATOL = 1e-5


@pytest.fixture(scope="module")
def qwen3():
    return tiny_qwen3_model()[0]


@pytest.fixture(params=["llama", "qwen3"])
def base(request):
    torch.set_num_threads(1)
    if request.param == "llama":
        return request.getfixturevalue("tiny")[0]  # the suite's tiny Llama (SmolLM2's shape family)
    return request.getfixturevalue("qwen3")


def with_attention(base, implementation: str):
    model = copy.deepcopy(base).train()
    model.config._attn_implementation = implementation
    return model


@pytest.fixture(params=["sdpa", "eager"])
def model(base, request):
    return with_attention(base, request.param)


def test_packed_logprobs_and_entropies_equal_one_sequence_at_a_time(model):
    sequences = make_sequences()
    with torch.no_grad():
        packed, packed_entropy = batch_logprobs(model, collate_packed(sequences), entropy=True)
        for row, sequence in enumerate(sequences):
            alone, alone_entropy = batch_logprobs(model, collate([sequence], 0), entropy=True)
            assert torch.allclose(packed[row, :len(sequence)], alone[0], atol=ATOL, rtol=0)
            assert torch.allclose(packed_entropy[row, :len(sequence)], alone_entropy[0], atol=ATOL, rtol=0)
            assert (packed[row, len(sequence):] == 0).all()


def test_without_the_block_mask_later_sequences_would_see_earlier_ones(model):
    """The check above can fail: the same packed row under a plain causal mask gives other logprobs."""
    sequences = make_sequences(count=2)
    batch = collate_packed(sequences)
    kwargs = packed_forward_kwargs(model, batch["lengths"])
    with torch.no_grad():
        right = model(input_ids=batch["packed_ids"], **kwargs).logits
        leaky = model(input_ids=batch["packed_ids"], position_ids=kwargs["position_ids"]).logits
    first = len(sequences[0])
    assert torch.allclose(right[0, :first], leaky[0, :first], atol=ATOL)
    assert not torch.allclose(right[0, first:], leaky[0, first:], atol=1e-3)


# Every term at once: per-sequence aggregation, clipping both ways, TIS, an entropy bonus and KL to a reference.
ALGO = AlgorithmConfig(loss_agg_mode="seq-mean-token-mean", clip_high=0.28, dual_clip=3.0, tis_cap=2.0,
                       entropy_coef=0.01, kl_coef=0.1)


@pytest.mark.parametrize("base, implementation", [("llama", "sdpa"), ("qwen3", "eager")], indirect=["base"])
def test_packed_loss_and_gradient_equal_one_sequence_at_a_time(base, implementation):
    model, algo = with_attention(base, implementation), ALGO
    sequences = make_sequences()
    old = [torch.tensor(s.rollout_logprobs) * 0.9 for s in sequences]  # pi_old != pi_theta: ratios, clips, TIS
    reference = copy.deepcopy(model).requires_grad_(False)  # KL against a reference that differs from the policy
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.01 * torch.randn_like(param))

    def step(packing: bool, budget: int) -> tuple[float, torch.Tensor]:
        model.zero_grad()
        loss = accumulate_policy_gradients(model, sequences, algo, micro_token_budget=budget, old_logprobs=old,
                                           ref_model=reference, packing=packing)
        return loss, flat_grad(model)

    budget = 2 * max(len(s) for s in sequences)
    assert len(pack_sequences(sequences, budget)) < len(sequences)  # several sequences share a row
    packed_loss, packed_grad = step(True, budget)
    alone_loss, alone_grad = step(False, 1)  # the padded path, each sequence alone: nothing padded, nothing packed
    assert packed_grad.abs().sum() > 0
    assert abs(packed_loss - alone_loss) < ATOL
    assert torch.allclose(packed_grad, alone_grad, atol=ATOL, rtol=0)


@pytest.mark.parametrize("base", ["llama"], indirect=True)
def test_the_update_reports_its_padding_fraction(base):
    sequences = make_sequences()
    lengths = [len(s) for s in sequences]
    algo = AlgorithmConfig(loss_agg_mode="token-mean", tis_cap=None, entropy_coef=0.01)  # no row skipped

    def update(packing: bool) -> dict:
        model = copy.deepcopy(base).train()
        return policy_update(model, make_optimizer(model, 1e-3), sequences, algo, micro_token_budget=10_000,
                             packing=packing)

    packed, padded = update(True), update(False)
    assert packed["padding_fraction"] == 0.0 and packed["input_tokens"] == sum(lengths)
    # padded: one micro-batch of rows x longest positions, of which sum(lengths) are real
    assert padded["padding_fraction"] == pytest.approx(1 - sum(lengths) / (len(lengths) * max(lengths)))
    assert padded["input_tokens"] == packed["input_tokens"]
    assert packed["loss"] == pytest.approx(padded["loss"], abs=ATOL)


@pytest.mark.parametrize("base", ["qwen3"], indirect=True)
def test_flash_attention_gets_varlen_boundaries_instead_of_a_mask(base):
    """No flash-attention kernel exists on this CPU machine; what the model is handed is checked: transformers'
    padding-free path reads cu_seqlens and max lengths, and needs no mask."""
    model = copy.deepcopy(base)
    model.config._attn_implementation = "flash_attention_2"
    kwargs = packed_forward_kwargs(model, torch.tensor([3, 2, 4]))
    assert "attention_mask" not in kwargs
    assert kwargs["cu_seq_lens_q"].tolist() == kwargs["cu_seq_lens_k"].tolist() == [0, 3, 5, 9]
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == 4
    assert kwargs["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]


def test_a_row_of_one_sequence_takes_the_causal_path_with_the_same_logprobs(model):
    """One sequence in a packed row gets no dense mask (sdpa's causal kernel) and the logprobs of the padded path."""
    sequence = make_sequences(count=1)
    packed = collate_packed(sequence)
    assert set(packed_forward_kwargs(model, packed["lengths"])) == {"position_ids"}
    with torch.no_grad():
        got = batch_logprobs(model, packed)
        want = batch_logprobs(model, collate(sequence, 0))
    assert torch.allclose(got, want, atol=ATOL, rtol=0)
