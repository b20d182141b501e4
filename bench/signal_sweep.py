"""The signal sweep: what a few CPU-minutes of pretraining buy over no pretraining, at several budgets.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/signal_sweep.py        # the active preset
    # options: --methods mlm electra  --steps 250 500 1000 2000  --tasks stsb mrpc cola sst2 rte
    #          --seeds 1 2 3 4 5  --out bench/out/signal_sweep  --workers 2

For each method and each budget (a number of steps; the schedule is tied to it as the preset ties it:
warm-up as the preset's fraction of the steps, linear decay to zero at the last step) it pretrains the
active preset's run of that method with `electralab.train.loop.pretrain` (the stage's own loop: the
preset's shape, batch, lr, precision, dropout, guard), then fine-tunes the exported encoder on
`--tasks` with the preset's fine-tuning settings (its grid, seeds, caps; every configuration x seed,
the configuration with the best median kept, as the stage does) and does the same for the encoder
with no pretraining at all (the control). Results land in `--out`:

- `points.csv`: one line per (method, steps): tokens, pretraining minutes (wall and CPU), the load
  average, each task's median and the seeds' spread, the signal score and its spread;
- `sweep.md`: the same as a table, with the control's line and the verdict per point: the signal score
  (mean of the tasks' medians: STS-B Spearman, MRPC accuracy, CoLA MCC by default) minus the
  control's, against twice the pooled spread of the per-seed scores (the issue's target).

Every finished point is kept (`points/<method>-<steps>.json`): an interrupted sweep resumes where it
stopped. The data (corpus, vocabulary, shards of the preset) is built once under `--out/data`.
docs/findings.md ("How the tiny preset was chosen") reads the sweep that chose the default preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SIGNAL_TASKS = ("stsb", "mrpc", "cola")  # where pretraining matters most at small scale (issue 11)


def build_data(out: Path, vocab: dict | None = None) -> tuple[Path, Path]:
    """The active preset's corpus -> vocab -> shards, once; `vocab` overrides keys of its vocabulary
    (e.g. {"size": 4096}), built beside the preset's own under a name that says which."""
    from electralab.config import VocabConfig, build, load_params, to_dict
    from electralab.data.corpus import build_corpus
    from electralab.data.shards import build_shards
    from electralab.data.vocab import train_vocab
    from electralab.env import data_root

    preset = load_params(ROOT / "params.yaml").active
    vocab_cfg = build(VocabConfig, {**to_dict(preset.vocab), **(vocab or {})}, "vocab")
    data = out / "data"
    corpus = data / "corpus"
    suffix = "".join(f"-{key}{value}" for key, value in sorted((vocab or {}).items()))
    vocab_dir, shards = data / f"vocab{suffix}", data / f"shards{suffix}"
    if not (corpus / "manifest.json").is_file():
        build_corpus(preset.corpus, corpus, data_root(), where="sweep")
    if not (shards / "manifest.json").is_file():
        train_vocab(corpus, vocab_dir, vocab_cfg, where="sweep")
        build_shards(corpus, vocab_dir, shards, preset.shards)
    return shards, vocab_dir


def resolved_run(method: str, steps: int):
    """The preset's run of `method` (the registry's run of that name) with the budget set to `steps`;
    the warm-up keeps the preset's fraction of the steps."""
    from electralab.config import load_params
    from electralab.runs import resolve_run

    run = resolve_run(load_params(ROOT / "params.yaml"), "control" if method == "none" else method)
    cfg = run.pretrain
    warmup = round(cfg.warmup_steps * steps / cfg.steps)
    return dataclasses.replace(
        run,
        name=f"sweep-{method}-{steps}",
        pretrain=dataclasses.replace(cfg, steps=steps, warmup_steps=warmup, checkpoint_fractions=(1.0,)),
    )


