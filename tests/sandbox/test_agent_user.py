"""The agent's commands run as an unprivileged user on every backend: they end only their own processes, cannot
signal the runner, and cannot write what root keeps; git and python work for a uid with no /etc/passwd entry."""

import glob
import json
import os
import shutil
import subprocess
import uuid

import pytest

from patchgym.sandbox import SandboxConfig, open_sandbox

LIMITS = dict(memory_mb=256, pids=128, cpus=1.0, exec_timeout_s=30)


@pytest.fixture
def sb(backend, base_image):
    with open_sandbox(SandboxConfig(backend=backend, **LIMITS), image=base_image) as sandbox:
        yield sandbox


def agent(sb, command: str, **kwargs):
    return sb.exec(command, agent=True, **kwargs)


def runner_pid(sb) -> int:
    return sb._request("ping", 10)["pid"]


@pytest.mark.parametrize("uid", [1000, 4242])
def test_agent_commands_run_as_the_agent_user_and_grading_as_root(backend, base_image, uid):
    with open_sandbox(SandboxConfig(backend=backend, agent_user=uid, **LIMITS), image=base_image) as sb:
        assert sb.exec(f"getent passwd {uid} || echo none").output == "none\n", "the test wants a uid the image lacks"
        r = agent(sb, "id -u; id -g; id -G; echo $HOME $USER; touch $HOME/x && echo writable")
        assert r.output.split() == [str(uid)] * 3 + [f"/tmp/home-{uid}", "agent", "writable"], r.output
        assert sb.exec("id -u; id -G").output.split() == ["0", "0"]


def test_kill_all_as_the_agent_ends_only_its_own_processes(sb):
    before = runner_pid(sb)
    r = agent(sb, "sleep 300 & sleep 0.1; kill -9 -1; sleep 0.2; jobs -l; echo done")
    assert r.ok and "Killed" in r.output and r.output.endswith("done\n"), r.output
    assert agent(sb, "echo alive").output == "alive\n"
    assert runner_pid(sb) == before


def test_the_agent_cannot_signal_the_runner(sb):
    pid = runner_pid(sb)
    found = agent(sb, "grep -l 'in-sandbox [r]unner' /proc/[0-9]*/cmdline | cut -d/ -f3").output.split()
    assert str(pid) in found, "the agent finds the runner (and docker's init, which started it) through /proc"
    r = agent(sb, f"for p in {' '.join(found)}; do kill -9 $p; echo rc=$?; done; kill -STOP $PPID; echo rc=$?")
    tries = len(found) + 1
    assert r.output.count("Operation not permitted") == tries and r.output.count("rc=1") == tries, r.output
    assert agent(sb, "echo alive").output == "alive\n" and runner_pid(sb) == pid


def test_roots_files_are_out_of_the_agents_reach(sb):
    sb.exec("mkdir -p -m 700 /var/lib/patchgym && git init -q --bare /var/lib/patchgym/base.git")
    r = agent(sb, "rm -rf /var/lib/patchgym/base.git; echo x > /var/lib/patchgym/x; echo y > /etc/x; "
                  "echo z >> /opt/patchgym-probe; ls /root")
    assert r.output.count("Permission denied") == 5, r.output
    assert sb.exec("git --git-dir=/var/lib/patchgym/base.git rev-parse --git-dir").ok


def test_git_and_python_work_for_a_uid_without_a_passwd_entry(sb):
    sb.exec("git init -q /testbed && chown -R 1000:1000 /testbed")
    r = agent(sb, "echo 1 > a.txt && git add a.txt && git commit -qm one && git log --format=%an%n%ae && "
                  "git status --porcelain && python3 -c 'import getpass, os; print(getpass.getuser(), "
                  "os.path.expanduser(\"~\"))' && python3 -m pip --version >/dev/null && echo ok",
              cwd="/testbed")
    assert r.ok and r.output.split() == ["patchgym", "patchgym@localhost", "agent", "/tmp/home-1000",
                                         "ok"], r.output


