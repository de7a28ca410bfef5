"""Replicas of the five public task families, offline: one image per family in its published layout, and rows in
each dataset's own column schema, whose FAIL_TO_PASS / PASS_TO_PASS are what running them in the image showed.

    swebench()  SWE-bench classic + v5 rows   pg-replica/swebench/sweb.eval.x86_64.<id, __ as _1776_>:latest
    swegym()    SWE-Gym row                    pg-replica/xingyaoww/sweb.eval.x86_64.<id, __ as _s_>:latest
    rebench()   SWE-rebench (install_config)   pg-replica/swerebench/sweb.eval.x86_64.<id, __ as _1776_>:latest
    r2egym()    R2E-Gym Subset row             pg-replica/namanjain12/marshmallow_final:<new commit>
    smith()     SWE-smith row                  pg-replica/jyangballin/swesmith.x86_64.<owner>_1776_<repo>.<c8>:latest

with id marshmallow-code__marshmallow-1359. The rows name the images as published (without the prefix).

Each returns a Replica (image tag, rows by dataset). Reruns are fast: downloads, images (by content hash) and test
runs (by image id) are cached in PATCHGYM_REPLICA_CACHE (default <patchgym store>/replicas);
PATCHGYM_REPLICA_PREFIX changes the `pg-replica` namespace. `python -m tests.replicas.build OUT` writes
OUT/<dataset>.jsonl (swebench, swebench_v5, swegym, rebench, r2egym, smith).
"""

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

from patchgym.files import file_lock
from tests.replicas.layouts import r2egym, smith
from tests.replicas.swebench_family import Replica, rebench, swebench, swegym

__all__ = ["FAMILIES", "Replica", "write_fixtures"]


def _one_at_a_time(build: Callable[[], Replica]) -> Callable[[], Replica]:
    """Builds share the cache's repositories and build contexts: two test runs on one host take turns."""
    @functools.wraps(build)
    def locked() -> Replica:
        with file_lock("pg-replica-build"):
            return build()
    return locked


FAMILIES = {f.__name__: _one_at_a_time(f) for f in (swebench, swegym, rebench, r2egym, smith)}


def write_fixtures(out: Path) -> dict[str, Path]:
    """Build every family and write OUT/<dataset>.jsonl; returns dataset -> file."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for build in FAMILIES.values():
        replica = build()
        for dataset, rows in replica.rows.items():
            written[dataset] = out / f"{dataset}.jsonl"
            written[dataset].write_text("".join(json.dumps(row) + "\n" for row in rows))
            print(f"{dataset:12} {replica.image} -> {written[dataset]}")
    return written


if __name__ == "__main__":
    write_fixtures(Path(sys.argv[1] if len(sys.argv) > 1 else "replica-rows"))
