"""Runs inside vLLM's worker process (`--worker-extension-cls`): loads pushed weights bucket by bucket, in place.

A push is begin → load one bucket at a time → finish, each a `/collective_rpc` call. `begin` puts the model into
vLLM's layerwise reload (the path that works on the CPU backend, whose linear layers are prepacked): each layer
buffers the tensors it is given and is rebuilt (loaded, repacked) as soon as all of its parts have arrived, so a
fused group (q, k, v; gate, up) may span buckets. `finish` processes what is left (attention, layers given nothing
keep their old tensors) and empties the caches derived from the old weights.

A bucket arrives through a /dev/shm segment the trainer wrote (CPU), or through an NCCL broadcast from the trainer
(CUDA: untested here, no GPU on the machine it was written on). Either way it is copied into memory of the worker's
own, because a layer may hold a buffered tensor until a later bucket completes it. Imports only torch and vLLM.
"""

import math

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightSyncExtension:
    """Methods mixed into vLLM's Worker class (they see its `model_runner`), called by name through collective_rpc.
    Entries are [name, dtype, shape, byte offset] rows describing one bucket's tensors in a flat byte buffer."""

    def patchgym_begin_push(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def patchgym_load_shm(self, path: str, nbytes: int, entries: list) -> int:
        """Load the bucket in the first `nbytes` bytes of the shared-memory file `path`; the tensors loaded."""
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        with open(path, "rb", buffering=0) as segment:
            view, done = memoryview(buffer.numpy()), 0
            while done < nbytes:
                got = segment.readinto(view[done:])
                if not got:
                    raise EOFError(f"{path} holds {done} bytes, the bucket {nbytes}")
                done += got
        return self._load_bucket(buffer.to(self.model_runner.device), entries)

    def patchgym_rank(self) -> int:
        return self.rank

    def patchgym_init_nccl(self, host: str, port: int, world: int) -> None:
        """Join the trainer's NCCL group as rank 1 + this worker's rank (the trainer is rank 0)."""
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host=host, port=port, rank=1 + self.rank, world_size=world)
        self._patchgym_nccl = PyNcclCommunicator(group, device=self.device)

    def patchgym_load_nccl(self, nbytes: int, entries: list) -> int:
        """Receive one bucket broadcast by the trainer (rank 0) and load it."""
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._patchgym_nccl.broadcast(buffer, src=0, stream=torch.cuda.current_stream())
        torch.cuda.current_stream().synchronize()
        return self._load_bucket(buffer, entries)

    def patchgym_finish_push(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        runner = self.model_runner
        finalize_layerwise_reload(runner.get_model(), runner.model_config)
        _retie_head(runner.get_model(), runner.model_config)
        runner.reset_lora_state()  # what vLLM's own reload_weights resets after a reload
        runner.reset_encoder_cache()
        runner.reset_mm_cache()

    def _load_bucket(self, buffer: torch.Tensor, entries: list) -> int:
        tensors = bucket_tensors(buffer, entries)
        with torch.no_grad():
            self.model_runner.get_model().load_weights(iter(tensors))
        return len(tensors)


def _retie_head(model: torch.nn.Module, model_config) -> None:
    """With tied embeddings the output head shares the input embedding's weight, but the reload rebuilt the
    embedding with a tensor of its own and left the head (given no tensor of its own) on the old one, and on CPU on
    the old one's prepacked copy: tie it to the new weight again and redo its after-loading step (the repack)."""
    if not getattr(model_config.hf_config, "tie_word_embeddings", False):
        return
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    head = getattr(model, "lm_head", None)
    embeds = [m for m in model.modules() if type(m) is VocabParallelEmbedding]
    if not isinstance(head, ParallelLMHead) or len(embeds) != 1:
        return
    if head.weight is not embeds[0].weight:
        head.weight = embeds[0].weight
    head.quant_method.process_weights_after_loading(head)


def bucket_tensors(buffer: torch.Tensor, entries: list) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs a flat uint8 `buffer` holds, by its [name, dtype, shape, offset] entries (views)."""
    tensors = []
    for name, dtype, shape, offset in entries:
        dtype = DTYPES[dtype]
        nbytes = dtype.itemsize * math.prod(shape)
        tensors.append((name, buffer[offset:offset + nbytes].view(dtype).view(shape)))
    return tensors
