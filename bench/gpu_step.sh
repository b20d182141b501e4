#!/bin/bash
# The GPU checks of issue 38, one a device command (device tool, timeout 600 s):
#   bash bench/gpu_step.sh small       # the training step, ELECTRA-Small at 128 x 128 tokens
#   bash bench/gpu_step.sh base [B]    # the training step, BERT-base at B x 512 (default 32; ours only when B > 32)
#   bash bench/gpu_step.sh finetune    # the small preset's MRPC and STS-B grids, trials together as CUDA graphs; then
#                                      # MRPC's with the eager step together, the baseline on the same GPU
# The step: ours and transformers' ELECTRA, eager and torch.compile'd, and our static step compiled whole (fullgraph)
# and replayed as CUDA graphs, under bf16 autocast (bench/train_step.py). Fine-tuning: bench/finetune_grid.py on the
# data `python bench/gpu_sprint.py prep` packed (carry .sprint/carry). Logs and JSON go to $OUT (the device tool's)
# or bench/out/gpu.
set -u
config=${1:?small, base or finetune}
out=${OUT:-bench/out/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  nproc; uptime; date -u +%FT%TZ; git log -1 --format=%h 2>/dev/null; } | tee "$out/machine_$config.txt"
if [ "$config" = finetune ]; then
  data=/tmp/electralab-finetune
  mkdir -p "$data" && tar -xJf .sprint/carry/data.tar.xz -C "$data" || exit 2
  grid=(python3 bench/finetune_grid.py --preset small --vocab "$data/vocab" --data "$data" --alone 0)
  timeout -k 10 "${FINETUNE_SECONDS:-300}" "${grid[@]}" --tasks mrpc stsb --step cuda_graphs \
    --out "$out/finetune_grid.json" 2>&1 | grep --line-buffered -v "^W[0-9]" | tee "$out/finetune_grid.log"
  rc=${PIPESTATUS[0]}
  timeout -k 10 "${BASELINE_SECONDS:-200}" "${grid[@]}" --tasks mrpc --step dynamic \
    --out "$out/finetune_grid_dynamic.json" 2>&1 | grep --line-buffered -v "^W[0-9]" | tee "$out/finetune_grid_dynamic.log"
  baseline=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && exit "$rc"
  exit "$baseline"
fi
batch=${2:-}
case $config in
  small) shape=(--config small --seq-len 128 --batch-size "${batch:-128}" --steps 20) ;;
  base) shape=(--config base --seq-len 512 --batch-size "${batch:-32}" --steps 10) ;;
  *) echo "bench/gpu_step.sh: config $config: choose small, base or finetune" >&2; exit 2 ;;
esac
peers=(--compile)
[ -n "$batch" ] && peers=(--ours-only)  # another batch: our static step's scaling only (each compile costs a minute)
python3 bench/train_step.py --device cuda --precision bf16 "${shape[@]}" "${peers[@]}" --static 2>&1 \
  | grep --line-buffered -v "^W[0-9]" | tee "$out/train_step_$config${batch:+_b$batch}.log"
rc=${PIPESTATUS[0]}
cp bench/out/train_step_cuda_"$config"_*.json "$out/" 2>/dev/null
exit "$rc"
