"""Model FLOPs per token of one training step of each method (forward + backward, every network the
method runs), counted by torch.utils.flop_counter on real tensors: the numbers behind docs/scaling.md.

    python bench/method_flops.py                     # the base preset, one 512-token sequence (~2 min on CPU)
    python bench/method_flops.py --preset small --seq-len 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from electralab.config import parse_params  # noqa: E402
from electralab.objectives import build_objective  # noqa: E402
from electralab.runs import resolve_run  # noqa: E402
from electralab.train.perf import count_flops  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from train_step import make_batch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="base")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--runs", nargs="+", default=["mlm", "electra", "teams", "amos", "cocolm"])
    args = ap.parse_args()
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["preset"] = args.preset
    params = parse_params(raw)
    batch = make_batch(1, args.seq_len, args.vocab, torch.device("cpu"))
    print(f"preset={args.preset} seq_len={args.seq_len} vocab={args.vocab}")
    for name in args.runs:
        run = resolve_run(params, name)
        torch.manual_seed(0)
        objective = build_objective(run.method, run.settings, run.model, run.generators, args.vocab)
        _, flops = count_flops(lambda: objective(batch).loss.backward())
        print(f"{name:<10} {flops / args.seq_len / 1e9:8.3f} GFLOP/token")


if __name__ == "__main__":
    main()
