"""Decision points from expert demos played on the in-memory environment (the fast tier), and the Replay over it."""

import pytest
from pivot_demos import MemoryReplay, play_demo

from memory_env import memory_task
from patchgym.agent.config import AgentConfig
from patchgym.pivot.states import decision_points


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


@pytest.fixture(scope="session")
def demo(tokenizer):
    return play_demo(tokenizer, AgentConfig())


@pytest.fixture(scope="session")
def points(demo):
    """The demo's states, by the name of the expert's call (file_editor by its command)."""
    found = decision_points(demo, memory_task(), MemoryReplay())
    return {p.call["arguments"].get("command", p.call["name"]) if p.call["name"] == "file_editor" else p.call["name"]:
            p for p in found}


