"""Benchmark: the fine-tune stage's fixed cost (what it spends besides its trials), as `dvc repro` runs it.

    dvc repro pretrain@control                                   # any model directory will do
    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/finetune_overhead.py
    # options: --model models/control  --tasks rte mrpc  --seeds 1 2  --examples 64  --repeat 3
    #          --project ../other-checkout  (a second checkout, e.g. `git worktree add /tmp/base HEAD~1`,
    #                                        run side by side: its stage against this one's)

Runs `python stages/finetune.py` in a subprocess (a new interpreter: imports, MLflow, Ray's start-up and
shutdown, the Tune trials, the metrics file) on a cut-down grid of the preset (a few tasks, seeds and
training examples, one configuration), `--repeat` times per variant, the variants interleaved, on a
throw-away MLflow store created before the first run. The fixed cost of one run is

    fixed = wall - (the trials' own seconds) / (trials run at once)

where the trials' own seconds (model built to last evaluation, summed) come from the stage's timing line
and the trials at once are min(trials, the local Ray's CPUs / CPUs per trial, max_concurrent), from the
cut-down preset's `finetune.resources` as the stage reads them. The trials at once
assume the trials pack perfectly, which favours the stage a little. Prints a Markdown table (medians over
the repeats) and writes bench/out/finetune_overhead.json. docs/findings.md ("Speed") has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"finetune \S+: (\d+) trials .* in (\d+) s \((.*); the trials' own time ([\d.]+) s\)")


def cut_params(project: Path, out: Path, tasks: list[str], seeds: list[int], examples: int) -> None:
    """The project's params.yaml with the active preset's fine-tuning cut down."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    ft = params["presets"][params["preset"]]["finetune"]
    ft.update(tasks=tasks, seeds=seeds, max_train_examples=examples, max_eval_examples=examples)
    for grid in ft.get("grids", {}).values():  # one configuration: the first of each list
        grid.update({k: v[:1] for k, v in grid.items() if isinstance(v, list)})
    out.write_text(yaml.safe_dump(params, sort_keys=False))


def run_stage(project: Path, params: Path, model: Path, scratch: Path, env: dict) -> dict:
    metrics, checkpoints = scratch / "metrics.json", scratch / "checkpoints"
    shutil.rmtree(checkpoints, ignore_errors=True)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "stages/finetune.py",
            "--params",
            str(params),
            "control",
            str(model),
            str(metrics),
            str(checkpoints),
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    found = LINE.search(proc.stdout)
    if proc.returncode != 0 or not found:
        sys.exit(
            f"the stage in {project} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    return {
        "wall_s": wall,
        "trials": int(found.group(1)),
        "stage_line": found.group(3),
        "trial_s": float(found.group(4)),
        "load_before": load,
    }


def measure_all(args: argparse.Namespace, scratch: Path) -> tuple[dict[str, list[dict]], int]:
    """Every variant `--repeat` times, interleaved, in `scratch`: ({variant: [run, ...]}, the Ray's CPUs)."""
    base = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{scratch / 'mlflow.db'}",
    }
    base.pop("RAY_ADDRESS", None)
    if base.get("ELECTRALAB_DATA"):  # the stage runs in another directory
        base["ELECTRALAB_DATA"] = str(Path(base["ELECTRALAB_DATA"]).resolve())
    projects = {"this checkout": HERE.parent}
    if args.project:
        projects[f"{args.project}"] = args.project.resolve()
    variants = {}
    for label, project in projects.items():
        params = scratch / f"params-{len(variants)}.yaml"
        cut_params(project, params, args.tasks, args.seeds, args.examples)
        env = {**base, "PYTHONPATH": str(project / "src")}  # each checkout's own library
        variants[label] = (project, params, env)
    sys.path.insert(0, str(HERE.parent / "src"))
    from electralab.config import load_params
    from electralab.errors import ConfigError
    from electralab.finetune.tuning import local_cpus
    from electralab.tracking import open_store

    try:  # a --tasks or --seeds the preset refuses: named by its key, before any stage runs
        resources = load_params(variants["this checkout"][1]).active.finetune.resources
    except ConfigError as e:
        sys.exit(f"error: {e}")
    cpus = local_cpus(resources)  # the CPUs of the Ray the stage starts

    open_store(base["MLFLOW_TRACKING_URI"])  # the store's creation is paid once, by no variant
    rows: dict[str, list[dict]] = {}

    def measure(label: str, project: Path, params: Path, env: dict) -> None:
        row = run_stage(project, params, args.model.resolve(), scratch, env)
        slots = min(row["trials"], int(cpus // resources.cpus), resources.max_concurrent or cpus)
        row["fixed_s"] = row["wall_s"] - row["trial_s"] / max(1, slots)
        rows.setdefault(label, []).append(row)
        print(json.dumps({"variant": label, **row}), flush=True)

    for _ in range(args.repeat):
        for label, (project, params, env) in variants.items():
            measure(label, project, params, env)
    return rows, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=HERE.parent / "models" / "control")
    parser.add_argument("--tasks", nargs="+", default=["rte", "mrpc"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--examples", type=int, default=64, help="training and dev examples per task")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--project", type=Path, default=None, help="a second checkout to run side by side")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "finetune_overhead.json")
    args = parser.parse_args()
    if not (args.model / "encoder").is_dir():
        sys.exit(f"--model {args.model}: no encoder/ there; run `dvc repro pretrain@control` first")

    with tempfile.TemporaryDirectory(prefix="finetune-overhead-") as tmp:  # removed if a stage fails too
        rows, cpus = measure_all(args, Path(tmp))

    summary = {
        label: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "trial_s", "fixed_s", "load_before")}
        for label, rs in rows.items()
    }
    result = {
        "tasks": args.tasks,
        "seeds": args.seeds,
        "examples": args.examples,
        "repeat": args.repeat,
        "cpus": cpus,
        "machine": platform.platform(),
        "processor": platform.processor(),
        "summary": summary,
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    trials = rows["this checkout"][0]["trials"]
    print(
        f"\n{trials} trials ({' '.join(args.tasks)} x seeds {args.seeds}, {args.examples} examples), "
        f"{cpus} CPUs, medians of {args.repeat}:\n"
    )
    print("| variant | stage wall s | trials' own s | fixed s | load before |")
    print("|---|---|---|---|---|")
    for label, s in summary.items():
        print(f"| {label} | {s['wall_s']:.1f} | {s['trial_s']:.1f} | **{s['fixed_s']:.1f}** | {s['load_before']:.1f} |")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
