"""The trainer's multi-process path: two gloo processes load only their FSDP2 shards of a tiny model (logprobs exactly
the full copy's), rank 0 scatters one batch, they update with gradient checkpointing, and the checkpoint (gathered
weights, sharded optimizer state) loads in one process with exactly the weights (1e-5) and optimizer state of a
single-process update on the same batch. Then `torchrun -m patchgym train` end to end, killed with -9 and resumed:
in bf16 on a Qwen3 shape, and with sequence parallelism."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from patchgym.inference.models import load_model, tiny_qwen3_model
from patchgym.inference.vllm_engine import free_port
from patchgym.rl.config import load_preset
from patchgym.sandbox.reaper import leftovers, reap
from patchgym.tasks import write_tasks
from patchgym.train import synthetic
from patchgym.train.checkpoint import latest_checkpoint, load_training_state, read_state
from patchgym.train.config import TrainConfig
from patchgym.train.distributed import Distributed, prepare_policy, save_run_checkpoint, shard_sequences
from patchgym.train.logprobs import sequence_logprobs
from patchgym.train.metrics_schema import read_metrics
from patchgym.train.prepare import full_state_dict
from patchgym.train.update import make_optimizer, policy_update

WORLD = 2
BF16_GAP = 0.1  # bf16 keeps 8 bits of mantissa; measured 0.033-0.038 on the tiny Qwen3 (fp32: < 1e-5)
ALGO = load_preset("grpo++").model_copy(update={"norm_constant": 64.0})
TRAIN = TrainConfig(fsdp=True, gradient_checkpointing=True, mini_batches=2, micro_token_budget=200)


def batch(tokenizer) -> list:
    """Seven two-turn episodes of the synthetic environment, with varied answers and advantages."""
    from patchgym.train.batch import sequences_from_trajectories

    answers = ["ready", "hello", "ok", "ready", "no", "yes", "ready"]
    episodes = [synthetic.scripted(tokenizer, str(i), (answers[i], str((i * 3) % 10))) for i in range(7)]
    return sequences_from_trajectories(episodes, [1.0, -0.5, 0.3, -1.0, 2.0, 0.0, -0.7])


def update(model, sequences, place, optimizer=None):
    optimizer = make_optimizer(model, lr=1e-2, weight_decay=0.1) if optimizer is None else optimizer
    policy_update(model, optimizer, sequences, ALGO, micro_token_budget=TRAIN.micro_token_budget,
                  mini_batches=TRAIN.mini_batches, process_group=place.group)
    return optimizer


def worker(rank: int, out: str, port: int) -> None:
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    place = Distributed.from_env("cpu")
    try:
        model, tokenizer = prepare_policy("tiny", "cpu", TRAIN, place, None)  # each rank reads only its shards
        # Made before the first forward pass, as LocalPolicy makes it: made after this no-grad pass, it was seen to
        # hold parameters that get_optimizer_state_dict at save did not find (KeyError; not yet understood).
        optimizer = make_optimizer(model, lr=1e-2, weight_decay=0.1)
        ids = torch.tensor([batch(tokenizer)[0].input_ids])
        with torch.no_grad():  # what the full copy computes, exactly
            assert torch.equal(sequence_logprobs(model, ids, torch.ones_like(ids)),
                               sequence_logprobs(load_model("tiny")[0], ids, torch.ones_like(ids)))
        shards = shard_sequences(batch(tokenizer), TRAIN.mini_batches, WORLD) if place.main else None
        update(model, place.scatter(shards), place, optimizer)
        save_run_checkpoint(place, Path(out), 1, model, tokenizer, optimizer, None, state={"iteration": 1}, keep=1)
    finally:
        place.close()


def test_two_fsdp_processes_checkpoint_what_one_process_computes(tiny, tmp_path):
    mp.spawn(worker, args=(str(tmp_path), free_port()), nprocs=WORLD, join=True)

    one = Distributed()
    model, tokenizer = prepare_policy("tiny", "cpu", TRAIN, one, None)
    optimizer = update(model, batch(tokenizer), one)
    expected = full_state_dict(model)

    checkpoint = latest_checkpoint(tmp_path)
    loaded, _ = prepare_policy("tiny", "cpu", TrainConfig(), one, checkpoint)  # a single process loads it
    got = full_state_dict(loaded)
    assert set(got) >= set(expected) - {"lm_head.weight"}
    moved = 0
    for name, tensor in expected.items():
        if name in got:
            assert torch.allclose(got[name], tensor, atol=1e-5), (name, (got[name] - tensor).abs().max())
            moved += not torch.equal(tensor, tiny[0].state_dict()[name])
    assert moved > 0
    fresh = make_optimizer(loaded, lr=1e-2, weight_decay=0.1)
    load_training_state(checkpoint, fresh, model=loaded)  # the gathered optimizer state, keyed by name
    ours = optimizer.state_dict()["state"]
    theirs = fresh.state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.allclose(ours[key]["exp_avg_sq"], theirs[key]["exp_avg_sq"], atol=1e-8)


def test_torchrun_bf16_sequence_parallel_qwen3_trains_resumes_after_kill_9_and_saves_for_from_pretrained(
        backend, tiny, tiny_task, tmp_path):
    """`torchrun -m patchgym train` on two ranks: a random Qwen3 (and its KL reference) built on the meta device, each
    rank loading only its FSDP2 shards, computing in bf16 (gloo all-gathers, reduce-scatters and all-to-alls bf16),
    each packed sequence cut over both ranks (sequence_parallel: 2) with gradient checkpointing. Killed with -9
    after iteration 1's checkpoint, the resumed run reads its sharded optimizer state back and trains iteration 2;
    the checkpoint loads with from_pretrained as fp32 master weights. The trainer's logprobs stay within bf16's
    rounding of the fp32 engine's (their equality in fp32, to 1e-5, is test_sequence_parallel's two-process test)."""
    if backend != "docker":
        pytest.skip("the torchrun test runs on the docker backend")
    # The random model never resolves: every advantage is 0; entropy and KL terms make every row train.
    config = sp_config(tmp_path, tiny_task, {"kl_coef": 0.01, "entropy_coef": 0.001},
                       {"weight_decay": 0.1, "param_dtype": "bf16", "gradient_checkpointing": True})
    run, log = tmp_path / "run", tmp_path / "train.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATCHGYM_RUN_ID": f"train-sp-{uuid.uuid4().hex[:8]}"}
    first = torchrun(["-c", str(config), "--out", str(run)], env, log)
    deadline = time.monotonic() + 300
    while latest_checkpoint(run) is None:
        assert first.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    kill_tree(first.pid)
    first.wait()
    assert read_state(latest_checkpoint(run))["iteration"] == 1

    assert torchrun(["--resume", "--out", str(run)], env, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    assert "after iteration 1 (" in log.read_text()  # resumed from the checkpoint of the killed run
    metrics = read_metrics(run)
    assert [m["iteration"] for m in metrics] == [1, 2] and all(m["trajectories"] == 2 for m in metrics)
    gaps = [m["rollout_logprob_gap"] for m in metrics]
    print(f"bf16 + sp=2: rollout logprob gap per iteration {gaps}")
    assert all(0 < gap < BF16_GAP for gap in gaps), gaps  # > 0: the trainer computed in bf16, not in fp32
    checkpoint = latest_checkpoint(run)
    assert read_state(checkpoint)["optimizer_steps"] == 2 and (checkpoint / "optimizer").is_dir()
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(checkpoint / "model").state_dict()
    base = tiny_qwen3_model()[0].state_dict()
    assert all(weights[k].dtype == torch.float32 for k in base)  # the master weights, not their bf16 casts
    assert any(not torch.equal(base[k], weights[k]) for k in base if k in weights)
    reap()
    assert leftovers(env["PATCHGYM_RUN_ID"]) == []


def test_torchrun_fp32_sequence_parallel_trains_with_the_logprobs_of_one_process(backend, tiny, tiny_task, tmp_path):
    """The same two-rank run in fp32, neither killed nor resumed: with each packed sequence cut over both ranks, the
    trainer's logprobs in both iterations equal those the one-process engine sampled with (1e-4; measured < 1e-5),
    before and after the first update's weights reached the engine."""
    if backend != "docker":
        pytest.skip("the torchrun test runs on the docker backend")
    config = sp_config(tmp_path, tiny_task, {"entropy_coef": 0.001}, {})
    run, log = tmp_path / "run", tmp_path / "train.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATCHGYM_RUN_ID": f"train-sp32-{uuid.uuid4().hex[:8]}"}
    assert torchrun(["-c", str(config), "--out", str(run)], env, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    metrics = read_metrics(run)
    assert [m["iteration"] for m in metrics] == [1, 2] and all(m["trajectories"] == 2 for m in metrics)
    gaps = [m["rollout_logprob_gap"] for m in metrics]
    print(f"fp32 + sp=2: rollout logprob gap per iteration {gaps}")
    assert all(gap < 1e-4 for gap in gaps), gaps
    reap()
    assert leftovers(env["PATCHGYM_RUN_ID"]) == []


def sp_config(tmp_path: Path, task, algorithm: dict, train: dict) -> Path:
    """A two-iteration train.yaml of the tiny Qwen3 on `task`, FSDP2 with sequence parallelism over WORLD ranks."""
    tasks = tmp_path / "tasks.jsonl"
    write_tasks([task], tasks)
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "inference": {"model": "tiny-qwen3"}, "agent": {"max_steps": 2, "sampling": {"max_new_tokens": 8}},
        "algorithm": algorithm,
        "train": {"tasks": str(tasks), "iterations": 2, "tasks_per_iteration": 1, "samples_per_task": 2,
                  "lr": 0.01, "fsdp": True, "keep_checkpoints": 1, "sequence_parallel": WORLD, **train},
    }))
    return config


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and its descendants at once (torchrun starts each rank in a session of its own)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += parents.get(tree[-1], [])
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def torchrun(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """`torchrun -m patchgym train ARGS` on WORLD ranks, its output appended to `log`."""
    with open(log, "a") as out:
        return subprocess.Popen([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node",
                                 str(WORLD), "-m", "patchgym", "train", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def gpu_worker(rank: int, out: str, port: int) -> None:
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    place = Distributed.from_env("cuda")
    try:
        model, tokenizer = prepare_policy("tiny", place.device, TRAIN, place, None)
        shards = shard_sequences(batch(tokenizer), TRAIN.mini_batches, WORLD) if place.main else None
        optimizer = update(model, place.scatter(shards), place)
        save_run_checkpoint(place, Path(out), 1, model, tokenizer, optimizer, None, state={"iteration": 1}, keep=1)
    finally:
        place.close()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_gpus_over_nccl_checkpoint_what_one_gpu_computes(tiny, tmp_path):
    mp.spawn(gpu_worker, args=(str(tmp_path), 29517), nprocs=WORLD, join=True)
    one = Distributed(device="cuda:0")
    model, tokenizer = prepare_policy("tiny", "cuda:0", TRAIN, one, None)
    update(model, batch(tokenizer), one)
    expected = {k: v.cpu() for k, v in full_state_dict(model).items()}
    loaded, _ = prepare_policy("tiny", "cpu", TrainConfig(), one, latest_checkpoint(tmp_path))
    got = full_state_dict(loaded)
    for name in set(expected) & set(got):
        assert torch.allclose(got[name], expected[name], atol=1e-5), name
