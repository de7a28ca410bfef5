"""The PyPI ecosystem: sdists that ship their pytest suite, mutated through Python's AST, their suite run and graded
through patchgym's pytest report plugin, their failures shown from pytest's short tracebacks."""

from pathlib import Path

from patchgym.env.grading import report
from patchgym.env.grading.families.pytest_report import PytestReport
from patchgym.sandbox import Sandbox
from patchgym.tasks.factory.ecosystem import ECOSYSTEMS, Ecosystem, Fetched, SuiteTimeout
from patchgym.tasks.factory.hidden import Protected
from patchgym.tasks.factory.mutate import Mutation
from patchgym.tasks.factory.pypi.mutate import STRATEGIES, compiles, find_mutations
from patchgym.tasks.factory.pypi.sources import PypiRecipe, fetch_source, image_recipe, load_recipes
from patchgym.tasks.factory.pypi.statements import code_leading_to, failure_evidence, names_of_test, write_statement
from patchgym.tasks.factory.records import SuiteRun
from patchgym.tasks.factory.sources import WORKDIR


@ECOSYSTEMS.register("pypi")
class PypiEcosystem(Ecosystem):
    grading, log_parser = PytestReport.name, PytestReport.log_parser
    strategies = STRATEGIES

    def recipes(self) -> dict[str, PypiRecipe]:
        return load_recipes()

    def fetch(self, recipe: PypiRecipe) -> Fetched:
        tree = fetch_source(recipe)
        return Fetched(tree, image_recipe(recipe, tree))

    def find_mutations(self, path: str, text: str) -> list[Mutation]:
        return find_mutations(path, text)

    def parses(self, text: str, path: str) -> bool:
        return compiles(text, path)

    def protected(self, recipe: PypiRecipe, tree: Path, mutations: list[Mutation]) -> Protected:
        """Its test files, its source files that a bug may change, its import names, its archives."""
        files = {p.relative_to(tree).as_posix(): p for p in tree.rglob("*.py") if p.is_file()}
        mutated = {m.path for m in mutations}
        kept = {rel: path.read_text(encoding="utf-8", errors="replace") for rel, path in files.items()
                if recipe.is_test_file(rel) or rel in mutated}
        src = tree / recipe.src
        names = sorted(p.name for p in src.iterdir() if (p / "__init__.py").is_file() and not recipe.is_test_file(
            p.name + "/")) + sorted(p.name for p in src.glob("*.py") if p.stem not in ("setup", "conftest")
                                    and not recipe.is_test_file(p.name))
        dist = recipe.name.replace("-", "_")
        return Protected(kept, names, sorted({f"{recipe.name}-", f"{dist}-"}))

    def run_suite(self, sandbox: Sandbox, recipe: PypiRecipe) -> SuiteRun:
        """The whole suite by node id, as the grader runs it (the agent's user, pytest's report through the side
        channel, strict); only tests in test files count (doctests in source modules are no tests to hide)."""
        plugins = report.installed_plugins(sandbox, WORKDIR)
        plugin = report.install_report_plugin(sandbox, strict=True)
        command = report.pytest_command(f"{recipe.test_cmd()} -q {report.FACTORY_ARGS}", plugin, plugins)
        result = report.run_reported(sandbox, command, WORKDIR, recipe.timeout, 65536)
        if result.timed_out:
            raise SuiteTimeout(f"the suite ran over {recipe.timeout:g} s")
        statuses = report.read_report(result)
        kept = {t: s for t, s in statuses.items() if recipe.is_test_file(t.split("::", 1)[0])}
        return SuiteRun(kept, {t: s for t, s in report.read_durations(result).items() if t in kept})

    def show_failure(self, sandbox: Sandbox, recipe: PypiRecipe, test: str, bug_path: str) -> dict | None:
        """The test alone with a short traceback: its failing call and error lines (failure_evidence)."""
        result = sandbox.exec(f"{recipe.test_cmd([test])} -q --tb=short", cwd=WORKDIR, timeout=recipe.timeout,
                              output_limit=65536)
        if result.timed_out:
            return None
        return failure_evidence(result.output, test, recipe.is_test_file, hidden=(bug_path,))

    def statement(self, recipe: PypiRecipe, tree: Path, evidence: dict, seed: str) -> str:
        """The failing call, with the lines of its test function before it where the failure says where it is."""
        code = ""
        if evidence.get("where"):
            path, line = evidence["where"]
            code = code_leading_to((tree / path).read_text(encoding="utf-8"), line, names_of_test(evidence["test"]))
        return write_statement(package=recipe.name, version=recipe.version, evidence=evidence, seed=seed, code=code)
