"""The SWE-bench-layout replicas (SWE-bench classic and v5, SWE-Gym, SWE-rebench): one image, /testbed at a real
base_commit, the conda-shim env `testbed`; the rows' tests are what the eval script showed in that image."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from tests.replicas import images, project
from tests.replicas.images import HEREDOC, observed, split
from tests.replicas.project import FAIL_TO_PASS, PROBLEM, REPO, TEST_FILE, cache_dir

INSTANCE = "marshmallow-code__marshmallow-1359"
TEST_CMD = "pytest -rA"  # SWE-bench's TEST_PYTEST, the spec of marshmallow 3.0
INSTALL = "python -m pip install -e '.[dev]'"
CREATED_AT = "2019-08-13T12:00:00Z"


@dataclass
class Replica:
    image: str
    rows: dict[str, list[dict]] = field(default_factory=dict)  # dataset name -> rows in its schema


@dataclass
class Source:
    """The replica's repository and patches, made on the host."""
    base_commit: str
    patch: str
    test_patch: str
    repo: Path


def source() -> Source:
    repo = cache_dir() / "repos" / "base"
    base_commit = project.fresh_repo(repo, f"{project.NAME} {project.VERSION} (PyPI sdist)")
    project.edit(repo, fix=True, test=False)
    patch = project.diff(repo, "src/marshmallow/fields.py")
    project.git(repo, "checkout", "-q", "--", ".")
    project.edit(repo, fix=False, test=True)
    test_patch = project.diff(repo, TEST_FILE)
    project.git(repo, "checkout", "-q", "--", ".")
    return Source(base_commit, patch, test_patch, repo)


def conda_image(repo: Path, tag: str) -> str:
    """The SWE-bench layout: `repo` at /testbed, installed editable in the conda-shim env `testbed`."""
    dockerfile = f"""FROM {images.base_tag()}
COPY wheels /opt/wheelhouse
COPY activate conda /opt/miniconda3/bin/
COPY testbed /testbed
RUN chmod +x /opt/miniconda3/bin/conda && python3 -m venv /opt/miniconda3/envs/testbed \\
 && printf '[global]\\nno-index = true\\nfind-links = /opt/wheelhouse\\n' > /opt/miniconda3/envs/testbed/pip.conf \\
 && printf '*.egg-info/\\n__pycache__/\\n.pytest_cache/\\n' >> /testbed/.git/info/exclude \\
 && cd /testbed && bash -c "source /opt/miniconda3/bin/activate && conda activate testbed && {INSTALL}"
WORKDIR /testbed
"""
    return images.build(tag, dockerfile, {"activate": images.ACTIVATE, "conda": images.CONDA, "testbed": repo})


def swebench_image(src: Source) -> str:
    return conda_image(src.repo, f"{images.PREFIX}/swebench/sweb.eval.x86_64.{INSTANCE.replace('__', '_1776_')}:latest")


def eval_script(src: Source, test_cmd: str = TEST_CMD, install: str = INSTALL) -> str:
    """What swebench 4.1.0's make_eval_script_list_py writes for this row (the v5 row carries it)."""
    reset = f"git checkout {src.base_commit} {TEST_FILE}"
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "source /opt/miniconda3/bin/activate", "conda activate testbed",
        "cd /testbed", "git config --global --add safe.directory /testbed", "cd /testbed", "git status", "git show",
        f"git -c core.fileMode=false diff {src.base_commit}", "source /opt/miniconda3/bin/activate",
        "conda activate testbed", install, reset, f"git apply -v - <<'{HEREDOC}'\n{src.test_patch}\n{HEREDOC}",
        ": '>>>>> Start Test Output'", f"{test_cmd} {TEST_FILE}", ": '>>>>> End Test Output'", reset]) + "\n"


def _swebench_tests(src: Source, image: str) -> tuple[list[str], list[str]]:
    script = eval_script(src)
    f2p, p2p = split(observed(image, script, "", "swebench-empty"), observed(image, script, src.patch, "swebench-gold"))
    if f2p != [FAIL_TO_PASS]:
        raise RuntimeError(f"{image}: FAIL_TO_PASS observed {f2p}, expected [{FAIL_TO_PASS}]")
    return f2p, p2p


def _swebench_row(src: Source, f2p: list[str], p2p: list[str], instance_id: str = INSTANCE) -> dict:
    return {"repo": REPO, "instance_id": instance_id, "base_commit": src.base_commit, "patch": src.patch,
            "test_patch": src.test_patch, "problem_statement": PROBLEM, "hints_text": "", "created_at": CREATED_AT,
            "version": "3.0", "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p),
            "environment_setup_commit": src.base_commit}


def swebench() -> Replica:
    """SWE-bench Verified's classic row and the same row in v5's schema (image, eval_script, log_parser, eval_type)."""
    src = source()
    image = swebench_image(src)
    f2p, p2p = _swebench_tests(src, image)
    classic = {**_swebench_row(src, f2p, p2p), "difficulty": "<15 min fix"}
    v5 = {**classic, "image": images.published(image), "eval_script": eval_script(src),
          "log_parser": "parse_log_marshmallow", "eval_type": "pass_and_fail"}
    return Replica(image, {"swebench": [classic], "swebench_v5": [v5]})


def swegym() -> Replica:
    """SWE-Gym's row: the SWE-bench columns without environment_setup_commit, F2P/P2P as real lists."""
    src = source()
    image = swebench_image(src)
    f2p, p2p = _swebench_tests(src, image)
    tag = f"{images.PREFIX}/xingyaoww/sweb.eval.x86_64.{INSTANCE.replace('__', '_s_')}:latest"
    images.tag(image, tag)
    row = {**_swebench_row(src, f2p, p2p), "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
    del row["environment_setup_commit"]
    return Replica(tag, {"swegym": [row]})


def rebench() -> Replica:
    """SWE-rebench's row: SWE-bench columns plus the install_config that replaces the spec table."""
    src = source()
    image = swebench_image(src)
    install = "python -m pip install -e ."
    f2p, p2p = split(observed(image, eval_script(src, install=install), "", "rebench-empty"),
                     observed(image, eval_script(src, install=install), src.patch, "rebench-gold"))
    tag = f"{images.PREFIX}/swerebench/sweb.eval.x86_64.{INSTANCE.replace('__', '_1776_')}:latest"
    images.tag(image, tag)
    config = {"python": "3.11", "packages": "", "pip_packages": ["pytest", "pytz", "simplejson"], "pre_install": [],
              "install": install, "reqs_path": [], "env_yml_path": [], "test_cmd": TEST_CMD,
              "log_parser": "parse_log_pytest", "docker_specs": {}}
    row = {**_swebench_row(src, f2p, p2p), "install_config": config, "docker_image": images.published(tag)}
    return Replica(tag, {"rebench": [row]})
