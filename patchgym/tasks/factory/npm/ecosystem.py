"""The npm ecosystem: published tarballs that ship their tape tests, mutated through tree-sitter's JavaScript parser,
their suite run and graded through patchgym's tape reporter, their failures shown from tape's own TAP output."""

from pathlib import Path

from patchgym.env.grading import report, tape
from patchgym.env.grading.families.tape_report import TapeReport
from patchgym.sandbox import Sandbox
from patchgym.tasks.factory.ecosystem import ECOSYSTEMS, Ecosystem, Fetched, SuiteTimeout
from patchgym.tasks.factory.hidden import Protected
from patchgym.tasks.factory.mutate import Mutation
from patchgym.tasks.factory.npm.mutate import STRATEGIES, find_mutations, parses
from patchgym.tasks.factory.npm.sources import NpmRecipe, fetch_package, image_recipe, load_npm_recipes
from patchgym.tasks.factory.npm.statements import code_leading_to, failure_in_tap, write_statement
from patchgym.tasks.factory.records import SuiteRun
from patchgym.tasks.factory.sources import WORKDIR

_SCANNED = (".js", ".cjs", ".mjs", ".json")  # the files whose copies the image must not hold


@ECOSYSTEMS.register("npm")
class NpmEcosystem(Ecosystem):
    grading, log_parser = TapeReport.name, TapeReport.log_parser
    strategies = STRATEGIES

    def recipes(self) -> dict[str, NpmRecipe]:
        return load_npm_recipes()

    def fetch(self, recipe: NpmRecipe) -> Fetched:
        tree, modules = fetch_package(recipe)
        return Fetched(tree, image_recipe(recipe, tree, modules))

    def find_mutations(self, path: str, text: str) -> list[Mutation]:
        return find_mutations(path, text)

    def parses(self, text: str, path: str) -> bool:
        return parses(text, path)

    def protected(self, recipe: NpmRecipe, tree: Path, mutations: list[Mutation]) -> Protected:
        """Its test files, its source files that a bug may change, any node_modules/NAME of it, its tarballs."""
        mutated = {m.path for m in mutations}
        files = {p.relative_to(tree).as_posix(): p for p in tree.rglob("*") if p.is_file() and p.suffix in _SCANNED}
        kept = {rel: path.read_text(encoding="utf-8", errors="replace") for rel, path in files.items()
                if recipe.is_test_file(rel) or rel in mutated}
        return Protected(kept, [recipe.name], [f"{recipe.name}-"], kind="npm")

    def run_suite(self, sandbox: Sandbox, recipe: NpmRecipe) -> SuiteRun:
        """The whole suite by test id, as the grader runs it (the agent's user, the reporter's records through the
        side channel)."""
        command = tape.tape_command(recipe.test_cmd(), tape.install_tape_reporter(sandbox))
        result = report.run_reported(sandbox, command, WORKDIR, recipe.timeout, 65536)
        if result.timed_out:
            raise SuiteTimeout(f"the suite ran over {recipe.timeout:g} s")
        return SuiteRun(report.read_report(result), report.read_durations(result))

    def show_failure(self, sandbox: Sandbox, recipe: NpmRecipe, test: str, bug_path: str) -> dict | None:
        """The test's file alone (tape's own TAP output): its failed assertion (operator, expected, actual) and the
        code that leads to it, from the test file at the failing line."""
        file, _, name = test.partition("::")
        result = sandbox.exec(["node", file], cwd=WORKDIR, timeout=recipe.timeout, output_limit=262144)
        failure = failure_in_tap(result.output, name)
        if failure is None or Path(failure["at"][0]).name != Path(file).name:
            return None
        source = sandbox.read_file(f"{WORKDIR}/{file}").decode("utf-8", errors="replace")
        code = code_leading_to(source, failure["at"][1])
        if not code:
            return None
        return {"code": code, **{k: failure.get(k, "") for k in ("operator", "expected", "actual")}}

    def statement(self, recipe: NpmRecipe, tree: Path, evidence: dict, seed: str) -> str:
        return write_statement(package=recipe.name, version=recipe.version, evidence=evidence, seed=seed,
                               code=evidence["code"])
