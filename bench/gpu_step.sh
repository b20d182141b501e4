#!/bin/bash
# The GPU check of the training step (issue 38), one config a device command (device tool, timeout 600 s):
#   bash bench/gpu_step.sh small    # ELECTRA-Small at 128 x 128 tokens a step
#   bash bench/gpu_step.sh base     # BERT-base at 32 x 512
# Ours and transformers' ELECTRA, eager and torch.compile'd, and our static step compiled whole (fullgraph) and
# replayed as CUDA graphs, under bf16 autocast (bench/train_step.py). The log and the JSON go to $OUT (the device
# tool's) or bench/out/gpu.
set -u
config=${1:?small or base}
out=${OUT:-bench/out/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  nproc; uptime; date -u +%FT%TZ; } | tee "$out/machine_$config.txt"
case $config in
  small) shape=(--config small --seq-len 128 --batch-size 128 --steps 20) ;;
  base) shape=(--config base --seq-len 512 --batch-size 32 --steps 10) ;;
  *) echo "bench/gpu_step.sh: config $config: choose small or base" >&2; exit 2 ;;
esac
python3 bench/train_step.py --device cuda --precision bf16 "${shape[@]}" --compile --static 2>&1 \
  | grep -v '^W[0-9]' | tee "$out/train_step_$config.log"
rc=${PIPESTATUS[0]}
cp bench/out/train_step_cuda_"$config"_*.json "$out/" 2>/dev/null
exit "$rc"
