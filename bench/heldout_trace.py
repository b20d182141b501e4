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
docs/training.md and docs/reproducing.md cite its runs.
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

    from signal_sweep import build_data, finetune_point

    from electralab.config import MAIN_BUDGET, deep_merge, load_params, parse_params
    from electralab.errors import ConfigError
    from electralab.runs import check_run, resolve_run
    from electralab.train.diagnostics import collapse, guard_active
    from electralab.train.loop import pretrain

    params = load_params(ROOT / "params.yaml")
    raw, preset = params.raw, params.raw["presets"][params.preset]
    try:
        check_run(args.run, raw["runs"])
    except ConfigError as e:
        sys.exit(f"error: {e}")
    spec = raw["runs"][args.run]
    budget = spec.get("budget", MAIN_BUDGET)
    if budget in (preset.get("budgets") or {}):  # the run's own scale, so that --steps and --set apply to it
        for part, delta in preset["budgets"].pop(budget).items():
            preset[part] = deep_merge(preset[part], delta or {})
        spec["budget"] = MAIN_BUDGET
    cfg = parse_params(raw).active.pretrain
    overrides = {
        "steps": args.steps,
        "warmup_steps": round(cfg.warmup_steps * args.steps / cfg.steps),
        "checkpoint_every": args.steps,
        "checkpoint_fractions": [1.0],
        "log_every": args.every,
        "guard": {"every": args.every},
    }
    preset["pretrain"] = deep_merge(preset["pretrain"], overrides)
    vocab_sets = {}  # vocab.<key>: the data is built again with that vocabulary (beside the preset's own)
    for item in args.set:
        key, _, value = item.partition("=")
        *path, last = key.split(".")
        if path == ["vocab"]:
            vocab_sets[last] = yaml.safe_load(value)
            continue
        node = spec if path[:1] == ["settings"] else preset  # settings.<key>: the run's; the rest: the preset's
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    try:  # a --set value out of range or of the wrong type: named by its key, before any training
        resolved = parse_params(raw)
        run = resolve_run(resolved, args.run)
        shards, vocab = build_data(ROOT / "bench" / "out" / "signal_sweep", vocab_sets)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    name = f"trace-{args.run}-{time.strftime('%Y%m%d-%H%M%S')}"
    guard = dataclasses.replace(run.pretrain.guard, enabled=True)  # the preset's (and --set's): its verdict below
    unstopped = dataclasses.replace(run.pretrain, guard=dataclasses.replace(guard, enabled=False))  # it measures
    run = dataclasses.replace(run, name=name, pretrain=unstopped)
    os.environ.setdefault("ELECTRALAB_TRACKING", "file")
    os.environ["ELECTRALAB_RUNLOG"] = str(args.out / "runlog" / name)
    print(f"{name}: {' '.join(args.set) or 'the preset as it is'}; load {os.getloadavg()[0]:.1f}", flush=True)
    began, error = time.perf_counter(), None
    try:
        pretrain(
            run, shards, args.out / "models" / name, args.out / "scratch" / name, vocab_dir=vocab, show_progress=False
        )
    except Exception as e:  # a failed run (a diverged loss) still has its trace
        error = f"{type(e).__name__}: {e}"
    from electralab.runlog import read_runs

    (logged,) = read_runs(Path(os.environ["ELECTRALAB_RUNLOG"]))
    at: dict[int, dict[str, float]] = {}  # step -> every held-out diagnostic
    for key, value, _, step in logged.metrics:
        if key.startswith("heldout_"):
            at.setdefault(step, {})[key.removeprefix("heldout_")] = value
    stopped = None
    columns = [k for k in SHOWN if any(k in row for row in at.values())]
    print("| step | " + " | ".join(SHOWN[k] for k in columns) + " | guard |\n|" + "---|" * (len(columns) + 2))
    for step in sorted(at):
        judged = guard_active(step, args.steps, run.pretrain.warmup_steps, guard)
        problem = collapse(at[step], guard) if judged else None
        if problem and stopped is None:
            stopped = step
        values = " | ".join(f"{at[step].get(k, float('nan')):.3f}" for k in columns)
        print(f"| {step} | {values} | {'fails' if problem else ''} |")
    print(f"{(time.perf_counter() - began) / 60:.1f} min, load {os.getloadavg()[0]:.1f}; {error or 'finished'}")
    print(
        f"the guard (after {guard.after:.0%} of the steps) would have stopped it at step {stopped}"
        if stopped is not None
        else f"the guard (after {guard.after:.0%} of the steps) passes it"
    )
    if args.finetune and not error:  # the sweep's protocol (bench/signal_sweep.py, finetune_point)
        encoder = str(args.out / "models" / name / "encoder")
        scores = finetune_point(encoder, args.finetune, args.seeds, workers=2, cfg=resolved.active.finetune)
        for task, got in scores.items():
            seeds = ", ".join(f"{v:.1f}" for v in got["seeds"].values())
            print(f"{task} {got['metric']}: median {got['median']:.1f} (seeds {seeds})")


if __name__ == "__main__":
    main()
