"""Benchmark: model FLOPs of one pretraining step for every run of the active preset, and what they cost.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/pretrain_cost.py             # needs data/shards
    PYTHONPATH=src python bench/pretrain_cost.py --gflops 54 --overhead 10                  # set the rates

FLOP counts do not depend on what else the machine is doing, unlike a wall clock on a shared machine: this
builds every run's objective (electralab.objectives.build_objective), runs one forward + backward of one
micro-batch of the real shards under torch's FLOP counter (as the training loop does for its MFU), and turns
FLOPs into time with an effective FLOP/s rate measured elsewhere: by default the one the `mlm` run reached,
read from metrics/pretrain/mlm.json (flops_per_step / step_time_s). Estimated seconds per run =
steps x FLOPs per step / rate + a fixed per-run overhead (interpreter and library start-up, MLflow run, exports
and DVC's own work: measured by bench/pipeline_timing.py as stage wall minus the training loop).
Writes bench/out/pretrain_cost.json and prints a Markdown summary per method.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from electralab.config import load_params
from electralab.data.loader import PretrainLoader
from electralab.io import read_json
from electralab.objectives import build_objective
from electralab.runs import producer_of, resolve_all
from electralab.train.perf import count_flops

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=HERE.parent)
    parser.add_argument("--gflops", type=float, help="effective GFLOP/s (default: from metrics/pretrain/mlm.json)")
    parser.add_argument("--overhead", type=float, default=10.0, help="fixed seconds per run (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "pretrain_cost.json")
    args = parser.parse_args()

    params = load_params(args.project / "params.yaml")
    runs = resolve_all(params)
    shards = args.project / "data" / "shards"
    vocab_size = int(read_json(shards / "manifest.json")["vocab_size"])
    if args.gflops is None:
        mlm = read_json(args.project / "metrics" / "pretrain" / "mlm.json")
        args.gflops = mlm["flops_per_step"] / mlm["step_time_s"] / 1e9
    rows, flops_of = [], {}
    for name, run in runs.items():
        cfg = run.pretrain
        started = time.perf_counter()
        producer = producer_of(run.spec.reads)
        if producer is not None:  # built on another run's output (not there yet): that run's model, same FLOPs
            flops = flops_of[producer]
        elif run.method == "none":  # the no-pretraining control takes no step
            flops = 0
        else:
            loader = PretrainLoader(
                shards, "train", micro_batch_size=cfg.micro_batch_size, seed=run.seed, masking=run.settings.masking
            )
            batch = next(iter(loader))
            torch.manual_seed(run.seed)
            objective = build_objective(run.method, run.settings, run.model, run.generators, vocab_size).train()
            _, flops = count_flops(lambda: objective(batch, progress=0.5).loss.backward())
        flops_of[name] = flops
        per_step = flops * (cfg.batch_size // cfg.micro_batch_size)
        seconds = (cfg.steps * per_step / (args.gflops * 1e9) if flops else 0.0) + args.overhead
        rows.append(
            {
                "run": name,
                "method": run.method,
                "gflop_per_step": round(per_step / 1e9, 2),
                "estimated_s": round(seconds, 1),
                "measure_s": round(time.perf_counter() - started, 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    total = sum(r["estimated_s"] for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "preset": params.preset,
                "gflops": args.gflops,
                "overhead_s": args.overhead,
                "total_estimated_s": round(total, 1),
                "runs": rows,
            },
            indent=2,
        )
    )
    print(
        f"\npreset {params.preset}: {len(rows)} runs, {params.active.pretrain.steps} steps "
        "(budgets: each run's own); rate "
        f"{args.gflops:.1f} GFLOP/s, {args.overhead:.0f} s fixed per run\n"
    )
    print("| method | runs | GFLOP/step (min-max) | estimated min |\n|---|---|---|---|")
    for method in dict.fromkeys(r["method"] for r in rows):
        group = [r for r in rows if r["method"] == method]
        g = [r["gflop_per_step"] for r in group]
        print(
            f"| {method} | {len(group)} | {min(g):.1f}-{max(g):.1f} | {sum(r['estimated_s'] for r in group) / 60:.1f} |"
        )
    print(f"| all | {len(rows)} | | {total / 60:.1f} |\n-> {args.out}")


if __name__ == "__main__":
    main()