def test_what_the_agent_writes_is_in_the_diff(sb):
    sb.exec("git init -q /testbed && echo base > /testbed/kept.txt && git -C /testbed add -A && "
            "git -C /testbed commit -qm base && chown -R 1000:1000 /testbed")
    made = agent(sb, "echo new > made.txt && echo edited > kept.txt && stat -c %u made.txt", cwd="/testbed")
    assert made.output == "1000\n", made.output
    patch = sb.diff("HEAD", cwd="/testbed")
    assert "+new" in patch and "+edited" in patch and "made.txt" in patch


def test_give_to_agent_hands_over_a_tree_and_leaves_links_alone(sb):
    sb.exec("mkdir -p /testbed/pkg && echo x > /testbed/pkg/a.py && ln -s /etc/passwd /testbed/link")
    sb.give_to_agent("/testbed")
    owners = sb.exec("stat -c '%u:%g %n' /testbed /testbed/pkg /testbed/pkg/a.py /etc/passwd; "
                     "stat -c '%u' /testbed/link", cwd="/").output.split("\n")
    assert owners[:4] == ["1000:1000 /testbed", "1000:1000 /testbed/pkg", "1000:1000 /testbed/pkg/a.py",
                          "0:0 /etc/passwd"] and owners[4] == "1000", owners
    assert agent(sb, "echo y >> pkg/a.py && mkdir pkg/new && echo ok", cwd="/testbed").output == "ok\n"


@pytest.fixture
def image_with_a_user(base_image):
    """A Docker image of the base whose USER is an ordinary user, as some datasets' images are."""
    import io

    from patchgym.sandbox import images
    from patchgym.sandbox.docker import docker_client

    client = docker_client()
    tag = f"pg-agentuser-user-image:{uuid.uuid4().hex[:8]}"
    dockerfile = f"FROM {images.ensure_docker_image(base_image)}\nUSER 1234:1234\n"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag
    client.images.remove(tag, force=True)


def test_the_runner_is_root_whatever_the_images_user(ready_backend, image_with_a_user):
    with open_sandbox(SandboxConfig(backend=ready_backend("docker"), **LIMITS), image=image_with_a_user) as sb:
        assert sb.exec("id -u").output == "0\n"
        assert agent(sb, "id -u").output == "1000\n"


# The interpreter itself, not a pyenv shim (which needs pyenv's environment to pick a version).
OLDEST_PYTHON = next(iter(sorted(glob.glob("/root/.pyenv/versions/3.6*/bin/python3.6")
                                 + glob.glob("/usr/bin/python3.6"))), None)


@pytest.mark.skipif(OLDEST_PYTHON is None or os.geteuid() != 0, reason="needs root and a Python 3.6 on this machine")
def test_the_runner_drops_to_the_agent_user_on_python_3_6(tmp_path):
    """The runner runs on the image's interpreter, as old as 3.6: the drop uses nothing newer (here on the host)."""
    from patchgym.sandbox.base import RUNNER_SOURCE

    proc = subprocess.Popen([OLDEST_PYTHON, "-c", RUNNER_SOURCE, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={"PATH": os.environ["PATH"], "HOME": "/root"})
    ask = lambda **req: (proc.stdin.write(json.dumps(req).encode() + b"\n"), proc.stdin.flush(),  # noqa: E731
                         json.loads(proc.stdout.readline()))[-1]
    try:
        assert json.loads(proc.stdout.readline())["python"].startswith("3.6")
        mine = ask(op="exec", cmd="id -u; id -G; echo $HOME", user=4243)
        assert mine["output"].split() == ["4243", "4243", "/tmp/home-4243"], mine
        assert ask(op="exec", cmd="id -u")["output"] == "0\n"
        ask(op="shutdown")
    finally:
        proc.kill()
        shutil.rmtree("/tmp/home-4243", ignore_errors=True)


def test_a_setuid_root_binary_gives_the_agent_nothing(sb):
    """What an image ships setuid root (su, mount, passwd) runs without privileges: every backend sets
    no_new_privs, so exec never raises the uid again."""
    sb.exec("cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id")
    assert agent(sb, "/usr/local/bin/suid-id -u; grep NoNewPrivs /proc/self/status").output.split() == [
        "1000", "NoNewPrivs:", "1"]
