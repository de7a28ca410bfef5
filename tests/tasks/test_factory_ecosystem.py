"""A third ecosystem through the factory's public seams alone: a toy one, defined here (a two-function package whose
"registry" is a dict, its bugs a flipped sign found by a regular expression, its failures pytest's `E` lines),
registered by name, built into tasks by the one procedure, and graded by the public grader: gold resolves, the empty
patch does not. Registering it touches no patchgym file, and the registration ends with the test."""

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from patchgym.env.grading import report
from patchgym.env.grading.grader import grade_patch
from patchgym.errors import UserError
from patchgym.sandbox import SandboxConfig, images
from patchgym.tasks import read_tasks
from patchgym.tasks.factory import (
    ECOSYSTEMS,
    WORKDIR,
    Ecosystem,
    Fetched,
    Mutation,
    Protected,
    SuiteRun,
    SuiteTimeout,
    build_tasks,
    ecosystem_named,
)

TOY = "toy"
PACKAGE = {
    "calc/__init__.py": "from calc.ops import add, sub\n",
    "calc/ops.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "tests/__init__.py": "",  # so pytest puts the workspace on sys.path and `import calc` works
    "tests/test_add.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "tests/test_sub.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n",
}
_SIGN = re.compile(r"(?<= )[+-](?= )")


@dataclass(frozen=True)
class ToyRecipe:
    name: str
    version: str
    files: dict[str, str]  # what the toy's registry serves: the package, tests included
    timeout: float = 60

    @property
    def key(self) -> str:
        return f"toy-{self.name}-{self.version}"

    def test_cmd(self, targets: list[str] | None = None) -> str:
        return shlex.join(["pytest", "-p", "no:cacheprovider", *(targets or ["tests"])])

    def is_test_file(self, path: str) -> bool:
        return path.startswith("tests/")

    def source_files(self, tree: Path) -> dict[str, str]:
        return {p: (tree / p).read_text() for p in self.files if p.endswith(".py") and not self.is_test_file(p)}


class ToyEcosystem(Ecosystem):
    grading, log_parser = "pytest-report", "patchgym_report"  # pytest suites: the grader's report plugin reads them
    strategies = ("flip_sign",)
    sources: Path  # where fetch unpacks packages; set by the fixture

    def recipes(self) -> dict[str, ToyRecipe]:
        return {"calc": ToyRecipe("calc", "1.0", PACKAGE)}

    def fetch(self, recipe: ToyRecipe) -> Fetched:
        tree = self.sources / recipe.key
        for path, text in recipe.files.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(text)
        return Fetched(tree, images.layer_recipe(f"patchgym/toy-{recipe.name}-{recipe.version}",
                                                 files=((tree, WORKDIR),)))

    def find_mutations(self, path: str, text: str) -> list[Mutation]:
        return [Mutation(path, "flip_sign", m.start(), m.end(), "-" if m.group() == "+" else "+",
                         text.count("\n", 0, m.start()) + 1) for m in _SIGN.finditer(text)]

    def parses(self, text: str, path: str) -> bool:
        try:
            ast.parse(text)
        except SyntaxError:
            return False
        return True

    def protected(self, recipe: ToyRecipe, tree: Path, mutations: list[Mutation]) -> Protected:
        return Protected({p: t for p, t in recipe.files.items() if p.endswith(".py")}, ["calc"])

    def run_suite(self, sandbox, recipe: ToyRecipe) -> SuiteRun:
        plugin = report.install_report_plugin(sandbox, strict=True)
        command = report.pytest_command(f"{recipe.test_cmd()} {report.FACTORY_ARGS}", plugin,
                                        report.installed_plugins(sandbox, WORKDIR))
        run = report.run_reported(sandbox, command, WORKDIR, recipe.timeout)
        if run.timed_out:
            raise SuiteTimeout(f"the suite ran over {recipe.timeout:g} s")
        return SuiteRun(report.read_report(run), report.read_durations(run))

    def show_failure(self, sandbox, recipe: ToyRecipe, test: str, bug_path: str) -> dict | None:
        run = sandbox.exec(f"{recipe.test_cmd([test])} -q --tb=short", cwd=WORKDIR, timeout=recipe.timeout)
        name = test.rsplit("::", 1)[-1]
        error = [line[1:].strip() for line in run.output.splitlines()
                 if line.startswith("E ") and name not in line and bug_path not in line]
        return {"error": error} if error else None

    def statement(self, recipe: ToyRecipe, tree: Path, evidence: dict, seed: str) -> str:
        return f"`{recipe.name}` {recipe.version} gets this wrong:\n\n```\n" + "\n".join(evidence["error"]) + "\n```\n"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy ecosystem's name, registered for this test only."""
    monkeypatch.setattr(ToyEcosystem, "sources", tmp_path / "sources", raising=False)
    ECOSYSTEMS.register(TOY)(ToyEcosystem)
    yield TOY
    del ECOSYSTEMS[TOY]


def test_an_ecosystem_is_found_by_its_registered_name_and_an_unknown_one_lists_the_known(toy):
    assert isinstance(ecosystem_named(toy), ToyEcosystem)
    with pytest.raises(ValueError, match="registered twice"):
        ECOSYSTEMS.register(toy)(ToyEcosystem)
    with pytest.raises(UserError, match="unknown task ecosystem 'crates'; known: npm, pypi, toy"):
        ecosystem_named("crates")


def test_a_toy_ecosystem_builds_tasks_that_the_grader_grades(toy, ready_backend, tmp_path):
    backend = ready_backend("docker")
    result = build_tasks(["calc"], 2, seed=0, out_dir=tmp_path / "out", ecosystem=toy, backend=backend,
                         progress=False)
    tasks = read_tasks(tmp_path / "out" / "tasks.jsonl")
    assert result.ecosystem == toy and result.tasks == len(tasks) == 2, result.packages
    assert {t.FAIL_TO_PASS[0] for t in tasks} == {"tests/test_add.py::test_add", "tests/test_sub.py::test_sub"}
    config = SandboxConfig(backend=backend)
    for task in tasks:
        assert task.instance_id.startswith("toy-calc-1.0.flip_sign.") and task.source == "factory"
        assert task.grading == "pytest-report" and task.log_parser == "patchgym_report"
        assert "gets this wrong" in task.problem_statement
        assert task.test_files == [task.FAIL_TO_PASS[0].split("::")[0]] and task.PASS_TO_PASS
        assert grade_patch(task, task.patch, config, timeout=120).resolved
        assert not grade_patch(task, "", config, timeout=120).resolved
