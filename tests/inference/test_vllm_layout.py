"""inference.vllm_cpu_cores: the vLLM server's CPU layout (the worker's threads bound one per core, none reserved),
the settings that keep vLLM's own, the key's parsing, and chunked prefill off on CPU; no server is started here."""

import os

import pytest

from patchgym.config import load_config
from patchgym.inference.vllm_engine import cpu_layout, cpu_prefill_args


def test_all_binds_every_core_of_this_process_and_n_the_first_n(monkeypatch):
    for variable in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(variable, raising=False)
    cores = sorted(os.sched_getaffinity(0))
    env, args = cpu_layout("all")
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert args == []
    assert cpu_layout(1) == ({"VLLM_CPU_OMP_THREADS_BIND": str(cores[0]), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}, [])
    with pytest.raises(ValueError, match=f"may use {len(cores)} cores"):
        cpu_layout(len(cores) + 1)


def test_vllms_own_layout_and_a_users_are_left_alone(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert cpu_layout("vllm") == ({}, [])
    assert cpu_layout("all", ["--tensor-parallel-size", "2"]) == ({}, [])
    assert cpu_layout("all", ["--distributed-executor-backend=mp"]) == ({}, [])
    assert cpu_layout("all", ["--max-model-len", "4096"])[0]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert cpu_layout("all") == ({}, [])


def test_the_key_takes_all_vllm_or_a_positive_count():
    assert load_config().inference.vllm_cpu_cores == "all"
    assert load_config(overrides=["inference.vllm_cpu_cores=2"]).inference.vllm_cpu_cores == 2
    assert load_config(overrides=["inference.vllm_cpu_cores=vllm"]).inference.vllm_cpu_cores == "vllm"
    for bad in ("0", "-1", "true", "some"):
        with pytest.raises(Exception, match="vllm_cpu_cores"):
            load_config(overrides=[f"inference.vllm_cpu_cores={bad}"])


def test_chunked_prefill_is_off_on_cpu_unless_the_user_set_it():
    assert cpu_prefill_args() == ["--no-enable-chunked-prefill"]
    assert cpu_prefill_args(["--max-model-len", "4096"]) == ["--no-enable-chunked-prefill"]
    for given in (["--enable-chunked-prefill"], ["--max-num-batched-tokens", "4096"], ["--max-num-batched-tokens=64"]):
        assert cpu_prefill_args(given) == []
