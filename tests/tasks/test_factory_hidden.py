"""Hidden is hidden: the scan of a factory image finds every copy of a package's tests or source that the agent's
user can read (by content, by an installed copy's name, by an archive's name, by git objects), names its path, and
passes over what the agent cannot read and what is the workspace itself."""

import pytest

from patchgym.sandbox import SandboxConfig, open_sandbox
from patchgym.tasks.factory.hidden import Protected, scan
from patchgym.tasks.factory.sources import SourceError

TEST = "import calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n" + "# padding\n" * 20
SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n" + "# padding\n" * 20
PROTECTED = Protected({"tests/test_calc.py": TEST, "calc/__init__.py": SOURCE}, names=["calc"],
                      archives=["calc-"])


pytestmark = pytest.mark.docker  # what the scan sees is the image's, the same on every backend


@pytest.fixture
def sb(ready_backend, base_image):
    with open_sandbox(SandboxConfig(backend=ready_backend("docker")), image=base_image) as sandbox:
        sandbox.write_file("/testbed/tests/test_calc.py", TEST)
        sandbox.write_file("/testbed/calc/__init__.py", SOURCE)
        yield sandbox


def test_the_workspace_alone_holds_no_copy(sb):
    assert scan(sb, PROTECTED, "/testbed") == []


def test_every_readable_copy_is_found_by_path(sb):
    sb.write_file("/opt/venv/lib/python3.11/site-packages/vendor/calc/__init__.py", SOURCE)  # installed under its name
    sb.write_file("/usr/share/doc/calc/test_calc.py", TEST)  # the same bytes under any name
    sb.write_file("/var/cache/calc-1.0.tar.gz", b"\x1f\x8b")  # an sdist
    sb.exec("git init -q /srv/mirror")  # git objects
    found = dict(scan(sb, PROTECTED, "/testbed"))
    assert found == {
        "/opt/venv/lib/python3.11/site-packages/vendor/calc": "an installed copy of the package",
        "/opt/venv/lib/python3.11/site-packages/vendor/calc/__init__.py": "a copy of calc/__init__.py",
        "/usr/share/doc/calc/test_calc.py": "a copy of tests/test_calc.py",
        "/var/cache/calc-1.0.tar.gz": "an archive of the package",
        "/srv/mirror/.git": "git objects"}, found


def test_what_the_agent_cannot_read_or_what_links_back_to_the_workspace_is_no_copy(sb):
    sb.write_file("/root/secret/test_calc.py", TEST)  # root's home: the agent's user cannot read it
    sb.exec("mkdir -p -m 700 /var/lib/hidden && cp /testbed/calc/__init__.py /var/lib/hidden/")
    sb.exec("mkdir -p /node_modules && ln -s /testbed /node_modules/calc")  # how a dependency's copy is replaced
    sb.write_file("/testbed/build/copy_of_test.py", TEST)  # a second copy inside the workspace does count
    assert scan(sb, PROTECTED, "/testbed") == [("/testbed/build/copy_of_test.py", "a copy of tests/test_calc.py")]


def test_a_factory_refuses_an_image_with_a_copy_naming_its_path(sb, monkeypatch):
    from patchgym.tasks.factory import hidden

    sb.write_file("/opt/leak/test_calc.py", TEST)
    monkeypatch.setattr(hidden, "find_copies", lambda image, protected, workdir, config: scan(sb, protected, workdir))
    with pytest.raises(SourceError, match="calc-1.0: its image lets the agent read what a task hides: "
                                          "/opt/leak/test_calc.py \\(a copy of tests/test_calc.py\\)"):
        hidden.check_hidden("image", PROTECTED, "/testbed", "calc-1.0", SandboxConfig())