def pretrain_point(method: str, steps: int, shards: Path, vocab: Path, out: Path) -> dict:
    from electralab.train.loop import pretrain

    run = resolved_run(method, steps)
    models = out / "models" / run.name
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    summary = pretrain(run, shards, models, out / "scratch" / run.name, vocab_dir=vocab, show_progress=False)
    return {
        "method": method,
        "steps": steps,
        "tokens": summary.get("tokens", 0),
        "pretrain_minutes": (time.perf_counter() - start_wall) / 60,
        "pretrain_cpu_minutes": (time.process_time() - start_cpu) / 60,
        "heldout": {k: v for k, v in summary.items() if k.startswith("heldout_")},
        "encoder": str(models / "encoder"),
    }


def finetune_trial(encoder_dir: str, task: str, hp: dict, seed: int, data_root: str, cfg) -> dict:
    """One trial in a worker process (one thread): the stage's data preparation and trial, with the
    fine-tuning settings `cfg` (a FinetuneConfig)."""
    import torch

    from electralab.data.vocab import Tokenizer
    from electralab.export import load_encoder
    from electralab.finetune.data import prepare
    from electralab.finetune.grid import HParams
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.trial import TrialSettings, run_trial

    torch.set_num_threads(1)
    data = _data_cache.get((encoder_dir, task))
    if data is None:
        data = prepare(TASKS[task], Tokenizer(Path(encoder_dir)), cfg, Path(data_root))[1.0]
        _data_cache.clear()
        _data_cache[(encoder_dir, task)] = data
    history = run_trial(data, load_encoder(encoder_dir), HParams(**hp), seed, TrialSettings.of(cfg))
    return {m: history[-1][m] for m in TASKS[task].metrics if m in history[-1]}


_data_cache: dict = {}


def finetune_point(encoder_dir: str, tasks: list[str], seeds: list[int], workers: int, cfg=None) -> dict:
    """Every configuration x seed of each task's grid; per task the configuration with the best median
    of the main metric, its median, spread and per-seed values. `cfg`: the fine-tuning settings (a
    FinetuneConfig; default: the active preset's in params.yaml)."""
    from electralab.config import load_params
    from electralab.env import data_root
    from electralab.finetune.grid import Group, TrialSpec, configurations, select
    from electralab.finetune.tasks import TASKS

    cfg = cfg or load_params(ROOT / "params.yaml").active.finetune
    grids = {task: configurations(cfg.search_space(TASKS[task])) for task in tasks}
    jobs = [(task, hp, seed) for task in tasks for hp in grids[task] for seed in seeds]
    with ProcessPoolExecutor(workers) as pool:
        futures = [
            pool.submit(finetune_trial, encoder_dir, t, dataclasses.asdict(hp), s, str(data_root()), cfg)
            for t, hp, s in jobs
        ]
        finals = {TrialSpec(Group(t), hp, s): f.result() for (t, hp, s), f in zip(jobs, futures)}
    out = {}
    for task in tasks:
        # The grid's own selection (best median, NaN never wins, ties to the earlier configuration)
        metric = TASKS[task].main_metric
        chosen = select({spec: m for spec, m in finals.items() if spec.group.task == task}, grids[task], metric)
        out[task] = {
            "metric": metric,
            "config": dataclasses.asdict(chosen.best),
            "median": chosen.stats[f"median_{metric}"],
            "std": chosen.stats[f"std_{metric}"],
            "seeds": {seed: m.get(metric, math.nan) for seed, m in chosen.by_seed.items()},
        }
    return out


def signal(point: dict, tasks: tuple[str, ...]) -> tuple[float, list[float]]:
    """The mean of the tasks' medians, and the per-seed scores (mean over the tasks at each seed)."""
    present = [t for t in tasks if t in point["finetune"]]
    seeds = sorted(set.intersection(*[set(point["finetune"][t]["seeds"]) for t in present]))
    per_seed = [statistics.mean(point["finetune"][t]["seeds"][s] for t in present) for s in seeds]
    return statistics.mean(point["finetune"][t]["median"] for t in present), per_seed


