"""Data parallelism: two CPU processes over gloo must compute exactly the single-process full-batch gradient and
end one policy_update with identical weights equal to the single-process ones; the same for FSDP2 sharding."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from patchgym.rl.config import load_preset
from patchgym.train.batch import TrainSequence
from patchgym.train.prepare import full_state_dict, make_optimizer, shard_model
from patchgym.train.update import _all_reduce_gradients, accumulate_policy_gradients, policy_update

WORLD = 2
# Which sequences each rank holds, so that the k-th slices of the ranks make up the k-th single-process slice
# (split_mini_batches): 7 -> steps {0,1,2}, {3,4,5,6}; 3 -> steps {0}, {1,2}, where rank 1's first slice is empty.
# Adam divides by sqrt(v): on coordinates with almost no gradient it turns 1e-9 of summation-order noise in the
# gradients into ~1e-7 of weight after two steps at lr 1e-2.
WEIGHTS_ATOL = 1e-5
SHARDS = {7: [[0, 2, 4, 6], [1, 3, 5]], 3: [[0, 1], [2]]}
ALGO = load_preset("grpo++").model_copy(update={"norm_constant": 64.0})


def small_model() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).train()


def make_sequences() -> list[TrainSequence]:
    """Seven sequences (so the ranks hold different numbers), varied lengths, masks and advantages."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(7):
        length = 10 + 3 * i
        mask = [0] * 3 + [int(k % 4 < 2) for k in range(length - 3)]
        out.append(TrainSequence(torch.randint(1, 128, (length,), generator=gen).tolist(), mask,
                                 [-1.5 * m for m in mask], advantage=[1.0, -0.5, 0.3, -1.0, 2.0, 0.0, -0.7][i]))
    return out


def gradients(model) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for n, p in model.named_parameters()}


def run_update(model, sequences, group) -> dict[str, torch.Tensor]:
    optimizer = make_optimizer(model, lr=1e-2, weight_decay=0.1)
    policy_update(model, optimizer, sequences, ALGO, micro_token_budget=60, mini_batches=2, process_group=group)
    return full_state_dict(model)


def single_process(count: int = 7) -> tuple[dict, dict]:
    model = small_model()
    accumulate_policy_gradients(model, make_sequences()[:count], ALGO, micro_token_budget=60)
    grads = gradients(model)
    model.zero_grad(set_to_none=True)
    return grads, run_update(model, make_sequences()[:count], None)


def worker(rank: int, out: str, fsdp: bool, count: int = 7) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=WORLD)
    try:
        group = dist.group.WORLD
        model = small_model()
        if fsdp:
            shard_model(model)
        mine = [make_sequences()[i] for i in SHARDS[count][rank]]
        accumulate_policy_gradients(model, mine, ALGO, micro_token_budget=60, process_group=group)
        if not fsdp:  # policy_update does this inside its optimizer step
            _all_reduce_gradients([p for p in model.parameters()], group)
        grads = gradients(model)
        model.zero_grad(set_to_none=True)
        weights = run_update(model, mine, group)
        torch.save({"grads": grads, "weights": weights}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn(tmp_path: Path, fsdp: bool, count: int = 7) -> list[dict]:
    mp.spawn(worker, args=(str(tmp_path), fsdp, count), nprocs=WORLD, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert set(a) == set(b)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=atol), (name, (a[name] - b[name]).abs().max())


def test_two_gloo_processes_match_one_process(tmp_path):
    grads, weights = single_process()
    ranks = spawn(tmp_path, fsdp=False)
    for result in ranks:
        assert_same(result["grads"], grads, atol=1e-6)
        assert_same(result["weights"], weights, atol=WEIGHTS_ATOL)
    assert_same(ranks[0]["weights"], ranks[1]["weights"], atol=0.0)


@pytest.mark.parametrize("count", [7, 3], ids=["uneven", "a rank with an empty mini-batch"])
def test_fsdp2_on_cpu_matches_one_process(tmp_path, count):
    """Sharded over 2 gloo processes; with 3 sequences and K = 2, rank 1 has nothing in its second mini-batch."""
    grads, weights = single_process(count)
    for result in spawn(tmp_path, fsdp=True, count=count):
        assert_same(result["grads"], grads, atol=1e-6)
        assert_same(result["weights"], weights, atol=WEIGHTS_ATOL)


def gpu_worker(rank: int, out: str, world: int) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        model = shard_model(small_model().cuda())
        weights = run_update(model, make_sequences()[rank::world], dist.group.WORLD)
        torch.save({n: t.cpu() for n, t in weights.items()}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp2_on_gpus_matches_one_unsharded_process(tmp_path):
    """NCCL over every GPU here (up to 2; one GPU still runs the sharded path) against one unsharded GPU model."""
    world = min(torch.cuda.device_count(), 2)
    reference = {n: t.cpu() for n, t in run_update(small_model().cuda(), make_sequences(), None).items()}
    mp.spawn(gpu_worker, args=(str(tmp_path), world), nprocs=world, join=True)
    for rank in range(world):
        assert_same(torch.load(tmp_path / f"rank{rank}.pt"), reference, atol=1e-5)
