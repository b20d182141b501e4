"""Benchmark: the pretraining loop against its bare step, same configuration, same batches, one run.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/loop_overhead.py           # the active preset's electra
    # options: --run mlm  --steps 120  --repeat 2  --threads 2  --corpus-mb 8

Builds shards of the active preset's vocabulary size and sequence length from the first `--corpus-mb`
MB of the offline mirror's Wikipedia (once, in a temporary directory), then times, in fresh child
processes that alternate:

- **loop**: `electralab.train.loop.pretrain` exactly as the `pretrain` stage runs it (the preset's
  precision, dropout, logging, checkpoints, held-out diagnostics and guard at the preset's cadence (its
  thresholds opened: a short run is still in its dead phase), MLflow to a SQLite store, fraction
  checkpoints), for `--steps` steps; tokens/s = tokens trained / the loop's own elapsed time
  (from the first step to the last, set-up excluded: the loop's `wall_hours`);
- **step**: the same objective, optimiser, schedule, precision and dropout, fed by the same loader
  from the same seed, with nothing but forward, backward, clipping and the optimiser step.

The issue's target: the loop within 10% of the step. Reported per variant: the best tokens/s over
`--repeat` runs, and their ratio; JSON -> bench/out/loop_overhead.json. Load average noted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def build_shards(work: Path, corpus_mb: float) -> Path:
    """Corpus slice -> vocabulary -> shards with the active preset's data settings."""
    from electralab.config import CorpusConfig, MirrorSource, load_params
    from electralab.data.corpus import build_corpus
    from electralab.data.shards import build_shards as shards
    from electralab.data.vocab import train_vocab
    from electralab.env import data_root

    preset = load_params(ROOT / "params.yaml").active
    root = data_root()
    if root is None:
        sys.exit("set ELECTRALAB_DATA to the offline mirror (e.g. ../shared/data)")
    source = root / "corpus" / "enwiki_featured_articles.txt"
    (work / "mirror" / "corpus").mkdir(parents=True)
    with open(source, "rb") as f:
        data = f.read(int(corpus_mb * 1e6))
    (work / "mirror" / "corpus" / source.name).write_bytes(data[: data.rfind(b"\n\n") + 2])
    corpus = CorpusConfig(hub=(), mirror=(MirrorSource(source.name),), uncased=preset.corpus.uncased)
    build_corpus(corpus, work / "corpus", work / "mirror", where="bench")
    train_vocab(work / "corpus", work / "vocab", preset.vocab, where="bench")
    shards(work / "corpus", work / "vocab", work / "shards", preset.shards)
    return work / "shards"


def resolved(run_name: str, steps: int):
    from electralab.config import load_params
    from electralab.runs import resolve_run

    run = resolve_run(load_params(ROOT / "params.yaml"), run_name)
    # The guard measures at the preset's cadence, as in the stage, but a dead phase cannot stop the run:
    # a short run is still in it (docs/findings.md), and this bench times the loop, not the run.
    guard = dataclasses.replace(run.pretrain.guard, max_token_cosine=1.0, min_base_rate_gain=0.0)
    return dataclasses.replace(run, pretrain=dataclasses.replace(run.pretrain, steps=steps, guard=guard))


def time_loop(run, shards: Path, work: Path) -> float:
    from electralab.train.loop import pretrain

    summary = pretrain(run, shards, work / "out", work / "scratch", show_progress=False)
    return summary["tokens"] / (summary["wall_hours"] * 3600)


def time_step(run, shards: Path) -> float:
    import torch

    from electralab.data.loader import PretrainLoader
    from electralab.model.encoder import set_dropout
    from electralab.objectives import build_objective
    from electralab.train.common import autocast, resolve_precision
    from electralab.train.loop import make_optimizer, make_schedule, seed_step

    cfg, device = run.pretrain, torch.device("cpu")
    precision = resolve_precision(cfg.precision, device)
    loader = PretrainLoader(
        shards, "train", micro_batch_size=cfg.micro_batch_size, seed=run.seed, masking=run.settings.masking
    )
    torch.manual_seed(run.seed)
    objective = build_objective(run.method, run.settings, run.model, run.generators, loader.vocab_size)
    if cfg.dropout is not None:
        set_dropout(objective, cfg.dropout)
    optimizer, accumulation = make_optimizer(objective, cfg), cfg.batch_size // cfg.micro_batch_size
    schedule = make_schedule(optimizer, cfg)
    batches = iter(loader)
    start = time.perf_counter()
    for step in range(cfg.steps):
        seed_step(run.seed, step, 0)
        for _ in range(accumulation):
            with autocast(device, precision):
                (objective(next(batches), progress=step / cfg.steps).loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), cfg.clip_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    return cfg.steps * cfg.batch_size * loader.seq_len / (time.perf_counter() - start)


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    run, work = resolved(args.run, args.steps), Path(args.work)
    if args.variant == "loop":
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        tokens_per_s = time_loop(run, work / "shards", work / f"loop{os.getpid()}")
    else:
        tokens_per_s = time_step(run, work / "shards")
    print(json.dumps({"tokens_per_s": tokens_per_s}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="electra")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus-mb", type=float, default=8.0)
    ap.add_argument("--variant", choices=("loop", "step"), help=argparse.SUPPRESS)  # child processes
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        return child(args)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_shards(work, args.corpus_mb)
        results: dict[str, list[float]] = {"loop": [], "step": []}
        loads = [os.getloadavg()[0]]
        for _ in range(args.repeat):
            for variant in ("step", "loop"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--variant",
                    variant,
                    "--work",
                    str(work),
                    "--run",
                    args.run,
                    "--steps",
                    str(args.steps),
                    "--threads",
                    str(args.threads),
                ]
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}
                )
                if proc.returncode:
                    sys.exit(proc.stderr[-3000:])
                results[variant].append(json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"])
                loads.append(os.getloadavg()[0])
                print(f"{variant}: {results[variant][-1]:,.0f} tokens/s (load {loads[-1]:.1f})", flush=True)
    best = {k: max(v) for k, v in results.items()}
    report = {
        "run": args.run,
        "steps": args.steps,
        "threads": args.threads,
        "tokens_per_s": results,
        "best": best,
        "loop_over_step": best["loop"] / best["step"],
        "load_average": loads,
    }
    print(
        f"best: loop {best['loop']:,.0f} tokens/s, step {best['step']:,.0f} tokens/s: the loop runs at "
        f"{report['loop_over_step']:.1%} of its step (target >= 90%); load {min(loads):.1f}-{max(loads):.1f}"
    )
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "loop_overhead.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
