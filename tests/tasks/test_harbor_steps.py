"""Multi-step Harbor task folders (fast tier: no image is built): the Harbor cookbook's recipe read into its steps,
the tests each step's verifier gets, what a step inherits from the task, an error naming the file and the key for
every problem of a step, and the round trip through export."""

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from patchgym.sandbox import SandboxConfig
from patchgym.tasks.harbor import importer
from patchgym.tasks.harbor.export import write_back
from patchgym.tasks.harbor.folders import HarborTaskError, read_folder, unpack
from patchgym.tasks.task import HarborArtifact, HarborHealthcheck, HarborSpec

FIXTURES = Path(__file__).parents[1] / "fixtures" / "harbor"
RECIPE = FIXTURES / "cookbook-multi-step"


def files(data: str, dest: Path) -> dict[str, str]:
    """An archive's files and their text."""
    unpack(data, dest)
    return {p.relative_to(dest).as_posix(): p.read_text() for p in sorted(dest.rglob("*")) if p.is_file()}


@pytest.fixture
def recipe(tmp_path):
    out = tmp_path / "cookbook-multi-step"
    shutil.copytree(RECIPE, out)
    return out


@pytest.fixture
def stubbed_build(monkeypatch):
    """to_task without an image build: every folder's image is one tag."""
    monkeypatch.setattr(importer, "build_image",
                        lambda folder, sandbox, client=None, offline=False: "patchgym/harbor-x:1")


def test_the_cookbook_recipe_reads_into_its_three_steps(tmp_path):
    task = read_folder(RECIPE)
    assert [s.name for s in task.steps] == ["scaffold", "implement", "document"]
    scaffold, implement, document = task.steps
    assert task.instruction == scaffold.instruction and scaffold.instruction.startswith("Create an executable bash")
    assert task.task_instruction == "" and task.multi_step_reward == "mean" and task.schema_version == "1.1"
    assert task.artifacts == [HarborArtifact(source="/app/greet.sh")]
    assert files(task.tests, tmp_path / "shared") == {"helpers.sh": (RECIPE / "tests" / "helpers.sh").read_text()}
    for step in task.steps:
        tests = files(step.tests, tmp_path / step.name / "tests")
        assert tests["helpers.sh"] == (RECIPE / "tests" / "helpers.sh").read_text()
        assert tests["test.sh"] == (RECIPE / "steps" / step.name / "tests" / "test.sh").read_text()
        assert "solve.sh" in files(step.solution, tmp_path / step.name / "solution")
    assert "expected.txt" in files(implement.tests, tmp_path / "implement" / "tests2")
    assert sorted(files(implement.workdir, tmp_path / "workdir")) == ["config.txt", "setup.sh"]
    assert (tmp_path / "workdir" / "setup.sh").stat().st_mode & 0o111  # still executable
    assert scaffold.workdir == document.workdir == ""
    assert [(s.agent_timeout_s, s.verifier_timeout_s) for s in task.steps] == [(60, 30), (90, 30), (60, 30)]
    assert implement.verifier_env == {"EXPECTED_NAME": "Harbor", "EXPECTED_GREETING": "Hello, Harbor!"}
    assert scaffold.verifier_env == document.verifier_env == {}
    assert implement.healthcheck == HarborHealthcheck(command="test -x /app/greet.sh", interval_s=1, timeout_s=5,
                                                      retries=3, start_period_s=0, start_interval_s=5)
    assert scaffold.healthcheck is None and document.healthcheck is None
    assert [s.min_reward for s in task.steps] == [1.0, 0.5, None]
    assert [s.artifacts for s in task.steps] == [[HarborArtifact(source="/app/greet.sh")]] * 2 + [
        [HarborArtifact(source="/app/greet.sh"), HarborArtifact(source="/app/README.md")]]
    assert [w.split(": ", 1)[1] for w in task.warnings] == ["[environment].mcp_servers: not a key patchgym reads; "
                                                             "ignored"]


OVERRIDES = """schema_version = "1.1"
multi_step_reward_strategy = "final"
artifacts = ["/app/greet.sh"]

[verifier]
timeout_sec = 45.0
user = "1000"
env = {EXPECTED_NAME = "task", SHARED = "yes"}

[agent]
timeout_sec = 120.0
user = "agent"

[environment]
workdir = "/app"

[[steps]]
name = "scaffold"

[[steps]]
name = "implement"
agent = {timeout_sec = 90.0}
verifier = {timeout_sec = 30.0, env = {EXPECTED_NAME = "Harbor", EXPECTED_GREETING = "Hello, Harbor!"}}

[[steps]]
name = "document"
agent = {user = "root"}
verifier = {user = "2000"}
min_reward = {quality = 0.5, "odd key" = 1}
artifacts = ["/app/README.md", {source = "/app/docs", destination = "docs", exclude = ["*.tmp"]}]
healthcheck = {command = "test -f /app/README.md || true"}
"""


