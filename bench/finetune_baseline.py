"""Benchmark: the default preset's fine-tuning trials with this checkout's library against another checkout's
(issue 12's baseline: main when the issue was filed, b64b55c), in one run, on the same examples.

    git worktree add ../baseline b64b55c
    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/finetune_baseline.py --baseline ../baseline \
        --vocab models/amos/encoder
    # options: --tasks sst2 cola mrpc stsb rte  --examples 512  --eval-examples 512  --repeat 2  --seed 1

Each side is a fresh interpreter that imports its own checkout's `electralab` (PYTHONPATH=<checkout>/src) and
runs that library's `finetune.trial.run_trial` as a trial of the stage runs it: one thread, the tiny preset's
main shape (4 x 128 with relative positions, dropout 0.1), its grid configuration for the task (learning
rate, batch 32, warm-up, the task's epochs: 10 for STS-B and RTE, 3 for the rest), evaluation after the last
epoch, length-grouped batches, `precision: auto`. The settings come from this checkout's params.yaml and are
handed to both sides; a setting the other library has no field for is left out and named. Both sides train
on the same arrays: `--examples` training and `--eval-examples` dev examples of each task (a fixed random
subset), tokenised once here with the vocabulary of `--vocab` (as a stage tokenises once for all its trials).
The encoder is randomly initialised (its weights do not change the speed; one library's export may not load
in the other).

Reported per task: the trial's seconds (its own clock: model built to last evaluation), best of `--repeat`,
sides interleaved; and for the tasks together, trials per minute of one trial per task (each side's summed
seconds), the issue's measure ("trials per minute of the default preset's grid at least 3x today's").
JSON -> bench/out/finetune_baseline.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TASKS = ["sst2", "cola", "mrpc", "stsb", "rte"]  # the tasks the offline mirror has in full


def settings_of_this_checkout(run: str) -> dict:
    """The trial's shape and settings from this checkout's params.yaml (the tiny preset's `run`)."""
    sys.path.insert(0, str(ROOT / "src"))
    from electralab.config import load_params
    from electralab.finetune.grid import configurations
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.trial import TrialSettings
    from electralab.runs import resolve_run

    params = dataclasses.replace(load_params(ROOT / "params.yaml"), preset="tiny")
    finetune = params.active.finetune
    settings = dataclasses.asdict(TrialSettings.of(finetune))
    settings.pop("squad")  # no SQuAD at the tiny preset
    # the task's first configuration (the tiny preset's grids have one)
    grids = {name: dataclasses.asdict(configurations(finetune.search_space(TASKS[name]))[0]) for name in DEFAULT_TASKS}
    return {
        "encoder": dataclasses.asdict(resolve_run(params, run).model),
        "trial": settings,
        "grids": grids,
        "max_seq_len": finetune.max_seq_len,
    }


def side(args: argparse.Namespace) -> None:
    """One library's trials (this interpreter imports the checkout on PYTHONPATH): JSON on the last line."""
    import numpy as np
    import torch

    from electralab.config import EncoderConfig, SquadSettings
    from electralab.finetune.data import TaskData
    from electralab.finetune.features import Encoded
    from electralab.finetune.grid import HParams
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.trial import TrialSettings, run_trial
    from electralab.model.encoder import Encoder, make_token_embedding

    torch.set_num_threads(1)
    spec = json.loads(Path(args.spec).read_text())
    known = {f.name for f in dataclasses.fields(EncoderConfig)}
    cfg = EncoderConfig(**{k: v for k, v in spec["encoder"].items() if k in known})
    left_out = sorted(set(spec["encoder"]) - known)
    known = {f.name for f in dataclasses.fields(TrialSettings)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["trial"].items() if k in known}
    settings = TrialSettings(**given, squad=SquadSettings())
    left_out += sorted(set(spec["trial"]) - known)
    arrays = np.load(args.data)

    def encoded(key: str) -> Encoded:
        return Encoded(arrays[f"{key}.ids"], arrays[f"{key}.offsets"], arrays[f"{key}.labels"])

    def trial(name: str, hp: HParams, rows: int | None = None) -> list[dict]:
        task = TASKS[name]
        evals = [(s, encoded(f"{name}.{s.name}")) for s in task.eval_splits]
        train = encoded(f"{name}.train")
        if rows is not None:
            first = lambda e: e.subset(np.arange(min(rows, len(e))))  # noqa: E731
            train, evals = first(train), [(s, first(e)) for s, e in evals]
        torch.manual_seed(0)
        encoder = Encoder(cfg, make_token_embedding(spec["vocab_size"], cfg.embedding, cfg.initializer_range))
        return run_trial(TaskData(task, train, evals), encoder, hp, spec["seed"], settings)

    # untimed: the first trial in a process pays for first-call allocations and kernel selection
    trial(spec["tasks"][0], HParams(lr=1e-4, epochs=1, batch_size=32, warmup=0.1), rows=64)
    results = {}
    for name in spec["tasks"]:
        history = trial(name, HParams(**spec["grids"][name]))
        metrics = {k: v for k, v in history[-1].items() if k not in ("epoch", "seconds", "threads", "train_loss")}
        results[name] = {"seconds": history[-1]["seconds"], "metrics": metrics}
    print(json.dumps({"results": results, "left_out": left_out, "torch": torch.__version__}))


def tokenised_tasks(args: argparse.Namespace, max_seq_len: int, path: Path) -> int:
    """The same examples for both sides, tokenised once with this checkout's library (a stage tokenises once
    and ships the arrays to its trials): `--examples` training and `--eval-examples` dev examples of each task,
    a fixed random subset. Returns the vocabulary's size."""
    import numpy as np
    from finetune_throughput import task_sample  # imports this checkout's library: never in a side

    from electralab.data.vocab import Tokenizer
    from electralab.env import data_root
    from electralab.finetune.tasks import TASKS

    tokenizer = Tokenizer(args.vocab)
    arrays = {}
    for name in args.tasks:
        splits = [("train", args.examples)] + [(s.name, args.eval_examples) for s in TASKS[name].eval_splits]
        for split_name, n in splits:
            encoded = task_sample(name, tokenizer, data_root(), n, max_seq_len, split_name)
            for field in ("ids", "offsets", "labels"):
                arrays[f"{name}.{split_name}.{field}"] = getattr(encoded, field)
    np.savez(path, **arrays)
    return tokenizer.vocab_size


def run_side(checkout: Path, args: argparse.Namespace, spec: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--side", "--spec", str(spec), "--data", str(spec.with_suffix(".npz"))]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: the side at {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a checkout of the library to compare with (issue 12's: b64b55c)")
    parser.add_argument("--vocab", default=str(ROOT / "models" / "amos" / "encoder"), help="a vocabulary's directory")
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=DEFAULT_TASKS)
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--eval-examples", type=int, default=512)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--run", default="amos", help="the tiny preset's run whose main shape is trained")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "finetune_baseline.json"))
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return side(args)
    if not args.baseline or not (Path(args.baseline) / "src" / "electralab").is_dir():
        sys.exit(f"error: --baseline {args.baseline}: not a checkout of electralab (no src/electralab)")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = out.with_suffix(".spec.json")
    settings = settings_of_this_checkout(args.run)
    from electralab.errors import DataError

    try:
        vocab_size = tokenised_tasks(args, settings["max_seq_len"], spec.with_suffix(".npz"))
    except DataError as e:
        sys.exit(f"error: {e}")
    spec.write_text(json.dumps({**settings, "tasks": args.tasks, "seed": args.seed, "vocab_size": vocab_size}))
    sides = {"now": ROOT, "baseline": Path(args.baseline).resolve()}
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, one thread a side; tasks "
        f"{args.tasks}, {args.examples} training / {args.eval_examples} dev examples; load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    best: dict[str, dict] = {}
    try:
        for attempt in range(args.repeat):
            for name, checkout in sides.items():  # interleaved: a load spike hits both sides alike
                started = time.perf_counter()
                got = run_side(checkout, args, spec)
                print(
                    f"  pass {attempt + 1}, {name}: "
                    + ", ".join(f"{t} {r['seconds']:.1f} s" for t, r in got["results"].items())
                    + f" ({time.perf_counter() - started:.0f} s with start-up; load {os.getloadavg()[0]:.2f})"
                    + (f"; settings it has no field for: {got['left_out']}" if got["left_out"] else ""),
                    flush=True,
                )
                if name not in best:
                    best[name] = got
                for task, r in got["results"].items():
                    if r["seconds"] < best[name]["results"][task]["seconds"]:
                        best[name]["results"][task] = r
    finally:  # the inputs handed to the sides are scratch: nothing is left behind
        spec.unlink()
        spec.with_suffix(".npz").unlink()
    rows = []
    for task in args.tasks:
        now, then = best["now"]["results"][task], best["baseline"]["results"][task]
        rows.append(
            {
                "task": task,
                "seconds_baseline": round(then["seconds"], 2),
                "seconds_now": round(now["seconds"], 2),
                "speedup": round(then["seconds"] / now["seconds"], 2),
                "metrics_baseline": then["metrics"],
                "metrics_now": now["metrics"],
            }
        )
        print(f"{task}: baseline {then['seconds']:.1f} s, now {now['seconds']:.1f} s: {rows[-1]['speedup']:.2f}x")
    total_then = sum(r["seconds_baseline"] for r in rows)
    total_now = sum(r["seconds_now"] for r in rows)
    per_minute = {"baseline": 60 * len(rows) / total_then, "now": 60 * len(rows) / total_now}
    print(
        f"one trial per task: {per_minute['baseline']:.2f} trials/min baseline, {per_minute['now']:.2f} now: "
        f"{total_then / total_now:.2f}x"
    )
    summary = {
        "baseline": str(sides["baseline"]),
        "tasks": rows,
        "trials_per_minute": per_minute,
        "speedup": round(total_then / total_now, 2),
        "examples": args.examples,
        "eval_examples": args.eval_examples,
        "torch": best["now"]["torch"],
        "load_average_end": os.getloadavg()[0],
    }
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
