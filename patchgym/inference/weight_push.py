"""Trainer side of a weight push into a vLLM server: (name, tensor) pairs, taken one at a time, packed into buckets
of `inference.sync_bucket_mb`, each handed to the server's worker (patchgym.inference.vllm_worker) and loaded in
place. No checkpoint is written and no whole state dict is held: at most one bucket (plus one tensor) at a time.

CPU: a bucket is written into one /dev/shm segment, reused for every bucket of the push and unlinked after it.
CUDA: a bucket is a flat device buffer broadcast over an NCCL group of the trainer (rank 0) and the engine's
workers; that path needs a GPU and has not run yet (none on the machine it was written on).
"""

import mmap
import os
import socket
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch

from patchgym.inference.vllm_worker import DTYPES

ALIGN = 64  # byte offset of every tensor in a bucket: any dtype view of it is aligned
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

Rpc = Callable[..., list]  # rpc(method, **kwargs) -> one result per worker


@dataclass
class PushStats:
    """What one push moved: tensors, buckets, bytes, and the largest bucket (the memory it needed beyond the model
    and the one tensor being gathered)."""

    tensors: int = 0
    buckets: int = 0
    bytes: int = 0
    largest_bucket: int = 0
    transport: str = "shm"


def untied(state_dict) -> Iterator[tuple[str, torch.Tensor]]:
    """A state dict's (name, tensor) pairs, without the names that share another's storage (tied embeddings: vLLM
    ties them itself). A DTensor is keyed by its local shard. Only for tensors that all stay alive (a model's own, a
    state dict held whole): a freed tensor's address can be reused."""
    seen = set()
    for name, tensor in state_dict.items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            yield name, tensor


def push(items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, dtype: torch.dtype, buffer,
         send: Callable[[int, list], object], stats: PushStats) -> PushStats:
    """Copy each tensor, as `items` yields it, into `buffer` (in `dtype`, at a 64-byte aligned offset); when the next
    one would overfill `bucket_bytes`, `send(nbytes, entries)` the bucket and start over at offset 0. A tensor
    larger than a bucket travels alone. Entries are [name, dtype, shape, offset] rows, the worker's description."""
    rows: list = []
    used = 0

    def flush() -> None:
        send(used, rows)
        stats.tensors += len(rows)
        stats.buckets += 1
        stats.bytes += used
        stats.largest_bucket = max(stats.largest_bucket, used)

    for name, tensor in items:
        size = tensor.numel() * dtype.itemsize
        offset = _aligned(used)
        if rows and offset + size > bucket_bytes:
            flush()
            rows, offset = [], 0
        buffer.write(offset, tensor.detach(), dtype)
        rows.append([name, DTYPE_NAMES[dtype], list(tensor.shape), offset])
        used = offset + size
    if rows:
        flush()
    return stats


class ShmSegment:
    """One /dev/shm file, grown to the largest bucket and written in place for every bucket; unlinked on close."""

    def __init__(self, size: int):
        directory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        fd, self.path = tempfile.mkstemp(prefix="patchgym-push-", dir=directory)
        self._file = os.fdopen(fd, "r+b", buffering=0)
        self.size, self._map = 0, None
        self._resize(size)

    def write(self, offset: int, tensor: torch.Tensor, dtype: torch.dtype) -> None:
        size = tensor.numel() * dtype.itemsize
        if offset + size > self.size:
            self._resize(offset + size)
        flat = torch.frombuffer(self._map, dtype=torch.uint8, count=size, offset=offset)
        with torch.no_grad():
            flat.view(dtype).view(tensor.shape).copy_(tensor)
        del flat  # the map cannot be closed or grown while a tensor still exports it

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        self._file.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _resize(self, size: int) -> None:
        if self._map is not None:
            self._map.close()
        os.ftruncate(self._file.fileno(), size)
        self._map, self.size = mmap.mmap(self._file.fileno(), size), size


def push_shm(rpc: Rpc, items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, dtype: torch.dtype) -> PushStats:
    """begin, one load per bucket through a reused /dev/shm segment, finish; the segment is gone afterwards."""
    stats = PushStats(transport="shm")
    segment = ShmSegment(min(bucket_bytes, 1 << 20))
    try:
        rpc("patchgym_begin_push")
        push(items, bucket_bytes, dtype, segment,
             lambda nbytes, rows: rpc("patchgym_load_shm", path=segment.path, nbytes=nbytes, entries=rows), stats)
        rpc("patchgym_finish_push")
    finally:
        segment.close()
    return stats


class _DeviceBuffer:
    """A flat uint8 tensor on the trainer's GPU, grown to the largest bucket."""

    def __init__(self, device: torch.device):
        self.device, self.flat = device, torch.empty(0, dtype=torch.uint8, device=device)

    def write(self, offset: int, tensor: torch.Tensor, dtype: torch.dtype) -> None:
        size = tensor.numel() * dtype.itemsize
        if offset + size > self.flat.numel():
            grown = torch.empty(offset + size, dtype=torch.uint8, device=self.device)
            grown[:offset].copy_(self.flat[:offset])
            self.flat = grown
        with torch.no_grad():
            self.flat[offset:offset + size].view(dtype).view(tensor.shape).copy_(tensor)


class NcclChannel:
    """The trainer's end of an NCCL group with the engine's workers (trainer = rank 0). Needs CUDA and vLLM's
    PyNccl; untested here (no GPU on the machine this was written on)."""

    def __init__(self, rpc: Rpc, workers: int, device: torch.device):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        host, port = "127.0.0.1", _free_port()
        world = 1 + workers
        joined = _in_thread(lambda: rpc("patchgym_init_nccl", host=host, port=port, world=world))
        group = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world)
        self.comm, self.device = PyNcclCommunicator(group, device=device), device
        joined()

    def push(self, rpc: Rpc, items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
             dtype: torch.dtype) -> PushStats:
        buffer = _DeviceBuffer(self.device)

        def send(nbytes: int, rows: list) -> None:
            loaded = _in_thread(lambda: rpc("patchgym_load_nccl", nbytes=nbytes, entries=rows))
            self.comm.broadcast(buffer.flat[:nbytes], src=0, stream=torch.cuda.current_stream())
            torch.cuda.current_stream().synchronize()
            loaded()

        rpc("patchgym_begin_push")
        stats = push(items, bucket_bytes, dtype, buffer, send, PushStats(transport="nccl"))
        rpc("patchgym_finish_push")
        return stats


def _in_thread(call: Callable[[], object]) -> Callable[[], object]:
    """Start `call` in a thread (an RPC that blocks until this side joins the collective); returns its join, which
    re-raises what it raised."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the joiner
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> object:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    return join


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