def write_tables(points: list[dict], tasks: list[str], out: Path) -> None:
    control = next((p for p in points if p["method"] == "none"), None)
    lines = []
    ctrl_score, ctrl_seeds = signal(control, SIGNAL_TASKS) if control else (math.nan, [])
    for p in sorted(points, key=lambda p: (p["method"] != "none", p["method"], p["steps"])):
        score, per_seed = signal(p, SIGNAL_TASKS)
        spread = (
            math.sqrt((statistics.variance(per_seed) + statistics.variance(ctrl_seeds)) / 2)
            if len(per_seed) > 1 and len(ctrl_seeds) > 1
            else math.nan
        )
        gain = score - ctrl_score
        verdict = (
            "control"
            if p["method"] == "none"
            else ("above control" if gain > 2 * spread else "below control" if gain < -2 * spread else "within noise")
        )
        line = {
            "method": p["method"],
            "steps": p["steps"],
            "tokens": p["tokens"],
            "pretrain_minutes": round(p["pretrain_minutes"], 2),
            "pretrain_cpu_minutes": round(p["pretrain_cpu_minutes"], 2),
            "load": round(p["load"], 1),
            **{f"{t}": round(p["finetune"][t]["median"], 2) for t in tasks if t in p["finetune"]},
            **{f"{t}_std": round(p["finetune"][t]["std"], 2) for t in tasks if t in p["finetune"]},
            "signal": round(score, 2),
            "gain_over_control": round(gain, 2),
            "pooled_spread": round(spread, 2),
            "verdict": verdict,
            "token_cosine": round(p["heldout"].get("heldout_token_cosine", math.nan), 3),
        }
        lines.append(line)
    import pandas as pd

    frame = pd.DataFrame(lines)
    frame.to_csv(out / "points.csv", index=False)
    head = [
        "method",
        "steps",
        "tokens",
        "pretrain_minutes",
        "load",
        *tasks,
        "signal",
        "gain_over_control",
        "pooled_spread",
        "verdict",
        "token_cosine",
    ]
    head = [h for h in head if h in frame]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in lines]
    (out / "sweep.md").write_text(
        f"Signal = mean of the medians of {', '.join(SIGNAL_TASKS)}; gain over the control against twice the "
        "pooled std of the per-seed scores.\n\n" + "\n".join(md) + "\n"
    )
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=["mlm", "electra"])
    ap.add_argument("--steps", nargs="+", type=int, default=[250, 500, 1000, 2000])
    ap.add_argument("--tasks", nargs="+", default=["stsb", "mrpc", "cola", "sst2", "rte"])
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the preset's")
    ap.add_argument("--workers", type=int, default=2, help="fine-tuning trials in parallel (one thread each)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "signal_sweep")
    args = ap.parse_args()

    from electralab.config import load_params
    from electralab.errors import TrainingFailed

    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{(args.out / 'mlflow.db').resolve()}")
    seeds = args.seeds or list(load_params(ROOT / "params.yaml").active.finetune.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "points").mkdir(exist_ok=True)
    shards, vocab = build_data(args.out)
    plan = [("none", 0)] + [(m, s) for s in sorted(args.steps) for m in args.methods]
    points = []
    for method, steps in plan:
        path = args.out / "points" / f"{method}-{steps}.json"
        if path.is_file():
            point = json.loads(path.read_text())
            if set(args.tasks) <= set(point["finetune"]):
                points.append(point)
                continue
        load = os.getloadavg()[0]
        print(f"== {method} at {steps} steps (load {load:.1f})", flush=True)
        try:
            point = pretrain_point(method, steps, shards, vocab, args.out)
        except TrainingFailed as error:  # a collapsed or diverged run is a finding, not a table cell
            print(f"   {type(error).__name__}: {error}", flush=True)
            path.with_suffix(".failed").write_text(f"{type(error).__name__}: {error}\n")
            continue
        point["finetune"] = finetune_point(point["encoder"], args.tasks, seeds, args.workers)
        point["load"] = (load + os.getloadavg()[0]) / 2
        path.write_text(json.dumps(point, indent=1))
        points.append(point)
        write_tables(points, args.tasks, args.out)
    write_tables(points, args.tasks, args.out)


if __name__ == "__main__":
    main()
