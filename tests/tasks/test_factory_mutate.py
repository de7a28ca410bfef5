"""The factory's pure parts: mutations edit only their node's span, diffs apply with git, ordering follows the
seed, statements never name the test, and recipes describe sdist trees."""

import ast
import subprocess
import textwrap

import pytest

from patchgym.tasks.factory.diffs import file_diff, new_file_diff
from patchgym.tasks.factory.mutate import order_mutations
from patchgym.tasks.factory.pypi.mutate import STRATEGIES, compiles, find_mutations
from patchgym.tasks.factory.pypi.sources import PypiRecipe, load_recipes
from patchgym.tasks.factory.pypi.statements import code_leading_to, failure_evidence, write_statement

SOURCE = textwrap.dedent('''\
    """A module."""


    def clamp(value, low, high):  # keep this comment
        if value < low:
            return low
        if value > high and high is not None:
            result = high
        else:
            result = value
        return result


    def pick(items, flag):
        first = max(items[1:], default=0)
        total = first + len(items)
        if flag:
            label = "yes"
        elif total == 3:
            label = "three"
        else:
            label = "no"
        return label if flag else pow(total, 2)


    def truthy(x):
        return x in (1, 2)
''')


def _mutants(strategy):
    return [m for m in find_mutations("pkg/mod.py", SOURCE) if m.strategy == strategy]


def _changed_lines(old: str, new: str) -> list[tuple[str, str]]:
    return [(a, b) for a, b in zip(old.splitlines(), new.splitlines()) if a != b]


def test_every_strategy_finds_sites_and_every_mutant_compiles():
    found = find_mutations("pkg/mod.py", SOURCE)
    assert {m.strategy for m in found} == set(STRATEGIES)
    original = ast.dump(ast.parse(SOURCE))
    for m in found:
        mutated = m.apply(SOURCE)
        assert compiles(mutated, m.path), (m, mutated)
        assert ast.dump(ast.parse(mutated)) != original, m


def test_flip_compare_rewrites_only_the_operator():
    texts = {m.apply(SOURCE) for m in _mutants("flip_compare")}
    assert SOURCE.replace("value < low", "value <= low") in texts or \
        SOURCE.replace("value < low", "value >= low") in texts
    assert SOURCE.replace("x in (1, 2)", "x not in (1, 2)") in texts
    assert SOURCE.replace("high is not None", "high is None") in texts
    for text in texts:  # one line changed, comment and layout intact
        assert len(_changed_lines(SOURCE, text)) == 1
        assert "# keep this comment" in text


def test_flip_bool_and_off_by_one():
    assert {m.apply(SOURCE) for m in _mutants("flip_bool")} == {SOURCE.replace("> high and high", "> high or high")}
    texts = {m.apply(SOURCE) for m in _mutants("off_by_one")}
    assert any("items[2:]" in t or "items[0:]" in t for t in texts)
    assert any("total == 2" in t or "total == 4" in t for t in texts)
    assert any("pow(total, 1)" in t or "pow(total, 3)" in t for t in texts)


def test_remove_cond_drops_a_guard_or_an_elif_branch():
    texts = [m.apply(SOURCE) for m in _mutants("remove_cond")]
    guard = SOURCE.replace("    if value < low:\n        return low\n", "")
    elif_branch = SOURCE.replace('    elif total == 3:\n        label = "three"\n', "")
    assert guard in texts and elif_branch in texts


def test_remove_stmt_leaves_pass_in_an_emptied_block():
    texts = [m.apply(SOURCE) for m in _mutants("remove_stmt")]
    assert SOURCE.replace("        result = high\n", "        pass\n") in texts
    assert SOURCE.replace("    total = first + len(items)\n", "") in texts
    assert not any('"""A module."""' not in t for t in texts), "docstrings are not statements to remove"


def test_invert_if_swaps_bodies_and_ternaries():
    texts = [m.apply(SOURCE) for m in _mutants("invert_if")]
    swapped = SOURCE.replace("        result = high\n    else:\n        result = value\n",
                             "        result = value\n    else:\n        result = high\n")
    assert swapped in texts
    assert SOURCE.replace("label if flag else pow(total, 2)", "pow(total, 2) if flag else label") in texts


