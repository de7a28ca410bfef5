#!/usr/bin/env bash
# patchgym's GPU figures, ready to run unchanged on a GPU machine (no download: random-init models of real shapes).
#
#   bench/gpu.sh [--tiny] [--vllm] [--out DIR]
#
# Full mode (needs CUDA and vLLM): Qwen3-1.7B and Qwen3-8B shapes written to DIR/models once (bench/gpu_models.py),
# then, one JSON line per measure (also appended to DIR/results.jsonl):
#   rollout       tokens/s of bare vLLM and of patchgym's VLLMEngine on the same prompts (target: >= 0.8x), per model
#   train         FSDP2 policy update over every GPU (torchrun), MFU = 6*N*tokens / time / peak (target >= 40%), 1.7B
#   sync_gather   the trainer's half of a weight push (FSDP2 gather + buckets through /dev/shm), checked byte for byte
#   long_context  a 32K-token sequence with train.sequence_parallel = #GPUs
#   sync          a weight push into a running VLLMEngine (NCCL on CUDA), per model
# and a last line {"measure": "summary", ...}. A measure that fails says so in its line; the others still run.
# --tiny: the same code on CPU with a 2-layer Qwen3, 2 gloo ranks, in under a minute; it skips the vLLM measures
# (a server start costs ~40 s there) unless --vllm is given. Exit status 1 when any measure failed.
set -uo pipefail
cd "$(dirname "$0")/.."

TINY=0 VLLM=0 OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tiny) TINY=1 ;;
    --vllm) VLLM=1 ;;
    --out) OUT="$2"; shift ;;
    *) echo "usage: bench/gpu.sh [--tiny] [--vllm] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
# The project's environment, as the make targets use it (`make install` makes .venv); PYTHON overrides it.
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="${PYTHON:-python}"; fi
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "$OUT" ]; then OUT="$(mktemp -d "${TMPDIR:-/tmp}/patchgym-gpu-bench-XXXXXX")"; fi
mkdir -p "$OUT"
export GPU_BENCH_OUT="$OUT/results.jsonl"
: > "$GPU_BENCH_OUT"
status=0

if [ "$TINY" = 1 ]; then
  export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
  RANKS=2 ROLLOUT_MODELS="qwen3-tiny" TRAIN_MODEL="qwen3-tiny"
  TRAIN_ARGS=(--tiny --sequences 2 --seq-len 256 --steps 1 --bucket-mb 0.05 --long-len 1024)
  ROLLOUT_ARGS=(--prompts 4 --max-new-tokens 16 --max-model-len 1024 --kv-cache-gb 0.25 --dtype float32)
  MODEL_ARGS=(--tiny)
else
  RANKS="$("$PY" -c 'import torch; print(max(1, torch.cuda.device_count()))')"
  ROLLOUT_MODELS="qwen3-1.7b qwen3-8b" TRAIN_MODEL="qwen3-1.7b"
  TRAIN_ARGS=(--sequences 4 --seq-len 4096 --steps 3 --bucket-mb 256 --long-len 32768)
  ROLLOUT_ARGS=(--prompts 64 --max-new-tokens 512 --max-model-len 4096 --kv-cache-gb 40)
  MODEL_ARGS=()
fi

"$PY" -m torch.distributed.run --standalone --nproc-per-node "$RANKS" bench/gpu_train.py \
  --model "$TRAIN_MODEL" --models-dir "$OUT/models" "${TRAIN_ARGS[@]}" || status=1

for name in $ROLLOUT_MODELS; do
  if [ "$TINY" = 1 ] && [ "$VLLM" = 0 ]; then
    for measure in "rollout bare" "rollout patchgym" "sync -"; do
      set -- $measure
      printf '{"measure": "%s", "status": "skipped", "model": "%s"%s, "reason": "tiny mode: a vLLM server start (~40 s on CPU) is over its budget; bench/gpu.sh --tiny --vllm runs it"}\n' \
        "$1" "$name" "$([ "$2" = - ] || echo ", \"engine\": \"$2\"")" | tee -a "$GPU_BENCH_OUT"
    done
    continue
  fi
  "$PY" bench/gpu_models.py "$OUT/models" "${MODEL_ARGS[@]}" > /dev/null || { status=1; break; }  # once each
  dir="$OUT/models/$name"
  "$PY" bench/gpu_rollout.py rollout --engine bare --model "$dir" "${ROLLOUT_ARGS[@]}" || status=1
  "$PY" bench/gpu_rollout.py rollout --engine patchgym --model "$dir" "${ROLLOUT_ARGS[@]}" || status=1
  "$PY" bench/gpu_rollout.py sync --model "$dir" "${ROLLOUT_ARGS[@]}" || status=1
done

"$PY" bench/gpu_common.py summary "$GPU_BENCH_OUT"
echo "results: $GPU_BENCH_OUT" >&2
exit $status
