"""Structured tape results for JavaScript tasks: patchgym's tape reporter (tape_report.js) installed where the tests
can read it but not change it, under a name that says nothing, writing the pytest plugin's record format to the side
channel only the sandbox's runner holds (patchgym.env.grading.report reads both). Printed TAP lines never count.

A task's test command is tape's own (`tape test/*.js`); the grader runs the same files under the reporter instead.
"""

import shlex
from pathlib import Path

from patchgym.env.grading.report import SIDE_CHANNEL_FD, neutral_name
from patchgym.errors import UserError
from patchgym.sandbox import Sandbox

REPORTER_SOURCE = (Path(__file__).parent / "tape_report.js").read_text()
_OLD_REPORTER = "/opt/patchgym/grader/patchgym_tape.js"  # rows built before the side channel name it and a report


def reporter_source(target: int | str = SIDE_CHANNEL_FD) -> str:
    """The reporter's source set to write to `target` (a descriptor, or a file path)."""
    return REPORTER_SOURCE.replace("\nvar TARGET = 3;", f"\nvar TARGET = {target!r};".replace("'", '"'), 1)


def install_tape_reporter(sandbox: Sandbox) -> str:
    """Write the reporter, set to the side channel, into a fresh root-owned directory of `sandbox` that any user can
    read, both named at random; returns its path."""
    directory = f"/tmp/{neutral_name()}"
    sandbox.exec(["mkdir", "-m", "755", directory])
    path = f"{directory}/{neutral_name()}.js"
    sandbox.write_file(path, reporter_source(), mode=0o644)
    return path


def test_targets(test_cmd: str) -> list[str]:
    """The test files (shell globs) of a task's tape command: `tape FILE...`, or a row made before the side channel
    (`node .../patchgym_tape.js REPORT FILE...`)."""
    words = shlex.split(test_cmd)
    if words[:1] == ["tape"] and len(words) > 1:
        return words[1:]
    if words[:2] == ["node", _OLD_REPORTER] and len(words) > 3:
        return words[3:]
    raise UserError(f"a JavaScript task's test command must be `tape FILE...`, not {test_cmd!r}")


def tape_command(test_cmd: str, reporter: str) -> str:
    """The command that runs `test_cmd`'s files under the reporter at `reporter` (globs left to the shell)."""
    return f"node {shlex.quote(reporter)} {' '.join(test_targets(test_cmd))}"
