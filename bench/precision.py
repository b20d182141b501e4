"""Evidence that bf16 autocast trains like fp32: the same run in both precisions, side by side.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/precision.py
    # options: --run electra  --steps 300  --tasks stsb mrpc cola  --seeds 1 2 3 4 5  --out bench/out/precision
    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/precision.py --encoder models/teams/encoder
    # a pretrained run's encoder (dvc repro pretrain@teams) fine-tuned in both precisions, no pretraining

Pretrains the active preset's `--run` for `--steps` steps twice from the same initial weights and
batches, once with `precision: fp32` and once with `precision: bf16` (the loop of the `pretrain` stage;
shards of the preset built once from the offline mirror under `--out/data`), then fine-tunes both
exported encoders on `--tasks` with the preset's fine-tuning settings in the same precision. Reported:
the two loss curves (every `log_every` steps) and their largest relative difference over the steps after
the warm-up, the tokens/s of each, and per task the median and spread over the seeds of each, with the
difference of the medians against the pooled spread. JSON and Markdown -> `--out`. With `--encoder`, the
pretraining is skipped: that one encoder (e.g. a full run of the preset, where the short runs above are
still near chance on some tasks) is fine-tuned in both precisions, which isolates the fine-tuning's share.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from signal_sweep import build_data, finetune_point  # noqa: E402


def loss_curve(tracking_uri: str, run_name: str) -> dict[int, float]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"tags.run = '{run_name}'",
        order_by=["attributes.start_time DESC"],
    )
    return {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, "loss")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="electra")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tasks", nargs="+", default=["stsb", "mrpc", "cola"])
    ap.add_argument("--seeds", nargs="+", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--encoder", type=Path, help="fine-tune this exported encoder in both precisions, no pretraining")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "precision")
    args = ap.parse_args()

    if args.encoder:
        from sentence_probe import check_encoders

        check_encoders(ap, [args.encoder])  # before --out is made

    from electralab.config import load_params
    from electralab.runs import resolve_run
    from electralab.train.common import cpu_has_native_bf16
    from electralab.train.loop import pretrain

    args.out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{(args.out / 'mlflow.db').resolve()}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    params = load_params(ROOT / "params.yaml")
    seeds = args.seeds or list(params.active.finetune.seeds)
    report: dict = {
        "run": str(args.encoder) if args.encoder else args.run,
        "steps": None if args.encoder else args.steps,
        "cpu_native_bf16": cpu_has_native_bf16(),
        "load_average_start": os.getloadavg()[0],
        "precisions": {},
    }
    if not args.encoder:
        shards, vocab = build_data(args.out)
        base = resolve_run(params, args.run)
    for precision in ("fp32", "bf16"):
        entry: dict = {}
        if args.encoder:
            encoder = args.encoder.resolve()
        else:
            cfg = dataclasses.replace(
                base.pretrain,
                steps=args.steps,
                precision=precision,
                checkpoint_fractions=(1.0,),
                warmup_steps=min(base.pretrain.warmup_steps, args.steps // 10),
            )
            run = dataclasses.replace(base, name=f"{args.run}-{precision}", pretrain=cfg)
            summary = pretrain(
                run,
                shards,
                args.out / "models" / run.name,
                args.out / "scratch" / run.name,
                vocab_dir=vocab,
                show_progress=False,
            )
            encoder = args.out / "models" / run.name / "encoder"
            entry = {"tokens_per_s": summary["tokens_per_s"], "loss": loss_curve(uri, run.name)}
        started = time.perf_counter()
        finetune_cfg = dataclasses.replace(params.active.finetune, precision=precision)
        entry["finetune"] = finetune_point(str(encoder), args.tasks, seeds, args.workers, finetune_cfg)
        entry["finetune_seconds"] = time.perf_counter() - started
        report["precisions"][precision] = entry
    if args.encoder:
        seconds = {k: v["finetune_seconds"] for k, v in report["precisions"].items()}
        heading = f"{args.encoder} fine-tuned in fp32 ({seconds['fp32']:.0f} s) and bf16 ({seconds['bf16']:.0f} s)"
        write_report(args, report, heading)
        return
    fp32, bf16 = report["precisions"]["fp32"], report["precisions"]["bf16"]
    after = [s for s in fp32["loss"] if s > cfg.warmup_steps and s in bf16["loss"]]
    report["max_relative_loss_difference"] = max(
        abs(bf16["loss"][s] - fp32["loss"][s]) / fp32["loss"][s] for s in after
    )
    heading = (
        f"{args.run}, {args.steps} steps: tokens/s fp32 {fp32['tokens_per_s']:,.0f}, bf16 {bf16['tokens_per_s']:,.0f} "
        f"({bf16['tokens_per_s'] / fp32['tokens_per_s']:.2f}x); largest relative loss difference after the warm-up "
        f"{report['max_relative_loss_difference']:.2%}"
    )
    write_report(args, report, heading)


def write_report(args, report: dict, heading: str) -> None:
    """Per task: each precision's median and spread over the seeds, their difference, the pooled spread."""
    fp32, bf16 = report["precisions"]["fp32"], report["precisions"]["bf16"]
    report["load_average_end"] = os.getloadavg()[0]
    # The seed fixes the head's initialisation, dropout and the batch order in both precisions, so the
    # per-seed differences pair up (the last column): their mean and spread isolate the precision from
    # the seeds' own spread.
    lines = [
        "| task | fp32 median ± std | bf16 median ± std | bf16 − fp32 | pooled std | paired bf16 − fp32 (mean ± std) |",
        "|---|---|---|---|---|---|",
    ]
    for task in args.tasks:
        a, b = fp32["finetune"][task], bf16["finetune"][task]
        pooled = (statistics.pvariance(a["seeds"].values()) / 2 + statistics.pvariance(b["seeds"].values()) / 2) ** 0.5
        paired = [b["seeds"][seed] - a["seeds"][seed] for seed in a["seeds"]]
        lines.append(
            f"| {task} | {a['median']:.2f} ± {a['std']:.2f} | {b['median']:.2f} ± {b['std']:.2f} | "
            f"{b['median'] - a['median']:+.2f} | {pooled:.2f} | {statistics.mean(paired):+.2f} ± "
            f"{statistics.stdev(paired) if len(paired) > 1 else 0:.2f} |"
        )
    text = (
        f"{heading}; load {report['load_average_start']:.1f}-{report['load_average_end']:.1f}\n\n"
        + "\n".join(lines)
        + "\n"
    )
    print(text)
    (args.out / "precision.md").write_text(text)
    (args.out / "precision.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
