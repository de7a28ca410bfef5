"""One real 3-node Ray cluster (head + 2 worker raylets) per test module: starting one takes seconds here."""

import pytest
from ray_nodes import reap_after_kill, start_cluster, stop_cluster, worker_nodes


@pytest.fixture(scope="module")
def ray_cluster():
    cluster = start_cluster(workers=2)
    yield cluster
    stop_cluster(cluster)


@pytest.fixture
def victim(ray_cluster):
    """A worker node for the test to kill; what its dead workers left is reaped even when the test fails."""
    node = worker_nodes(ray_cluster)[0]
    yield node
    reap_after_kill(node)
