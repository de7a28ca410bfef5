"""The one trajectory reader: files and run directories, a cut last line left out and reported, duplicates resolved
by one rule, bad lines named by file and line."""

import logging

import pytest

from patchgym.agent.trajectory import Trajectory
from patchgym.agent.trajectory_files import TrajectoryFileError, files_of, read_file, read_trajectories
from patchgym.rollout import TrajectoryStore


def record(tid: str, **fields) -> str:
    return Trajectory(task_id=tid.split("#")[0], trajectory_id=tid, termination="submitted", **fields).model_dump_json()


def test_the_last_record_of_a_trajectory_wins_in_the_place_of_the_first(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text("\n".join([record("a#0", seconds=1), record("b#0"), record("a#0", seconds=2)]) + "\n")
    read = read_file(path)
    assert [(t.trajectory_id, t.seconds) for t in read.trajectories] == [("a#0", 2.0), ("b#0", 0.0)]
    assert read.replaced == 1 and read.cut_at is None
    assert [t.seconds for t in TrajectoryStore(path).records()] == [2.0, 0.0]  # the store reads the same way


def test_a_cut_last_line_is_left_out_and_reported(tmp_path, caplog):
    path = tmp_path / "trajectories.jsonl"
    whole = record("a#0") + "\n"
    path.write_text(whole + record("b#0")[:40])
    assert read_file(path).cut_at == len(whole)
    with caplog.at_level(logging.WARNING):
        assert [t.trajectory_id for t in read_trajectories(path)] == ["a#0"]
    assert "cut" in caplog.text and str(path) in caplog.text


def test_a_bad_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text(record("a#0") + "\n{\"not\": \"a trajectory\"}\n" + record("b#0") + "\n")
    with pytest.raises(TrajectoryFileError, match=rf"{path}:2: not a trajectory record"):
        read_trajectories(path)
    with pytest.raises(TrajectoryFileError, match="not found"):
        read_trajectories(tmp_path / "nope.jsonl")
    (tmp_path / "empty-run").mkdir()
    with pytest.raises(TrajectoryFileError, match="no trajectories in"):
        read_trajectories(tmp_path / "empty-run")


def test_a_run_directory_means_its_file_and_every_iteration(tmp_path):
    for n in (2, 10, 1):
        (tmp_path / "rollouts" / f"iter-{n}").mkdir(parents=True)
        (tmp_path / "rollouts" / f"iter-{n}" / "trajectories.jsonl").write_text(record(f"t{n}#0") + "\n")
    (tmp_path / "single.json").write_text(record("s#0"))
    assert [n for n, _ in files_of(tmp_path)] == [1, 2, 10]
    got = read_trajectories([tmp_path, tmp_path / "single.json"])
    assert [t.trajectory_id for t in got] == ["t1#0", "t2#0", "t10#0", "s#0"]