def test_a_step_inherits_the_tasks_values_and_its_own_win(recipe, tmp_path):
    (recipe / "task.toml").write_text(OVERRIDES)
    (recipe / "tests" / "test.sh").write_text("#!/bin/bash\necho fallback\n")
    shutil.rmtree(recipe / "steps" / "document" / "tests")
    folder = read_folder(recipe)
    scaffold, implement, document = folder.steps
    assert folder.multi_step_reward == "final"
    assert implement.verifier_env == {"EXPECTED_NAME": "Harbor", "SHARED": "yes", "EXPECTED_GREETING": "Hello, Harbor!"}
    assert scaffold.verifier_env == {"EXPECTED_NAME": "task", "SHARED": "yes"}
    assert (implement.verifier_timeout_s, implement.agent_timeout_s) == (30, 90)
    assert (scaffold.verifier_timeout_s, scaffold.agent_timeout_s) == (45, 120)  # the task's
    assert (scaffold.agent_user, scaffold.verifier_user) == ("agent", "1000")
    assert (document.agent_user, document.verifier_user) == ("root", "2000")
    assert document.min_reward == {"quality": 0.5, "odd key": 1.0}
    assert document.healthcheck == HarborHealthcheck(command="test -f /app/README.md || true")  # Harbor's defaults
    assert document.healthcheck.model_dump() == {"command": "test -f /app/README.md || true", "interval_s": 5.0,
                                                 "timeout_s": 30.0, "retries": 3, "start_period_s": 0.0,
                                                 "start_interval_s": 5.0}
    assert document.artifacts == [HarborArtifact(source="/app/greet.sh"), HarborArtifact(source="/app/README.md"),
                                  HarborArtifact(source="/app/docs", destination="docs", exclude=["*.tmp"])]
    assert files(document.tests, tmp_path / "document")["test.sh"] == "#!/bin/bash\necho fallback\n"  # the fallback
    assert "fallback" not in files(scaffold.tests, tmp_path / "scaffold")["test.sh"]  # the step's own test.sh wins


def test_a_steps_file_replaces_a_shared_folder_of_the_same_name(recipe, tmp_path):
    (recipe / "tests" / "data").mkdir()
    (recipe / "tests" / "data" / "a.txt").write_text("shared")
    (recipe / "steps" / "scaffold" / "tests" / "data").write_text("the step's")
    scaffold, implement, _ = read_folder(recipe).steps
    assert files(scaffold.tests, tmp_path / "s")["data"] == "the step's" and "data/a.txt" not in files(
        scaffold.tests, tmp_path / "s2")
    assert files(implement.tests, tmp_path / "i")["data/a.txt"] == "shared"


def test_archives_depend_on_the_files_only(recipe):
    before = read_folder(recipe)
    for path in recipe.rglob("*"):
        path.touch()
    (recipe / "steps" / "implement" / "workdir").chmod(0o700)
    after = read_folder(recipe)
    assert (after.tests, after.steps) == (before.tests, before.steps)


def test_a_multi_step_task_becomes_a_task_whose_problem_is_its_first_step(recipe, stubbed_build):
    (recipe / "instruction.md").write_text("The whole story, for people.\n")
    folder = read_folder(recipe)
    task = importer.to_task(folder, SandboxConfig(backend="docker"))
    assert task.problem_statement == folder.steps[0].instruction and task.harbor.steps == folder.steps
    assert task.harbor.instruction == "The whole story, for people.\n" and task.harbor.multi_step_reward == "mean"
    assert task.harbor.artifacts == [HarborArtifact(source="/app/greet.sh")] and task.workdir == "/app"


def test_the_reward_strategy_is_harbors_mean_or_final():
    assert HarborSpec(tests="eA==", multi_step_reward="final").multi_step_reward == "final"
    with pytest.raises(ValidationError, match="multi_step_reward"):
        HarborSpec(tests="eA==", multi_step_reward="max")


