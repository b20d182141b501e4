"""Benchmark: one run's fine-tuning grid on one device, its trials one at a time against together (issue 38).

    # a lent GPU (device tool): the small preset's STS-B and MRPC grids, data from `gpu_sprint.py prep`
    bash bench/gpu_step.sh finetune
    # CPU, a quick look at the tiny preset
    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/finetune_grid.py --preset tiny --vocab <dir> \
        --tasks rte --seeds 2 --train-examples 256 --eval-examples 128

For each task, the preset's grid x its seeds (the first `--seeds`) in the stage's packs (finetune.grid.packs: one
batch size and epoch count a pack, at most `--together` trials): each pack trained together in full, every step and
evaluation (finetune.batched.run_trials, as `finetune.resources.trials_together` trains it), and its first `--alone`
trials one at a time (finetune.trial.run_trial, as one trial a worker process runs); a pack's time alone is the mean
of its timed trials x its trials. The encoder has the preset's shape and fresh weights (a step's speed does not depend
on them) unless `--model` names an exported one. Reported: each pack's seconds both ways, the speed-up, its training
FLOPs (counted on the meta device: matmuls and attention, forward and backward, as the pretraining's MFU counts them)
and MFU against the device's peak, the grid's device-seconds, and each timed trial's final dev metric both ways. With
dropout the two ways draw different masks (finetune/batched.py), so their metrics agree in distribution, not digit for
digit; without dropout they agree within float tolerance (tests/test_finetune_batched.py). `--count-only` trains
nothing: each grid's FLOPs and its seconds at an H100's bf16 peak, the physical limit of a time target. JSON -> --out.

`--step` (default: the preset's `finetune.step`, "auto": CUDA graphs on a GPU) is the trials-together step
(finetune/batched.py); a compiled step's first pack of each task and pack size includes its compilation, as the
stage's would. `--alone 0` times no trial alone (the speed-up is then left out).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from train_step import sync  # noqa: E402

from electralab.config import load_params  # noqa: E402
from electralab.data.vocab import Tokenizer  # noqa: E402
from electralab.env import data_root, source_commit  # noqa: E402
from electralab.errors import EXPECTED_ERRORS, ConfigError  # noqa: E402
from electralab.export import load_encoder  # noqa: E402
from electralab.finetune.batched import resolve_step, run_trials  # noqa: E402
from electralab.finetune.data import prepare  # noqa: E402
from electralab.finetune.features import train_batches  # noqa: E402
from electralab.finetune.grid import Group, TrialSpec, configurations, packs  # noqa: E402
from electralab.finetune.model import FinetuneModel  # noqa: E402
from electralab.finetune.tasks import TASKS  # noqa: E402
from electralab.finetune.trial import TrialSettings, run_trial  # noqa: E402
from electralab.model.encoder import Encoder, make_token_embedding  # noqa: E402
from electralab.objectives.common import set_static  # noqa: E402
from electralab.runs import resolve_run  # noqa: E402
from electralab.train.common import resolve_precision  # noqa: E402
from electralab.train.perf import CUDA_BF16_PEAK, count_flops, peak_flops  # noqa: E402


def timed(fn, device: torch.device):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def epoch_flops(data, encoder: Encoder, batch_size: int, group_by_length: bool) -> int:
    """One trial's training FLOPs for one epoch (forward and backward; matmuls and attention, as the pretraining's MFU
    counts them), every batch as the stage pads it, counted on the meta device: shapes only, nothing computed."""
    model = FinetuneModel(copy.deepcopy(encoder), data.task).to("meta")
    set_static(model)  # the meta device cannot answer the host's questions (is any token padding?)
    by_shape: dict[tuple[int, ...], int] = {}  # a batch's FLOPs depend on its shape alone
    total = 0
    for index in train_batches(data.train.lengths, batch_size, np.random.default_rng(0), group_by_length):
        ids, mask, labels = (t.to("meta") for t in data.train.batch(index))
        if ids.shape not in by_shape:
            _, by_shape[ids.shape] = count_flops(lambda: model.loss(model(ids, mask), labels).backward())  # noqa: B023
        total += by_shape[ids.shape]
    return total


def final_metric(history: list[dict], metric: str) -> float | None:
    value = history[-1].get(metric)
    return None if value is None else round(float(value), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", required=True, help="the preset's vocabulary directory (the vocab stage's output)")
    parser.add_argument("--data", help="the GLUE mirror's root (default: $ELECTRALAB_DATA)")
    parser.add_argument("--model", help="an exported encoder (default: the preset's shape, fresh weights)")
    parser.add_argument("--tasks", nargs="+", default=["stsb", "mrpc"], choices=sorted(TASKS))
    parser.add_argument("--seeds", type=int, help="the first N of the preset's fine-tuning seeds (default: all)")
    parser.add_argument("--together", type=int, default=64, help="at most this many trials in one pack")
    parser.add_argument("--alone", type=int, default=1, help="trials of each pack timed one at a time (0: none)")
    parser.add_argument(
        "--step",
        choices=["auto", "dynamic", "static", "cuda_graphs"],
        help="the step of the trials together (default: the preset's finetune.step; finetune/batched.py)",
    )
    parser.add_argument("--train-examples", type=int, help="cap each task's training set (a quick look)")
    parser.add_argument("--eval-examples", type=int, help="cap each task's evaluation sets (a quick look)")
    parser.add_argument(
        "--count-only",
        action="store_true",
        help="no training: each grid's training FLOPs and its seconds at the bf16 peak of an H100 (the physical limit)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "finetune_grid.json"))
    args = parser.parse_args()

    device = torch.device(args.device)
    params = load_params(ROOT / "params.yaml")
    if args.preset not in params.presets:
        raise ConfigError(
            f"--preset {args.preset}: params.yaml has no such preset; choose from {sorted(params.presets)}"
        )
    params = dataclasses.replace(params, preset=args.preset)
    cfg = params.active.finetune
    if cfg is None:
        sys.exit(f"bench/finetune_grid.py: presets.{args.preset} has no finetune section")
    cfg = dataclasses.replace(cfg, max_train_examples=args.train_examples, max_eval_examples=args.eval_examples)
    settings = dataclasses.replace(TrialSettings.of(cfg), step=args.step or cfg.step)
    seeds = list(cfg.seeds[: args.seeds] if args.seeds else cfg.seeds)
    tokenizer = Tokenizer(args.vocab)
    if args.model:
        encoder = load_encoder(args.model)
    else:
        torch.manual_seed(0)
        shape = resolve_run(params, "electra").model
        encoder = Encoder(shape, make_token_embedding(tokenizer.vocab_size, shape.embedding))
    root = Path(args.data) if args.data else data_root()
    precision = resolve_precision(settings.precision, device)
    step = resolve_step(settings.step, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(
        f"{args.preset}: encoder {encoder.cfg.layers} x {encoder.cfg.hidden}, vocabulary {tokenizer.vocab_size}; "
        f"{device} ({name}), {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, load "
        f"{os.getloadavg()[0]:.2f}; seeds {seeds}, precision {precision}, step {step}",
        flush=True,
    )

    peak = CUDA_BF16_PEAK["H100"] if args.count_only else peak_flops(device, precision)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "peak_flops": peak,
        "preset": args.preset,
        "device": name,
        "precision": precision,
        "step": step,
        "seeds": seeds,
        "commit": source_commit(ROOT),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rows = []

    def write() -> None:  # after every pack: a command stopped at its limit keeps what it measured
        together, alone = sum(r.get("together_s", 0) for r in rows), sum(r.get("alone_s", 0) for r in rows)
        done = {
            "train_flops": sum(r["train_flops"] for r in rows),
            "together_s": together,
            "alone_s": alone,
            "load_average": os.getloadavg(),
            "packs": rows,
        }
        out.write_text(json.dumps({**meta, **done}, indent=2) + "\n")

    for task_name in args.tasks:
        task = TASKS[task_name]
        data = prepare(task, tokenizer, cfg, root)[1.0]
        metric = task.main_metric
        specs = [
            TrialSpec(Group(task_name), hp, seed) for hp in configurations(cfg.search_space(task)) for seed in seeds
        ]
        flops_per_epoch = {}  # batch size -> one trial's epoch
        for pack in packs(specs, args.together):
            hps, pack_seeds = [s.hparams for s in pack], [s.seed for s in pack]
            batch = hps[0].batch_size
            if batch not in flops_per_epoch:
                flops_per_epoch[batch] = epoch_flops(data, encoder, batch, settings.group_by_length)
            flops = flops_per_epoch[batch] * hps[0].epochs * len(pack)
            if args.count_only:
                rows.append(
                    {
                        "task": task_name,
                        "train_tokens": int(data.train.lengths.sum()),
                        "epochs": hps[0].epochs,
                        "trials": len(pack),
                        "train_flops": flops,
                        "seconds_at_peak": round(flops / peak, 2),
                    }
                )
                write()
                print(f"{task_name:6s} {hps[0].epochs:2d} epochs, {len(pack):2d} trials: {flops:.3g} FLOPs", flush=True)
                continue
            histories, together_s = timed(partial(run_trials, data, encoder, hps, pack_seeds, settings, device), device)
            alone = []
            for spec in pack[: args.alone]:
                history, seconds = timed(
                    partial(run_trial, data, encoder, spec.hparams, spec.seed, settings, device), device
                )
                alone.append((spec, history, seconds))
            alone_s = statistics.mean(s for _, _, s in alone) * len(pack) if alone else 0.0
            row = {
                "task": task_name,
                "train_examples": len(data.train),
                "epochs": hps[0].epochs,
                "batch_size": hps[0].batch_size,
                "trials": len(pack),
                "train_tokens": int(data.train.lengths.sum()),
                "train_flops": flops,
                "mfu_together": round(flops / together_s / peak, 4) if peak else None,
                "mfu_alone": round(flops / alone_s / peak, 4) if peak and alone else None,
                "together_s": round(together_s, 2),
                "alone_s": round(alone_s, 2),
                "alone_timed": len(alone),
                "speedup": round(alone_s / together_s, 2) if alone else None,
                "metric": metric,
                "metrics_together": [final_metric(h, metric) for h in histories],
                "metrics_alone": [final_metric(h, metric) for _, h, _ in alone],
            }
            rows.append(row)
            write()
            print(
                f"{task_name:5s} {row['epochs']:2d} epochs x {len(data.train)} examples, {len(pack):2d} trials: "
                f"together {together_s:7.1f} s, one at a time {alone_s:7.1f} s ({len(alone)} timed)  "
                f"x{row['speedup']}; {metric} together {row['metrics_together'][: len(alone)]} "
                f"alone {row['metrics_alone']}",
                flush=True,
            )
    flops = sum(r["train_flops"] for r in rows)
    if args.count_only:
        print(
            f"grid ({', '.join(args.tasks)}; {sum(r['trials'] for r in rows)} trials): {flops:.3g} training FLOPs, "
            f"{flops / peak:.1f} s at an H100's bf16 peak, {flops / peak / 0.3 / 60:.2f} minutes at 30% of it"
        )
        print(f"-> {out}")
        return
    together, alone = sum(r["together_s"] for r in rows), sum(r["alone_s"] for r in rows)
    print(
        f"grid ({', '.join(args.tasks)}; {sum(r['trials'] for r in rows)} trials): together {together:.1f} s "
        f"({together / 60:.2f} device-minutes)"
        + (f", one at a time {alone:.1f} s: x{alone / together:.2f}" if alone else "")
        + "; "
        f"{flops:.3g} training FLOPs" + (f", {flops / together / peak:.2%} MFU together" if peak else ""),
        flush=True,
    )
    print(f"-> {out}")


if __name__ == "__main__":
    try:
        main()
    except EXPECTED_ERRORS as error:  # bad input: one line naming it, no traceback
        sys.exit(f"error: {error}")
