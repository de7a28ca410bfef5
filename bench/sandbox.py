"""Sandbox speed, ours against the usual approach, all measured in one run on the same image.

Every per-command figure is the median wall time of `bash -c true`. Ratios below 1 mean we are faster.
    python bench/sandbox.py [--quick] [--json]
"""

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.table import Table

from patchgym.sandbox import SandboxConfig, images, open_sandbox
from patchgym.sandbox.docker import docker_client
from patchgym.sandbox.pool import SandboxPool

from report import median_ms  # bench/report.py, beside this script

TARGETS = {  # key: (comparison, bound)
    "docker_exec_ratio": ("<=", 0.25),
    "local_exec_ratio": ("<=", 2.0),
    "pool_hit_ms": ("<=", 50.0),
    "pool_burst_started_per_acquire": ("<=", 1.0),
    "local_pool_burst_started_per_acquire": ("<=", 1.0),
    "docker_concurrent_speedup": (">=", 3.0),
    "local_concurrent_speedup": (">=", 3.0),
}
CONCURRENCY = 16


def throughput(workers: list, per_worker: int) -> float:
    """Commands per second when each worker callable runs `per_worker` commands in its own thread."""
    barrier = threading.Barrier(len(workers) + 1)

    def loop(fn):
        barrier.wait()
        for _ in range(per_worker):
            fn()

    threads = [threading.Thread(target=loop, args=(fn,)) for fn in workers]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return len(workers) * per_worker / (time.perf_counter() - start)


def pool_burst(cfg: SandboxConfig, recipe, n: int) -> tuple[float, float]:
    """(ms until all are handed out, sandboxes started per acquire) for n acquires at once on a fresh pool of size n:
    the burst comes while the pool's warm starts are in flight."""
    with SandboxPool(cfg, recipe, size=n, max_concurrency=n) as pool:
        start = time.perf_counter()
        with ThreadPoolExecutor(n) as burst:
            sandboxes = list(burst.map(lambda _: pool.acquire(), range(n)))
        took = (time.perf_counter() - start) * 1000
        started = pool.started
        for sb in sandboxes:
            pool.release(sb)
    return took, started / n


def measure(quick: bool) -> dict[str, float]:
    n, per_worker, pool_n = (30, 10, 5) if quick else (200, 40, 20)
    recipe = images.base_recipe()
    tag = images.ensure_docker_image(recipe, progress=False)
    images.ensure_rootfs(recipe, progress=False)
    docker_cfg, local_cfg = SandboxConfig(backend="docker"), SandboxConfig(backend="local")
    client = docker_client()
    m: dict[str, float] = {}

    m["bare_subprocess_ms"] = median_ms(lambda: subprocess.run(["bash", "-c", "true"]), n)
    with open_sandbox(docker_cfg, image=recipe) as sb:
        container = client.containers.get(sb.id)
        m["docker_exec_ms"] = median_ms(lambda: sb.exec("true"), n)
        m["raw_docker_exec_ms"] = median_ms(
            lambda: subprocess.run(["docker", "exec", sb.id, "bash", "-c", "true"], check=True), n)
        m["raw_sdk_exec_ms"] = median_ms(lambda: container.exec_run(["bash", "-c", "true"]), n)
    with open_sandbox(local_cfg, image=recipe) as sb:
        m["local_exec_ms"] = median_ms(lambda: sb.exec("true"), n)
    m["docker_run_ms"] = median_ms(lambda: subprocess.run(
        ["docker", "run", "--rm", "--network", "none", tag, "true"], check=True), max(3, n // 10))

    for name, cfg in (("", docker_cfg), ("local_", local_cfg)):
        with SandboxPool(cfg, recipe, size=2, max_concurrency=4) as pool:
            hits = []
            for _ in range(pool_n):
                while len(pool._idle) < pool.size:
                    time.sleep(0.01)
                start = time.perf_counter()
                sb = pool.acquire()
                hits.append((time.perf_counter() - start) * 1000)
                pool.release(sb)
            m[f"{name}pool_hit_ms"] = statistics.median(hits)
        with SandboxPool(cfg, recipe, size=0, max_concurrency=4) as pool:
            def miss():
                pool.release(pool.acquire())
            m[f"{name}pool_miss_ms"] = median_ms(miss, pool_n)
        burst = 4 if quick else CONCURRENCY
        m[f"{name}pool_burst_ms"], m[f"{name}pool_burst_started_per_acquire"] = pool_burst(cfg, recipe, burst)

    for name, cfg in (("docker", docker_cfg), ("local", local_cfg)):
        sandboxes = [open_sandbox(cfg, image=recipe) for _ in range(CONCURRENCY)]
        try:
            m[f"{name}_concurrent_exec_per_s"] = throughput([lambda s=s: s.exec("true") for s in sandboxes],
                                                            per_worker)
            if name == "docker":
                containers = [client.containers.get(s.id) for s in sandboxes]
                m["raw_sdk_concurrent_exec_per_s"] = throughput(
                    [lambda c=c: c.exec_run(["bash", "-c", "true"]) for c in containers], per_worker)
        finally:
            for s in sandboxes:
                s.close()

    m["docker_exec_ratio"] = m["docker_exec_ms"] / m["raw_sdk_exec_ms"]
    m["local_exec_ratio"] = m["local_exec_ms"] / m["bare_subprocess_ms"]
    m["docker_concurrent_speedup"] = m["docker_concurrent_exec_per_s"] / m["raw_sdk_concurrent_exec_per_s"]
    m["local_concurrent_speedup"] = m["local_concurrent_exec_per_s"] / m["raw_sdk_concurrent_exec_per_s"]
    return m


def meets(key: str, value: float) -> bool:
    op, bound = TARGETS[key]
    return value <= bound if op == "<=" else value >= bound


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (under a minute)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    m = measure(args.quick)
    m["targets_met"] = all(meets(k, m[k]) for k in TARGETS)
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in m.items()}))
    else:
        table = Table(title=f"sandbox benchmark ({'quick' if args.quick else 'full'})")
        for column in ("metric", "value", "target"):
            table.add_column(column)
        for key, value in m.items():
            if key == "targets_met":
                continue
            target = ""
            if key in TARGETS:
                op, bound = TARGETS[key]
                target = f"{op} {bound:g} " + ("[green]met[/green]" if meets(key, value) else "[red]MISSED[/red]")
            table.add_row(key, f"{value:.2f}", target)
        Console().print(table)
    return 0 if m["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