STEP = '[[steps]]\nname = "one"\n'
BAD_STEPS = [
    ("steps = 3\n", "steps: must be one or more [[steps]] tables"),
    ("steps = []\n", "steps: must be one or more [[steps]] tables"),
    ("[[steps]]\nagent = {}\n", "[[steps]][1].name: '' is not a step name"),
    ('[[steps]]\nname = 3\n', "[[steps]][1].name: must be a string"),
    ('[[steps]]\nname = "a/b"\n', "[[steps]][1].name: 'a/b' is not a step name"),
    ('[[steps]]\nname = ".."\n', "[[steps]][1].name: '..' is not a step name"),
    ('[[steps]]\nname = ".hidden"\n', "[[steps]][1].name: '.hidden' is not a step name"),
    (STEP + STEP, "[[steps]][2].name: 'one' is also the name of [[steps]][1]"),
    (STEP + 'min_reward = "high"\n', "[[steps]][1].min_reward: must be a number or a table"),
    (STEP + "min_reward = true\n", "[[steps]][1].min_reward: must be a number or a table"),
    (STEP + 'min_reward = {reward = "x"}\n', "[[steps]][1].min_reward: must be a number or a table"),
    (STEP + "agent = 3\n", "[[steps]][1].agent: must be a table"),
    (STEP + "[steps.agent]\ntimeout_sec = 0\n", "[[steps]][1].agent.timeout_sec: must be a positive number"),
    (STEP + "[steps.agent]\nuser = -1\n", "[[steps]][1].agent.user: must be a user name or uid"),
    (STEP + "[steps.verifier]\ntimeout_sec = -5\n", "[[steps]][1].verifier.timeout_sec: must be a positive number"),
    (STEP + "[steps.verifier]\nenv = 3\n", "[[steps]][1].verifier.env: must be a table of names to strings"),
    (STEP + "[steps.verifier]\nuser = true\n", "[[steps]][1].verifier.user: must be a user name or uid"),
    (STEP + '[steps.verifier]\nenvironment_mode = "separate"\n', "[[steps]][1].verifier.environment_mode: 'separa"),
    (STEP + "[steps.verifier.environment]\ncpus = 1\n", "[[steps]][1].verifier.environment: a separate verifier"),
    (STEP + "healthcheck = 3\n", "[[steps]][1].healthcheck: must be a table"),
    (STEP + "[steps.healthcheck]\ninterval_sec = 1\n", "[[steps]][1].healthcheck.command: missing or empty"),
    (STEP + '[steps.healthcheck]\ncommand = "true"\nretries = 0\n', "[[steps]][1].healthcheck.retries: must be a"),
    (STEP + '[steps.healthcheck]\ncommand = "true"\nretries = 1.5\n', "[[steps]][1].healthcheck.retries: must be"),
    (STEP + '[steps.healthcheck]\ncommand = "true"\ninterval_sec = -1\n',
     "[[steps]][1].healthcheck.interval_sec: must be a number of seconds"),
    (STEP + '[steps.healthcheck]\ncommand = "true"\nstart_period_sec = "1m"\n',
     "[[steps]][1].healthcheck.start_period_sec: must be a number of seconds"),
    (STEP + '[steps.healthcheck]\ncommand = "true"\ntimeout_sec = 0\n',
     "[[steps]][1].healthcheck.timeout_sec: must be a positive number"),
    (STEP + 'artifacts = "/app"\n', "[[steps]][1].artifacts: must be a list"),
    (STEP + "artifacts = [3]\n", "[[steps]][1].artifacts[1]: must be a path or a {source = ...} table"),
    (STEP + 'artifacts = ["/a", ""]\n', "[[steps]][1].artifacts[2]: must be a path"),
    (STEP + 'artifacts = [{destination = "x"}]\n', "[[steps]][1].artifacts[1].source: missing or empty"),
    (STEP + 'artifacts = [{source = "/a", colour = 1}]\n', "[[steps]][1].artifacts[1].colour: not a key of an"),
    (STEP + 'artifacts = [{source = "/a", destination = 2}]\n', "[[steps]][1].artifacts[1].destination: must be"),
    ('artifacts = [{source = "/a", exclude = "*.o"}]\n' + STEP, "artifacts[1].exclude: must be a list of patterns"),
    ('multi_step_reward_strategy = "max"\n' + STEP, "multi_step_reward_strategy: 'max': Harbor's strategies are"),
    ("multi_step_reward_strategy = 1\n" + STEP, "multi_step_reward_strategy: must be a string"),
]