def test_swap_args_and_change_return():
    assert SOURCE.replace("pow(total, 2)", "pow(2, total)") in [m.apply(SOURCE) for m in _mutants("swap_args")]
    texts = [m.apply(SOURCE) for m in _mutants("change_return")]
    assert SOURCE.replace("return x in (1, 2)", "return not (x in (1, 2))") in texts
    assert SOURCE.replace("    return result\n", "    return None\n") in texts


def test_unreachable_code_is_not_mutated():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    X = 1 + 2\n\n" \
             "def f(a):  # pragma: no cover\n    return a < 3\n"
    assert find_mutations("m.py", source) == []


def test_non_ascii_source_keeps_offsets_right():
    source = 'def f(s):\n    return "héllo wörld" if s == "ü" else s[1:]\n'
    for m in find_mutations("m.py", source):
        assert compiles(m.apply(source), "m.py")
    assert source.replace('s == "ü"', 's != "ü"') in [m.apply(source) for m in find_mutations("m.py", source)]


def test_order_is_fixed_by_the_seed_and_interleaves_strategies():
    found = find_mutations("pkg/mod.py", SOURCE)
    first = order_mutations(found, 7, STRATEGIES)
    assert first == order_mutations(found, 7, STRATEGIES)
    assert first != order_mutations(found, 8, STRATEGIES)
    assert sorted(first, key=repr) == sorted(found, key=repr)
    assert len({m.strategy for m in first[: len(STRATEGIES)]}) == len(STRATEGIES)


def _git_apply(tmp_path, patch: str, *args: str) -> None:
    (tmp_path / "change.diff").write_text(patch)
    subprocess.run(["git", "apply", *args, "change.diff"], cwd=tmp_path, check=True, capture_output=True)


@pytest.mark.parametrize("old", [SOURCE, SOURCE.rstrip("\n")])  # with and without a final newline
def test_bug_patch_applies_and_its_fix_restores(tmp_path, old):
    (tmp_path / "pkg").mkdir()
    target = tmp_path / "pkg" / "mod.py"
    for m in find_mutations("pkg/mod.py", old)[:40]:
        target.write_text(old)
        new = m.apply(old)
        _git_apply(tmp_path, file_diff("pkg/mod.py", old, new))
        assert target.read_text() == new
        _git_apply(tmp_path, file_diff("pkg/mod.py", new, old))
        assert target.read_text() == old


def test_new_file_diff_creates_the_file(tmp_path):
    text = "def test_one():\n    assert True\n"
    _git_apply(tmp_path, new_file_diff("tests/test_a.py", text) + new_file_diff("tests/b.py", "x = 1"))
    assert (tmp_path / "tests" / "test_a.py").read_text() == text
    assert (tmp_path / "tests" / "b.py").read_text() == "x = 1"


PYTEST_OUTPUT = """\
=================================== FAILURES ===================================
_________________________ TestClamp.test_clamp_low[3] __________________________
tests/test_clamp.py:8: in test_clamp_low
    assert clamp(1, 3, 9) == 3
E   assert 1 == 3
E    +  where 1 = clamp(1, 3, 9)
----------------------------- Captured stdout call -----------------------------
noise
_________________________________ test_other ___________________________________
tests/test_clamp.py:12: in test_other
    x = pick([1, 2], None)
        ^^^^^^^^^^^^^^^^^^
src/pkg/mod.py:22: in pick
    return label if flag else pow(total, 2)
E   TypeError: unsupported thing <pkg.Obj object at 0x7f78e8698c90>
E   see /testbed/src/pkg/mod.py line 22
=========================== short test summary info ============================
"""


def test_failure_evidence_takes_the_test_line_and_error_lines():
    ev = failure_evidence(PYTEST_OUTPUT, "tests/test_clamp.py::TestClamp::test_clamp_low[3]",
                          PypiRecipe.is_test_file, hidden=("src/pkg/mod.py",))
    assert ev == {"call": "assert clamp(1, 3, 9) == 3", "error": ["assert 1 == 3", " +  where 1 = clamp(1, 3, 9)"],
                  "where": ["tests/test_clamp.py", 8]}
    statement = write_statement(package="pkg", version="1.0", evidence=ev, seed="pkg-1.0.flip_compare.abcd1234")
    assert "`clamp(1, 3, 9)` to be `3`, but it is `1`" in statement


