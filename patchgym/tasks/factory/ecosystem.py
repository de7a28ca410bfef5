"""A task ecosystem: one kind of package the factory makes tasks from (PyPI sdists tested by pytest, npm tarballs
tested by tape), as an object that the one procedure (patchgym.tasks.factory.build) takes, registered by name.

    @ECOSYSTEMS.register("crates")
    class CratesEcosystem(Ecosystem):
        grading, log_parser = "...", "..."
        strategies = ("flip_compare", ...)
        def recipes(self): ...  # and each other abstract method

An ecosystem says where its packages come from and what image holds each, where a bug may go and whether a mutant
still parses, what an image must not hold twice, how the suite runs and reports, what one failing test shows and how
that becomes the statement, and how its tasks are graded; the procedure does the rest in the same way for all.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from patchgym.errors import UserError
from patchgym.registry import Registry, UnknownName
from patchgym.sandbox import Sandbox
from patchgym.sandbox.images import ImageRecipe
from patchgym.tasks.factory.diffs import new_file_diff
from patchgym.tasks.factory.hidden import Protected
from patchgym.tasks.factory.mutate import Mutation
from patchgym.tasks.factory.records import Baseline, Bug, Outcome, SuiteRun
from patchgym.tasks.task import Task


class Recipe(Protocol):
    """One package of an ecosystem: which version, what may be mutated, how its tests run."""

    name: str
    version: str
    timeout: float  # seconds one run of the whole suite may take

    @property
    def key(self) -> str:
        """Unique across ecosystems: it names the package's folder in the build and starts its tasks' ids."""

    def test_cmd(self, targets: list[str] | None = None) -> str:
        """The command that runs the suite (or the tests `targets`, by id) in the workspace."""

    def is_test_file(self, path: str) -> bool:
        """Whether `path` (relative to the package's root) holds tests."""

    def source_files(self, tree: Path) -> dict[str, str]:
        """The files mutations may change (path -> text) in the unpacked package `tree`."""


@dataclass(frozen=True)
class Fetched:
    """A package's clean source unpacked on the host, and the recipe of the image that holds it at WORKDIR."""

    tree: Path
    image: ImageRecipe


class SuiteTimeout(Exception):
    """A run of the suite took longer than its recipe's timeout."""


class Ecosystem(ABC):
    """The parts of the factory that differ between kinds of package. A subclass sets the class attributes,
    fills in every abstract method, and is registered with `@ECOSYSTEMS.register(NAME)`; `patchgym tasks build
    --ecosystem NAME` and `build_tasks(..., ecosystem=NAME)` then use it."""

    grading: ClassVar[str]  # the grading family of this ecosystem's tasks (Task.grading, patchgym.env.grading.family)
    log_parser: ClassVar[str]  # how that family reads the suite (Task.log_parser)
    strategies: ClassVar[tuple[str, ...]]  # every strategy find_mutations names; the seed interleaves them

    @abstractmethod
    def recipes(self) -> dict[str, Recipe]:
        """Every package this ecosystem can make tasks from, by name."""

    @abstractmethod
    def fetch(self, recipe: Recipe) -> Fetched:
        """The package's clean source and its image's recipe (downloaded on first use; the procedure builds it)."""

    @abstractmethod
    def find_mutations(self, path: str, text: str) -> list[Mutation]:
        """Every site of the source file at `path` where a strategy applies."""

    @abstractmethod
    def parses(self, text: str, path: str) -> bool:
        """Whether a mutant of the file at `path` still parses; one that does not is dropped before anything runs."""

    @abstractmethod
    def protected(self, recipe: Recipe, tree: Path, mutations: list[Mutation]) -> Protected:
        """What the package's image must not let the agent read twice (hidden.check_hidden refuses it)."""

    @abstractmethod
    def run_suite(self, sandbox: Sandbox, recipe: Recipe) -> SuiteRun:
        """The whole suite in the workspace, run as the grader runs it; SuiteTimeout, or
        patchgym.env.grading.report.ReportMissing when it did not run."""

    @abstractmethod
    def show_failure(self, sandbox: Sandbox, recipe: Recipe, test: str, bug_path: str) -> dict | None:
        """What the failing `test`, run alone, shows of what went wrong (the statement's material), naming neither
        the test nor `bug_path` (the bug's file); None when it shows nothing usable."""

    @abstractmethod
    def statement(self, recipe: Recipe, tree: Path, evidence: dict, seed: str) -> str:
        """The problem statement of a bug from its `evidence` (show_failure's, with the test under "test");
        `seed` (the task's id) picks the phrasing."""

    def task_row(self, recipe: Recipe, image_tag: str, tree: Path, bug: Bug, outcome: Outcome,
                 base: Baseline) -> Task:
        """A kept bug as a task: the test files of its failing tests are hidden (the grader writes them back)."""
        instance_id = f"{recipe.key}.{outcome.strategy}.{outcome.id}"
        test_files = sorted({t.split("::", 1)[0] for t in outcome.fail_to_pass})
        test_patch = "".join(new_file_diff(p, (tree / p).read_text(encoding="utf-8")) for p in test_files)
        return Task(
            instance_id=instance_id, repo=recipe.name, version=recipe.version, image=image_tag,
            problem_statement=self.statement(recipe, tree, outcome.evidence, instance_id),
            FAIL_TO_PASS=outcome.fail_to_pass, PASS_TO_PASS=outcome.pass_to_pass, bug_patch=bug.bug_patch,
            patch=bug.patch, test_files=test_files, test_patch=test_patch, test_cmd=recipe.test_cmd(),
            test_seconds=base.seconds_of(test_files), log_parser=self.log_parser,
            grading=self.grading, source="factory",
            strategy=outcome.strategy, created_at=outcome.created_at,
        )


ECOSYSTEMS: Registry[type[Ecosystem]] = Registry("task ecosystem")


def ecosystem_named(name: str) -> Ecosystem:
    """The ecosystem registered as `name`; a UserError that lists the known ones where there is none."""
    try:
        return ECOSYSTEMS[name]()
    except UnknownName as exc:
        raise UserError(str(exc)) from None
