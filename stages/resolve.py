"""DVC stage resolve: what each run of the registry trains and fine-tunes with, one file per run and stage.

    python stages/resolve.py resolved           # what `dvc repro resolve` runs

Writes, for every run of params.yaml `runs:` at the active preset:
- resolved/pretrain/<run>.json: the run's method settings, model, generators and pretraining schedule as the
  library resolves them (ResolvedRun.as_params);
- resolved/finetune/<run>.json: the preset's fine-tuning configuration, each task's grid as the trials search it,
  whether the run's figures add the extras (pretraining fraction checkpoints, fractions of the labels), and the
  table row its numbers go into.
pretrain@<run> and finetune@<run> depend on their own file rather than on params.yaml's sections, the schema's
source (config.py) and the table registry (tables.py): DVC compares the file, so a change anywhere else (another
budget, another run, a new key of the schema at its default, a table's row) re-runs no stage whose configuration
stayed the same. Seconds; a mistake anywhere in the registry stops it, by key path, before any file is replaced.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from electralab.cli import run_stage  # first: it holds a stop signal while the rest imports

# isort: split
from electralab.config import FinetuneConfig, Params, to_dict
from electralab.io import atomic_dir, write_json
from electralab.runs import ResolvedRun, resolve_all
from electralab.tables import in_efficiency_figure, in_few_shot_figure


def main(params: Params, args) -> None:
    runs = resolve_all(params)
    finetune = params.active.finetune
    with atomic_dir(args.out) as tmp:
        for name, run in runs.items():
            write_json(tmp / "pretrain" / f"{name}.json", run.as_params())
            write_json(tmp / "finetune" / f"{name}.json", finetuning(run, finetune))
    print(f"resolve: {len(runs)} runs of the {params.preset} preset -> {args.out}")


def finetuning(run: ResolvedRun, cfg: FinetuneConfig | None) -> dict:
    """What finetune@<run> fine-tunes with (None: the preset has no fine-tuning grid), and the table row its
    numbers go into (the MLflow `row` tag the report groups pretraining seeds by)."""
    if cfg is None:
        return {"finetune": None, "row": run.row}
    from electralab.finetune.tasks import TASKS

    tasks = sorted({*cfg.tasks, *cfg.efficiency_tasks, *cfg.few_shot_tasks})
    return {
        "finetune": to_dict(cfg),
        "grids": {task: dataclasses.asdict(cfg.search_space(TASKS[task])) for task in tasks},
        "efficiency_extras": in_efficiency_figure(run.name),
        "few_shot_extras": in_few_shot_figure(run.name),
        "row": run.row,
    }


def arguments(parser) -> None:
    parser.add_argument("out", type=Path, help="the directory to write: pretrain/<run>.json, finetune/<run>.json")


if __name__ == "__main__":
    run_stage("resolve", main, arguments=arguments)