def test_statement_never_shows_the_test_or_the_bug_location():
    output = PYTEST_OUTPUT.replace("TestClamp.test_clamp_low[3]", "test_first")  # the section to read is the first
    output = output[output.index("_________________________________ test_other"):]
    ev = failure_evidence(output, "tests/test_clamp.py::test_other", PypiRecipe.is_test_file,
                          hidden=("src/pkg/mod.py",))
    assert ev["call"] == "x = pick([1, 2], None)"
    assert ev["error"] == ["TypeError: unsupported thing <pkg.Obj object at 0x...>"]
    statements = {write_statement(package="pkg", version="1.0", evidence=ev, seed=f"id-{i}") for i in range(12)}
    assert len(statements) > 3, "phrasings vary with the task"
    same = {"package": "pkg", "version": "1.0", "evidence": ev, "seed": "id-1"}
    assert write_statement(**same) == write_statement(**same)
    for statement in statements:
        for banned in ("test_other", "test_clamp", "tests/", "mod.py", ":22", "/testbed", "return label"):
            assert banned not in statement
        assert "raises an exception" in statement and "TypeError" in statement


def test_evidence_of_a_long_test_name_with_locals_shown():
    output = ("_ TestSet.test_contains[>=0.9,!=0.9-True] _\n"
              "tests/test_s.py:23: in test_contains\n    assert spec.contains(version) == expected\n"
              "E   AssertionError: assert False == True\n        expected   = True\n"
              "==== short test summary info ====\n")
    ev = failure_evidence(output, "tests/test_s.py::TestSet::test_contains[>=0.9,!=0.9-True]", PypiRecipe.is_test_file)
    assert ev["error"] == ["AssertionError: assert False == True"] and ev["where"] == ["tests/test_s.py", 23]


def test_evidence_is_none_when_every_error_line_names_the_test():
    output = ("____ test_a ____\ntests/test_m.py:3: in test_a\n    helper()\n"
              "E   AssertionError: test_a failed\n==== end ====\n")
    assert failure_evidence(output, "tests/test_m.py::test_a", PypiRecipe.is_test_file) is None


def test_recipes_load_and_describe_their_commands(tmp_path):
    recipes = load_recipes()
    assert len(recipes) >= 10
    assert all(r.version and r.timeout > 0 for r in recipes.values())
    recipe = PypiRecipe(name="demo", version="1.0", src="src", packages=["src/demo"], exclude=["src/demo/_data.py"],
                        tests=["tests"], pytest_args=["-o", "addopts="])
    assert recipe.test_cmd() == "pytest -p no:cacheprovider --rootdir=/testbed --continue-on-collection-errors " \
                                "-o addopts= tests"
    assert recipe.test_cmd(["tests/test_a.py::test_x[a b]"]).endswith("'tests/test_a.py::test_x[a b]'")
    for path in ("src/demo/__init__.py", "src/demo/_data.py", "src/demo/tests/test_x.py", "src/demo/conftest.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x = 1\n")
    assert list(recipe.source_files(tmp_path)) == ["src/demo/__init__.py"]


TEST_SOURCE = textwrap.dedent('''\
    class TestClamp:
        def test_clamp_low(self, n):
            """Clamping below."""
            text = """
            a long string
            """
            low = 3
            for high in range(5, 20):
                value = clamp(1, low, high)
                assert value == 3, "test_clamp_low"
                assert value > 0
''')


def test_code_leading_to_shows_whole_statements_before_the_failing_one():
    code = code_leading_to(TEST_SOURCE, 9, ["test_clamp_low", "TestClamp"])
    assert code.splitlines()[0] == 'text = """', "starts at a statement, after the docstring"
    assert code.splitlines()[-1] == "    value = clamp(1, low, high)", "inside its loop"
    assert "def " not in code and "test_clamp_low" not in code
    assert code_leading_to(TEST_SOURCE, 11, ["test_clamp_low"]).endswith("assert value > 0")
    assert code_leading_to(TEST_SOURCE, 1, []) == ""
    long = TEST_SOURCE.replace("a long string", "\n".join(["line"] * 8))
    assert code_leading_to(long, 17, []).splitlines()[0] == "low = 3", "never starts inside a string"
    decorated = "def test_d():\n    x = [\n" + "        1,\n" * 6 + "    ]\n    @decorate\n    class Local:\n" \
                "        pass\n    assert Local() == x\n"
    assert code_leading_to(decorated, 13, []).splitlines()[0] == "@decorate", "a class keeps its decorator"
