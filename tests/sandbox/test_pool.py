"""The warm pool hands out pristine sandboxes fast, bounds concurrency, and replaces used ones in the background."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from patchgym.sandbox import SandboxConfig
from patchgym.sandbox import pool as pool_module
from patchgym.sandbox.pool import SandboxPool


def _wait_full(pool: SandboxPool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(pool._idle) < pool.size:
        assert time.monotonic() < deadline, "pool did not fill"
        time.sleep(0.05)


def test_pool_hit_is_fast_and_pristine(backend, base_image):
    with SandboxPool(SandboxConfig(backend=backend), base_image, size=2, max_concurrency=4) as pool:
        _wait_full(pool)
        start = time.perf_counter()
        with pool.sandbox() as sb:
            took = time.perf_counter() - start
            sb.write_file("/testbed/dirty.txt", "agent was here")
        assert took < 0.05, f"pool hit took {took * 1000:.1f} ms"
        _wait_full(pool)
        for _ in range(3):
            with pool.sandbox() as sb:
                assert sb.exec("test -e /testbed/dirty.txt").exit_code == 1
        assert pool.hits >= 3


def test_pool_bounds_concurrency(backend, base_image):
    with SandboxPool(SandboxConfig(backend=backend), base_image, size=0, max_concurrency=2) as pool:
        a, b = pool.acquire(), pool.acquire()
        with pytest.raises(TimeoutError, match="max_concurrency"):
            pool.acquire(timeout=0.2)
        pool.release(a)
        c = pool.acquire(timeout=5)
        assert pool.misses == 3
        pool.release(b)
        pool.release(c)


def test_pool_replaces_dead_idle_sandboxes(backend, base_image):
    with SandboxPool(SandboxConfig(backend=backend), base_image, size=1, max_concurrency=2) as pool:
        _wait_full(pool)
        pool._idle[0]._stop()  # dies while idle
        with pool.sandbox() as sb:
            assert sb.exec("echo ok").output == "ok\n"


def test_a_burst_is_served_by_the_warm_starts_in_flight(backend, base_image, monkeypatch):
    started = []
    real_open = pool_module.open_sandbox
    monkeypatch.setattr(pool_module, "open_sandbox", lambda *a, **k: started.append(1) or real_open(*a, **k))
    n = 3
    with SandboxPool(SandboxConfig(backend=backend), base_image, size=n, max_concurrency=n) as pool:
        with ThreadPoolExecutor(n) as burst:  # while the pool's n warm starts are still in flight
            sandboxes = list(burst.map(lambda _: pool.acquire(), range(n)))
        assert len(started) == n and pool.hits == n, "each acquire started its own beside the warm starts"
        time.sleep(0.5)
        assert len(started) == n, "an idle one was started while none could be handed out"
        for sb in sandboxes:
            pool.release(sb)
        _wait_full(pool)
        assert len(started) == pool.started == 2 * n  # each release started one to take its place
