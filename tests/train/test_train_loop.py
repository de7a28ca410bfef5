"""The RL loop end to end on the tiny model and the tiny task in Docker: two iterations write a metrics line each
with every key, checkpoints, and leave the engine holding exactly the trainer's weights."""

import json

import pytest
import torch

from patchgym.config import load_config
from patchgym.tasks import write_tasks
from patchgym.train.checkpoint import latest_checkpoint, list_checkpoints, read_state
from patchgym.train.loop import Trainer, TrainError
from patchgym.train.metrics_schema import KEYS, UPDATE_KEYS, read_metrics
from patchgym.train.prepare import full_state_dict


@pytest.fixture
def docker_only(backend):
    if backend != "docker":
        pytest.skip("the loop test runs on the docker backend")
    return backend


def tiny_config(tmp_path, tasks_file, *extra: str):
    return load_config(overrides=[
        "inference.model=tiny", f"train.tasks={tasks_file}", "train.iterations=2", "train.tasks_per_iteration=1",
        "train.samples_per_task=2", "train.lr=0.01", "train.weight_decay=0.1", "train.keep_checkpoints=1",
        "agent.max_steps=2", "agent.sampling.max_new_tokens=8", "rollout.max_sandboxes=2",
        "algorithm.advantage=rloo", *extra])


