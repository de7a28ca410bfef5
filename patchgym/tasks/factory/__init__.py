"""The offline task factory: packages that ship their tests, procedural bugs, validation in sandboxes. One procedure
(build.py) serves every ecosystem (ecosystem.py): PyPI sdists with pytest (pypi/) and npm tarballs with tape (npm/),
each registered by name in ECOSYSTEMS.

    build_tasks(["toolz", "boltons"], per_package=20, seed=0, out_dir=Path("runs/factory"))
    build_tasks(["minimist"], per_package=3, seed=0, out_dir=Path("runs/npm"), ecosystem="npm")
"""

from patchgym.tasks.factory import npm, pypi  # noqa: F401  (each registers its ecosystem)
from patchgym.tasks.factory.build import FactoryResult, build_tasks
from patchgym.tasks.factory.ecosystem import ECOSYSTEMS, Ecosystem, Fetched, Recipe, SuiteTimeout, ecosystem_named
from patchgym.tasks.factory.hidden import Protected
from patchgym.tasks.factory.mutate import Mutation
from patchgym.tasks.factory.records import SuiteRun
from patchgym.tasks.factory.sources import WORKDIR

__all__ = ["ECOSYSTEMS", "WORKDIR", "Ecosystem", "FactoryResult", "Fetched", "Mutation", "Protected", "Recipe",
           "SuiteRun", "SuiteTimeout", "build_tasks", "ecosystem_named"]