@pytest.fixture
def one_step(tmp_path):
    """A task of one step, "one", with nothing at its top level but task.toml and environment/."""
    out = tmp_path / "one-step"
    (out / "environment").mkdir(parents=True)
    (out / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    (out / "steps" / "one" / "tests").mkdir(parents=True)
    (out / "steps" / "one" / "solution").mkdir()
    (out / "steps" / "one" / "instruction.md").write_text("Do one thing.\n")
    (out / "steps" / "one" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (out / "steps" / "one" / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (out / "task.toml").write_text(STEP)
    return out


def test_a_minimal_step_needs_no_top_level_instruction_or_tests(one_step):
    (step,) = read_folder(one_step).steps
    assert (step.name, step.instruction, step.agent_timeout_s, step.verifier_timeout_s) == ("one", "Do one thing.\n",
                                                                                            None, 600.0)
    assert (step.agent_user, step.verifier_user, step.min_reward, step.healthcheck) == ("root", "root", None, None)


@pytest.mark.parametrize("text, message", BAD_STEPS)
def test_every_step_schema_error_names_the_file_and_the_key(one_step, text, message):
    (one_step / "task.toml").write_text(text)
    with pytest.raises(HarborTaskError) as caught:
        read_folder(one_step)
    assert str(caught.value).startswith(f"{one_step}/task.toml: ") and message in str(caught.value)


@pytest.mark.parametrize("remove, message", [
    ("steps/one/instruction.md", "steps/one/instruction.md: missing"),
    ("steps/one/tests/test.sh", "steps/one/tests/test.sh: missing, and the task's tests/ has no test.sh either"),
    ("steps/one/solution/solve.sh", "steps/one/solution/solve.sh: missing, though solution/ is there"),
    ("steps/one", "steps/one: missing (the folder of [[steps]][1], named 'one')"),
])
def test_a_missing_step_file_names_the_folder_and_the_file(one_step, remove, message):
    target = one_step / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(HarborTaskError) as caught:
        read_folder(one_step)
    assert str(caught.value) == f"{one_step}/{message}" or str(caught.value).startswith(f"{one_step}/{message}")


def test_unknown_step_keys_are_warnings(one_step):
    (one_step / "task.toml").write_text(STEP + "colour = 1\n[steps.agent]\nshade = 2\n[steps.verifier]\n"
                                               'network_mode = "public"\n[steps.healthcheck]\ncommand = "true"\n'
                                               "tone = 3\n")
    folder = read_folder(one_step)
    assert [w.split(": ", 1)[1] for w in folder.warnings] == [
        "[[steps]][1].colour: not a key patchgym reads; ignored",
        "[[steps]][1].agent.shade: not a key patchgym reads; ignored",
        "[[steps]][1].verifier.network_mode: not a key patchgym reads; ignored",
        "[[steps]][1].healthcheck.tone: not a key patchgym reads; ignored"]


def round_trip(folder: Path, out: Path):
    """folder read into a task, the task exported to out/, out read into a task again."""
    config = SandboxConfig(backend="docker")
    task = importer.to_task(read_folder(folder), config)
    write_back(task, out / folder.name)
    return task, importer.to_task(read_folder(out / folder.name), config)


def test_a_round_trip_keeps_every_field_of_the_recipe(stubbed_build, tmp_path):
    task, again = round_trip(RECIPE, tmp_path / "out")
    assert again.harbor.folder == str(tmp_path / "out" / "cookbook-multi-step")
    assert again.model_copy(update={"harbor": again.harbor.model_copy(update={"folder": task.harbor.folder})}) == task
    out = tmp_path / "out" / "cookbook-multi-step"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == sorted(
        p.relative_to(RECIPE).as_posix() for p in RECIPE.rglob("*") if p.is_file() and p.name != "README.md")


def test_a_round_trip_keeps_what_a_step_overrides_and_inherits(recipe, stubbed_build, tmp_path):
    (recipe / "task.toml").write_text(OVERRIDES)
    (recipe / "instruction.md").write_text("An overview no agent is shown.\n")
    (recipe / "tests" / "data").mkdir()
    (recipe / "tests" / "data" / "a.txt").write_text("shared")
    (recipe / "steps" / "scaffold" / "tests" / "data").write_text("the step's")
    (recipe / "steps" / "implement" / "tests" / "helpers.sh").write_text("# the step's own helpers\n")
    (recipe / "steps" / "implement" / "tests" / "empty").mkdir()
    shutil.rmtree(recipe / "steps" / "document" / "tests")
    (recipe / "tests" / "test.sh").write_text("#!/bin/bash\necho fallback\n")
    task, again = round_trip(recipe, tmp_path / "out")
    assert task.harbor.multi_step_reward == "final" and task.harbor.instruction == "An overview no agent is shown.\n"
    assert again.harbor.model_copy(update={"folder": ""}) == task.harbor.model_copy(update={"folder": ""})
    assert again.model_dump(exclude={"harbor"}) == task.model_dump(exclude={"harbor"})