def test_two_iterations_write_metrics_checkpoints_and_push_weights(docker_only, tiny, tiny_task, tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    run = tmp_path / "run"
    trainer = Trainer(tiny_config(tmp_path, tasks_file), run, progress=False)
    initial = {k: v.clone() for k, v in full_state_dict(tiny_model_copy()).items()}
    trainer.run()

    lines = read_metrics(run)
    assert [line["iteration"] for line in lines] == [1, 2]
    for line in lines:
        assert set(KEYS) | set(UPDATE_KEYS) <= set(line), set(KEYS) | set(UPDATE_KEYS) - set(line)
        assert line["trajectories"] == 2 and line["tasks"] == 1
        assert sum(line["terminations"].values()) == 2
        assert line["trained_trajectories"] == 2 and line["policy_tokens"] == 2 * line["sampled_tokens_per_trajectory"]
        assert line["advantage_zero_fraction"] == 1.0  # the random model never resolves
        # Nothing to learn: both rows are skipped (exactly zero gradient), so no forward pass measured entropy.
        assert line["skipped_zero_advantage"] == 2 and line["entropy"] == 0.0 and line["train_input_tokens"] == 0
        assert line["optimizer_steps"] == line["iteration"]
    assert (run / "tensorboard").is_dir() and any((run / "tensorboard").iterdir())

    for n in (1, 2):
        ids = [json.loads(x)["trajectory_id"] for x in (run / "rollouts" / f"iter-{n}" / "trajectories.jsonl")
               .read_text().splitlines()]
        assert sorted(ids) == [f"{tiny_task.instance_id}#0", f"{tiny_task.instance_id}#1"]
    assert [p.name for p in list_checkpoints(run)] == ["iter-2"]  # keep_checkpoints=1
    assert read_state(latest_checkpoint(run))["iteration"] == 2

    engine = trainer.engine.model.state_dict()
    trained = full_state_dict(trainer.model)
    assert engine.keys() == trained.keys()
    assert all(torch.equal(engine[k], trained[k]) for k in trained)
    assert any(not torch.equal(initial[k], trained[k]) for k in trained)  # the update (weight decay) moved them


def test_a_started_run_is_not_overwritten_without_resume(docker_only, tiny_task, tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with pytest.raises(TrainError, match="pass --resume"):
        Trainer(tiny_config(tmp_path, tasks_file), tmp_path / "run", progress=False).run()


@pytest.mark.parametrize(("override", "message"), [
    ("train.tasks=null", "train.tasks is not set"),
    ("train.tasks_per_iteration=2", "more than the 1 tasks"),
    ("inference.engine=openai", "inference.engine"),
])
def test_bad_settings_are_named_before_anything_starts(tiny_task, tmp_path, override, message):
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    with pytest.raises(TrainError, match=message):
        Trainer(tiny_config(tmp_path, tasks_file, override), tmp_path / "run", progress=False).run()
    assert not (tmp_path / "run").exists()


def tiny_model_copy():
    from patchgym.inference.models import tiny_model

    return tiny_model()[0]


def test_lora_run_pushes_merged_weights(docker_only, tiny, tiny_task, tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    config = tiny_config(tmp_path, tasks_file, "train.iterations=1",
                         "train.lora={r: 4, lora_alpha: 8, target_modules: [q_proj, v_proj]}")
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.run()
    engine, merged = trainer.engine.model.state_dict(), full_state_dict(trainer.model)
    assert engine.keys() == merged.keys() and all(torch.equal(engine[k], merged[k]) for k in merged)
    assert (latest_checkpoint(tmp_path / "run") / "adapter" / "adapter_config.json").is_file()


def test_sft_on_recorded_trajectories_and_rft_without_a_solve(docker_only, tiny, tiny_task, tmp_path):
    from transformers import AutoModelForCausalLM

    from patchgym.agent.trajectory_files import TrajectoryFileError, read_trajectories
    from patchgym.train.rft import rft, sft

    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    config = tiny_config(tmp_path, tasks_file, "train.sft_batch_size=1")
    with pytest.raises(TrainError, match="no trajectory resolved its task"):
        rft(config, [tiny_task], 2, tmp_path / "rft", progress=False)
    trajectories = read_trajectories([tmp_path / "rft" / "rollouts"])
    assert len(trajectories) == 2

    assert all(turn.format_error for t in trajectories for turn in t.turns)  # a random model never parses
    with pytest.raises(TrainError, match="none of the 2 trajectories has a sampled token"):
        sft(config, trajectories, tmp_path / "sft")  # format-error turns are masked: nothing is left
    for t in trajectories:
        t.turns[0].format_error = False
    checkpoint = sft(config, trajectories, tmp_path / "sft")
    assert [m["iteration"] for m in read_metrics(tmp_path / "sft")] == [1, 2]  # one step per trajectory
    assert all(m["loss"] > 0 for m in read_metrics(tmp_path / "sft"))
    tuned = AutoModelForCausalLM.from_pretrained(checkpoint / "model").state_dict()
    base = tiny_model_copy().state_dict()
    assert any(not torch.equal(base[k], tuned[k]) for k in base)
    with pytest.raises(TrajectoryFileError, match="not found"):
        read_trajectories([tmp_path / "nope.jsonl"])


def trajectory(tid: str, resolved: bool, termination: str = "submitted", turns: int = 1):
    from patchgym.agent.trajectory import Trajectory, Turn

    turn = Turn(prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2], finish_reason="stop", close_ids=[5],
                action="x")
    return Trajectory(task_id=tid.split("#")[0], trajectory_id=tid, turns=[turn] * turns, termination=termination,
                      grade={"resolved": resolved})


def test_grpo_plus_plus_selection_masks_compact_terminations_but_keeps_them_in_the_group():
    from patchgym.rl.config import load_preset
    from patchgym.train.loop import select_training_batch

    batch = [trajectory("a#0", True), trajectory("a#1", False, "max_steps"), trajectory("a#2", False),
             trajectory("b#0", False, "infra_error")]
    filters = {}
    rewards, advantages, sequences = select_training_batch(batch, load_preset("grpo++"), 50, filters)
    assert rewards == [1.0, 0.0, 0.0]
    # rloo over all three (the masked one counts with reward 0): (R - 1/3) * 3/2
    assert advantages.tolist() == pytest.approx([1.0, 0.0, -0.5])
    assert [(s.trajectory_id, s.advantage) for s in sequences] == [("a#0", 1.0), ("a#2", -0.5)]
    assert sequences[0].loss_mask == [0, 0, 1, 1, 0]
    assert filters == {"infra_error": 1, "unvalidated_no_tests": 0,
                       "compact": {"kept": 2, "masked": 1, "masked_max_steps": 1}}


def test_flip_advantages_the_benchmark_control_trains_on_minus_a():
    from patchgym.rl.config import load_preset
    from patchgym.train.loop import select_training_batch

    batch = [trajectory("a#0", True), trajectory("a#1", False, "max_steps"), trajectory("a#2", False)]
    algo = load_preset("grpo++").model_copy(update={"flip_advantages": True})
    _, advantages, sequences = select_training_batch(batch, algo, 50, {})
    assert advantages.tolist() == pytest.approx([-1.0, 0.0, 0.5])
    assert [(s.trajectory_id, s.advantage) for s in sequences] == [("a#0", -1.0), ("a#2", 0.5)]


def test_selection_scores_a_validated_rows_no_tests_ran_0_and_leaves_out_an_unvalidated_ones_and_infra():
    from patchgym.rl.config import load_preset
    from patchgym.train.loop import select_training_batch

    batch = [trajectory("a#0", True), trajectory("a#1", False), trajectory("a#2", False), trajectory("a#3", False)]
    from patchgym.env.grading import Grade

    batch[1].grade = Grade(error="no_tests_ran", tests_known_to_run=True)  # the patch broke a suite known to run
    batch[2].grade = Grade(error="no_tests_ran", tests_known_to_run=False)  # maybe the row's fault
    batch[3].grade = Grade(error="infra")
    filters = {}
    rewards, advantages, _ = select_training_batch(batch, load_preset("grpo++"), 50, filters)
    assert rewards == [1.0, 0.0]
    assert filters["infra_error"] == 1 and filters["unvalidated_no_tests"] == 1


def test_nebius_selection_penalizes_turns_and_drops_zero_advantages():
    from patchgym.rl.config import load_preset
    from patchgym.train.loop import select_training_batch

    algo = load_preset("nebius-dapo").model_copy(update={"turn_penalty_threshold": 1, "stages": []})
    batch = [trajectory("a#0", True), trajectory("a#1", False), trajectory("c#0", False, turns=2),
             trajectory("c#1", False, turns=2)]
    filters = {}
    rewards, advantages, sequences = select_training_batch(batch, algo, 3, filters)
    assert rewards == [1.0, 0.0, -0.5, -0.5]  # (L_thr - T) / (T_max - L_thr) = (1 - 2) / (3 - 1)
    assert [(s.trajectory_id, round(s.advantage, 4)) for s in sequences] == [("a#0", 0.7071), ("a#1", -0.7071)]
    assert filters["zero_advantage"] == {"kept": 2, "dropped": 2}
    assert filters["turn_penalty"] == {"penalized": 2, "unpenalized": 2}


def test_dynamic_sampling_resamples_then_stops_at_its_bound(docker_only, tiny, tiny_task, tmp_path):
    from patchgym.rl.shaping import SamplingExhausted

    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks([tiny_task], tasks_file)
    config = tiny_config(tmp_path, tasks_file, "algorithm.dynamic_sampling=true", "algorithm.max_generation_rounds=2")
    with pytest.raises(SamplingExhausted, match="kept 0 of 1 groups in 2 rounds"):
        Trainer(config, tmp_path / "run", progress=False).run()
    ids = [json.loads(x)["trajectory_id"] for x in (tmp_path / "run" / "rollouts" / "iter-1" / "trajectories.jsonl")
           .read_text().splitlines()]
    task = tiny_task.instance_id
    assert sorted(ids) == sorted([f"{task}#0", f"{task}#1", f"round1/{task}#0", f"round1/{task}#1"])
