"""The classic harness worker as a long-lived process: one per patchgym process, many requests, no state carried from
one row to the next, replaced when it dies. (The real venv and worker; each test pays one worker start.)"""

import os
import signal

from patchgym.env.grading import harness_venv
from patchgym.tasks.specs import classic_row
from tests.tasks.test_loaders import swebench_row


def test_one_worker_answers_many_requests_and_a_rows_install_config_stays_with_that_row():
    row = classic_row(swebench_row())  # a repo and version swebench 4.1.0's table holds
    custom = row | {"install_config": {"python": "3.11", "install": "pip install -e .",
                                       "test_cmd": "pytest -rA --custom-flag", "log_parser": "parse_log_pytest"}}
    (rebench,) = harness_venv._ask("rebench", [custom])
    worker = harness_venv._worker.process.pid
    (classic,) = harness_venv._ask("classic", [row])
    assert harness_venv._worker.process.pid == worker
    assert "--custom-flag" in rebench["spec"]["eval_script"]
    assert "--custom-flag" not in classic["spec"]["eval_script"]  # the table entry is the table's again


def test_a_worker_that_died_is_replaced_and_a_failing_one_is_reported():
    row = classic_row(swebench_row())
    harness_venv._ask("classic", [row])
    dead = harness_venv._worker.process.pid
    os.kill(dead, signal.SIGKILL)
    harness_venv._worker.process.wait()
    (answer,) = harness_venv._ask("classic", [row])
    assert "spec" in answer and harness_venv._worker.process.pid != dead
    (bad,) = harness_venv._ask("smith_grade", [{"instance_id": "x", "repo": "swesmith/nobody__nothing.1"}])
    assert bad == {"error": "swesmith knows no repo profile 'swesmith/nobody__nothing.1'"}
