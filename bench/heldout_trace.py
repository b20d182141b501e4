"""The held-out diagnostics of one pretraining run, step by step: how a run learns or collapses.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/heldout_trace.py electra --steps 1000
    ... electra --steps 1000 --set model.detector_bias=zero            # the papers' detector init
    ... electra --steps 1000 --set pretrain.lr=1e-4 --every 25
    ... electra --set 'model={"hidden": 128, "layers": 4, "heads": 2, "ffn": 512, "embedding": 128}'
    ... electra --steps 1000 --set pretrain.lr=1e-4 --finetune stsb mrpc cola sst2    # then fine-tuned

It trains the active preset's run (the registry's run of that name, at its budget's model, generators and
schedule) with the stage's own loop for `--steps` steps, the warm-up at the budget's fraction of them, the
collapse guard measuring every `--every` steps but never stopping the run, and prints what the guard sees at
each check and where the budget's guard (its `after`, thresholds) would have stopped it, so that a run it
would fail can still be fine-tuned: does the guard's call agree with what a fine-tuning finds? At each check:
the final layer's token cosine, the detector's gain over the base rate (RTD or COCO-LM's copy head) on its
generator's samples and on the fixed task of random words from the text (whether it reads context:
docs/training.md), the generator's and the MLM's accuracy. The preset's data (corpus, vocabulary, shards) is
built once under `--out/data`, as bench/signal_sweep.py does. `--set section.key=value` overrides a key of the
run's scale (model, generators, pretrain: its budget's), of the preset (finetune, vocab) or of the method's
settings (settings.<key>); a value is read as YAML, e.g. `--set finetune.grids.glue_small.lr=[3e-4]`.
A `vocab.<key>` (e.g. `--set vocab.size=4096`) builds the vocabulary and shards again beside the preset's.
docs/training.md and docs/findings.md cite its runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

SHOWN = {
    "token_cosine": "cosine",
    "rtd_base_rate_gain": "rtd gain",
    "copy_base_rate_gain": "copy gain",
    "gen_acc": "gen acc",
    "aux_acc": "aux acc",  # COCO-LM's auxiliary MLM
    "mlm_acc": "mlm acc",
    "mlm_unigram_gain": "mlm gain",
    "detector_unigram_gain": "fixed-task gain",
    "attention_entropy": "attn entropy",  # 1.0: every token attends evenly to all
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run of params.yaml runs:")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--every", type=int, default=50, help="steps between held-out checks")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "heldout_trace")
    ap.add_argument("--finetune", nargs="*", metavar="TASK", help="then fine-tune the encoder as the sweep does")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    args = ap.parse_args()
    bad = [item for item in args.set if "=" not in item or item.startswith("=")]
    if bad:
        ap.error(f"--set {bad[0]!r}: give KEY=VALUE, e.g. pretrain.lr=1e-4")

    from signal_sweep import finetune_point

    from electralab.errors import ConfigError

    try:
        result = trace(args.run, args.set, args.steps, args.every, args.out)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    columns = [k for k in SHOWN if any(k in row for row in result["trace"].values())]
    print("| step | " + " | ".join(SHOWN[k] for k in columns) + " | guard |\n|" + "---|" * (len(columns) + 2))
    for step, row in result["trace"].items():
        values = " | ".join(f"{row.get(k, float('nan')):.3f}" for k in columns)
        print(f"| {step} | {values} | {'fails' if step in result['guard_fails'] else ''} |")
    print(f"{result['minutes']:.1f} min, load {os.getloadavg()[0]:.1f}; {result['error'] or 'finished'}")
    stopped, after = result["guard_stops_at"], result["guard_after"]
    print(
        f"the guard (after {after:.0%} of the steps) would have stopped it at step {stopped}"
        if stopped is not None
        else f"the guard (after {after:.0%} of the steps) passes it"
    )
    if args.finetune and not result["error"]:  # the sweep's protocol (bench/signal_sweep.py, finetune_point)
        scores = finetune_point(result["encoder"], args.finetune, args.seeds, workers=2, cfg=result["finetune_cfg"])
        for task, got in scores.items():
            seeds = ", ".join(f"{v:.1f}" for v in got["seeds"].values())
            print(f"{task} {got['metric']}: median {got['median']:.1f} (seeds {seeds})")


def resolve(run_name: str, sets: list[str], steps: int, every: int):
    """The active preset's run `run_name` at `steps` steps (the warm-up at the budget's fraction of them, the guard
    and the log every `every` steps) with `sets` (KEY=VALUE) applied: (the ResolvedRun, the resolved Params, the
    `vocab.<key>` sets). A ConfigError names a bad set (an unknown key, a value out of range or of the wrong type)."""
    from electralab.config import MAIN_BUDGET, deep_merge, load_params, parse_params
    from electralab.runs import check_run, resolve_run

    params = load_params(ROOT / "params.yaml")
    raw, preset = params.raw, params.raw["presets"][params.preset]
    check_run(run_name, raw["runs"])
    spec = raw["runs"][run_name]
    budget = spec.get("budget", MAIN_BUDGET)
    if budget in (preset.get("budgets") or {}):  # the run's own scale, so that steps and sets apply to it
        for part, delta in preset["budgets"].pop(budget).items():
            preset[part] = deep_merge(preset[part], delta or {})
        spec["budget"] = MAIN_BUDGET
    cfg = parse_params(raw).active.pretrain
    overrides = {
        "steps": steps,
        "warmup_steps": round(cfg.warmup_steps * steps / cfg.steps),
        "checkpoint_every": steps,
        "checkpoint_fractions": [1.0],
        "log_every": every,
        "guard": {"every": every},
    }
    preset["pretrain"] = deep_merge(preset["pretrain"], overrides)
    vocab_sets = {}  # vocab.<key>: the data is built again with that vocabulary (beside the preset's own)
    for item in sets:
        key, _, value = item.partition("=")
        *path, last = key.split(".")
        if path == ["vocab"]:
            vocab_sets[last] = yaml.safe_load(value)
            continue
        node = spec if path[:1] == ["settings"] else preset  # settings.<key>: the run's; the rest: the preset's
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    resolved = parse_params(raw)  # a value out of range or of the wrong type: named by its key
    return resolve_run(resolved, run_name), resolved, vocab_sets


def held_out(runlog: Path) -> dict[int, dict[str, float]]:
    """step -> every held-out diagnostic of the run that trained the point's encoder: the newest in its run log. A
    resumed run logs on into its own run; an attempt killed before its first checkpoint leaves a run of its own,
    closed KILLED by the next attempt, which starts again from step 0."""
    from electralab.runlog import read_runs

    at: dict[int, dict[str, float]] = {}
    for key, value, _, step in read_runs(runlog)[-1].metrics:
        if key.startswith("heldout_"):
            at.setdefault(step, {})[key.removeprefix("heldout_")] = value
    return {step: at[step] for step in sorted(at)}


def trace(
    run_name: str,
    sets: list[str],
    steps: int,
    every: int,
    out: Path,
    *,
    data: tuple[Path, Path] | None = None,
    name: str | None = None,
    stop=None,
) -> dict:
    """Pretrain the active preset's run `run_name` with `sets` (KEY=VALUE) for `steps` steps, the guard
    measuring every `every` steps without stopping it. Returns the trace ({step: diagnostics}), where the
    budget's guard would have stopped it, the error (a diverged run still has its trace), the encoder's
    directory, the step it reached (None if it failed), the minutes and the resolved pretraining and fine-tuning
    settings. `data`: (shards, vocab) already built (else the preset's, built once under bench/out/signal_sweep);
    `stop`: the loop's pause callback (a function of the step just taken).
    A ConfigError names a bad --set before any training."""
    from signal_sweep import build_data

    from electralab.train.diagnostics import collapse, guard_active
    from electralab.train.loop import pretrain

    run, resolved, vocab_sets = resolve(run_name, sets, steps, every)
    if data is not None and vocab_sets:
        raise ValueError("trace: vocab.<key> builds its own data; give data=None")
    shards, vocab = data or build_data(ROOT / "bench" / "out" / "signal_sweep", vocab_sets)
    name = name or f"trace-{run_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    guard = dataclasses.replace(run.pretrain.guard, enabled=True)  # the preset's (and the sets'): its verdict
    unstopped = dataclasses.replace(run.pretrain, guard=dataclasses.replace(guard, enabled=False))  # it measures
    run = dataclasses.replace(run, name=name, pretrain=unstopped)
    os.environ.setdefault("ELECTRALAB_TRACKING", "file")
    os.environ["ELECTRALAB_RUNLOG"] = str(out / "runlog" / name)
    print(f"{name}: {' '.join(sets) or 'the preset as it is'}; load {os.getloadavg()[0]:.1f}", flush=True)
    began, error, paused, reached = time.perf_counter(), None, False, None
    minutes = None  # the loop's own training time, summed over every resume of the run; else this process's
    try:
        summary = pretrain(
            run, shards, out / "models" / name, out / "scratch" / name, vocab_dir=vocab, show_progress=False, stop=stop
        )
        paused, reached, minutes = bool(summary.get("paused")), summary["steps"], summary["wall_hours"] * 60
    except Exception as e:  # a failed run (a diverged loss) still has its trace
        error = f"{type(e).__name__}: {e}"
    at = held_out(Path(os.environ["ELECTRALAB_RUNLOG"]))
    fails = [
        s for s in sorted(at) if guard_active(s, steps, run.pretrain.warmup_steps, guard) and collapse(at[s], guard)
    ]
    return {
        "name": name,
        "trace": at,
        "guard_fails": fails,
        "guard_stops_at": fails[0] if fails else None,
        "guard_after": guard.after,
        "error": error,
        "paused": paused,
        "reached": reached,
        "minutes": minutes if minutes is not None else (time.perf_counter() - began) / 60,
        "encoder": str(out / "models" / name / "encoder"),
        "pretrain_cfg": run.pretrain,
        "finetune_cfg": resolved.active.finetune,
    }


if __name__ == "__main__":
    main()
