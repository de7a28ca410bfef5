"""The viewer's data: an index of a run's trajectories (one row each, with where its JSON line lies), refreshed
incrementally while the run is still appending, and the detail view of one trajectory read back from its line."""

import json
import threading
from pathlib import Path

from patchgym.report.runs import iter_jsonl, read_json, run_kind, split_action, trajectory_facts, trajectory_files

ROW_KEYS = ("trajectory_id", "task_id", "iteration", "resolved", "termination", "steps", "tokens", "seconds")


class TrajectoryIndex:
    """Rows for the table, in first-written order; a trajectory written again (rerun on resume) keeps its row."""

    def __init__(self, run: str | Path):
        self.run = Path(run)
        self.kind = run_kind(self.run)
        self._lock = threading.Lock()
        self._scanned: dict[Path, int] = {}  # bytes of each file already indexed
        self._row_of: dict[tuple, int] = {}
        self._rows: list[dict] = []
        self._where: list[tuple[Path, int]] = []

    def rows(self) -> list[dict]:
        with self._lock:
            for iteration, path in trajectory_files(self.run):
                start = self._scanned.get(path, 0)
                if path.stat().st_size < start:  # rewritten (a cut tail dropped): index it again
                    start = 0
                for offset, end, record in iter_jsonl(path, start):
                    if record is not None:
                        self._add(iteration, path, offset, record)
                    start = end
                self._scanned[path] = start
            return list(self._rows)

    def _add(self, iteration: int | None, path: Path, offset: int, record: dict) -> None:
        facts = trajectory_facts(record, iteration)
        key = (iteration, facts["trajectory_id"])
        n = self._row_of.setdefault(key, len(self._rows))
        row = {"id": n, **{k: facts[k] for k in ROW_KEYS},
               "grade_error": (record.get("grade") or {}).get("error") or record.get("error")}
        if n == len(self._rows):
            self._rows.append(row)
            self._where.append((path, offset))
        else:
            self._rows[n], self._where[n] = row, (path, offset)

    def trajectory(self, n: int) -> dict | None:
        """The detail view of row `n`, or None when there is no such row."""
        with self._lock:
            if not 0 <= n < len(self._where):
                return None
            path, offset = self._where[n]
            row = self._rows[n]
        with open(path, "rb") as f:
            f.seek(offset)
            record = json.loads(f.readline())
        return {**row, **detail(record)}

    def about(self) -> dict:
        summary = read_json(self.run / "summary.json") or {}
        return {"run": str(self.run.resolve()), "name": self.run.resolve().name, "kind": self.kind,
                "summary": {k: v for k, v in summary.items() if isinstance(v, (int, float, str)) and k != "model"}}


def detail(record: dict) -> dict:
    """What the page shows of one trajectory: the task prompt, each turn split into thought and tool call, the
    patch, and the grade per test."""
    messages = record.get("messages") or []
    prompt = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    turns = []
    for n, turn in enumerate(record.get("turns") or [], 1):
        thought, call = split_action(turn.get("action") or "", turn.get("tool_call") is not None)
        turns.append({"n": n, "thought": thought.strip(), "call": call.strip(), "tool_call": turn.get("tool_call"),
                      "format_error": bool(turn.get("format_error")), "observation": turn.get("observation") or "",
                      "exit_code": turn.get("exit_code"), "sampled_tokens": len(turn.get("completion_ids") or []),
                      "finish_reason": turn.get("finish_reason"), "generate_s": turn.get("generate_s") or 0.0,
                      "step_s": turn.get("step_s") or 0.0})
    grade = record.get("grade") or {}
    return {"sample": record.get("sample"), "engine": record.get("engine") or {}, "error": record.get("error"),
            "prompt": prompt, "turns": turns, "patch": record.get("patch") or "", "grade": grade_view(grade)}


def grade_view(grade: dict) -> dict:
    """The grade with its tests grouped: FAIL_TO_PASS, PASS_TO_PASS, and the other tests that ran."""
    tests = grade.get("tests") or {}
    f2p, p2p = grade.get("f2p") or {}, grade.get("p2p") or {}
    other = {name: status for name, status in tests.items() if name not in f2p and name not in p2p}
    return {"resolved": bool(grade.get("resolved")), "error": grade.get("error"),
            "error_detail": grade.get("error_detail") or "", "duration": grade.get("duration"),
            "groups": [{"name": name, "tests": group} for name, group in
                       (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p), ("other tests", other)) if group]}
