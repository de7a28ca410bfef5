"""Bucketed weight pushes, trainer side and the worker's decoding, without a server: buckets of the requested size
(a larger tensor alone), aligned offsets, tied tensors once, the /dev/shm segment reused and gone afterwards, and the
bytes the worker reads back equal to the tensors pushed."""

import os

import pytest
import torch

from patchgym.inference.vllm_worker import bucket_tensors
from patchgym.inference.weight_push import ALIGN, PushStats, ShmSegment, push, untied


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(40, 8, generator=g)
    return {"embed.weight": embed, "a.weight": torch.randn(10, 8, generator=g), "a.bias": torch.randn(3, generator=g),
            "big.weight": torch.randn(100, 8, generator=g), "b.weight": torch.randn(5, 8, generator=g),
            "lm_head.weight": embed}  # tied to the embedding


def run(items, bucket_bytes, dtype=torch.float32):
    """Push through a real segment; what each send saw, decoded the way the worker decodes it."""
    segment, seen = ShmSegment(16), []
    try:
        def send(nbytes, rows):
            with open(segment.path, "rb") as f:  # as the worker reads it: the file, not the trainer's map
                raw = torch.frombuffer(bytearray(f.read(nbytes)), dtype=torch.uint8)
            seen.append((nbytes, [(n, t.clone()) for n, t in bucket_tensors(raw, rows)], rows))
        stats = push(items, bucket_bytes, dtype, segment, send, PushStats())
    finally:
        segment.close()
    assert not os.path.exists(segment.path)
    return stats, seen


def test_buckets_hold_what_fits_and_a_larger_tensor_travels_alone():
    state = weights()
    stats, seen = run(untied(state), bucket_bytes=350 * 4)
    names = [[n for n, _ in tensors] for _, tensors, _ in seen]
    # 350 floats: 320 then 80 do not fit together; 80 + 3 do; big.weight (800 floats) goes alone
    assert names == [["embed.weight"], ["a.weight", "a.bias"], ["big.weight"], ["b.weight"]]
    assert stats.buckets == 4 and stats.tensors == 5  # lm_head once, as the embedding
    assert stats.largest_bucket == 800 * 4
    for _, tensors, rows in seen:
        assert all(offset % ALIGN == 0 for *_, offset in rows)
        for name, tensor in tensors:
            assert torch.equal(tensor, state[name])
    assert seen[1][2][1][3] == 320  # a.bias starts after a.weight's 320 bytes, aligned


def test_the_push_converts_to_the_servers_dtype_and_grows_the_segment_for_one_large_tensor():
    state = {"w": torch.randn(1000, 3), "v": torch.randn(7)}
    stats, seen = run(state.items(), bucket_bytes=64, dtype=torch.bfloat16)
    assert [len(tensors) for _, tensors, _ in seen] == [1, 1]
    assert stats.largest_bucket == 3000 * 2
    for _, tensors, _ in seen:
        for name, tensor in tensors:
            assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, state[name].to(torch.bfloat16))


def test_a_generator_is_pulled_one_tensor_at_a_time():
    pulled = []

    def lazily():
        for name, tensor in weights().items():
            pulled.append(name)
            yield name, tensor

    segment, sends = ShmSegment(16), []
    try:
        push(lazily(), 350 * 4, torch.float32, segment, lambda n, rows: sends.append(len(pulled)), PushStats())
    finally:
        segment.close()
    assert sends[0] == 2  # the first bucket went out as soon as the second tensor did not fit, before the rest


def test_untied_keeps_each_storage_once_but_equal_values_twice():
    same = torch.ones(4)
    state = {"x": same, "y": same, "z": torch.ones(4), "view": same[:2]}
    assert [n for n, _ in untied(state)] == ["x", "z", "view"]


@pytest.mark.parametrize("size", [0, 1])
def test_an_empty_push_sends_nothing(size):
    stats, seen = run(iter([]), bucket_bytes=size + 1)
    assert seen == [] and stats.buckets == 0
