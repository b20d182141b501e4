"""DVC stage finetune@<run>: fine-tune one run of the registry on GLUE and SQuAD 2.0 with the preset's
grid and seeds on Ray Tune, and track it in MLflow (docs/finetuning.md, docs/tracking.md).

    python stages/finetune.py cocolm            # what `dvc repro finetune@cocolm` runs

Reads models/<run>/ (the encoder with its vocabulary, and fractions/ for the efficiency curves) and the
task data ($ELECTRALAB_DATA mirror, or the Hugging Face hub); writes metrics/finetune/<run>.json.
An interrupted grid resumes from checkpoints/finetune/<run>/ without re-running finished trials. A requested
task whose data is missing fails the stage (exit 2) unless it is a known gap of the offline mirror or
ELECTRALAB_ALLOW_MISSING=1 is set; then it is recorded as missing in the metrics file and MLflow.
"""

from __future__ import annotations

import os

from electralab.cli import run_stage
from electralab.config import Params
from electralab.env import ALLOW_MISSING_ENV, data_root, repo_root
from electralab.errors import ConfigError
from electralab.io import write_json
from electralab.runs import check_run, resolve_all


def main(params: Params, args) -> None:
    runs = resolve_all(params)          # a mistake anywhere in the registry stops here, by key path
    check_run(args.run, runs, source=args.params)
    cfg = params.active.finetune
    if cfg is None:
        raise ConfigError(f"presets.{params.preset}.finetune is not set: this preset has no fine-tuning grid")
    from electralab.finetune.protocol import finetune   # imports torch, Ray and MLflow

    root, run = repo_root(), runs[args.run]
    # A requested task without its data fails the stage (and `dvc repro`, and the flow) unless allowed.
    allow_missing = os.environ.get(ALLOW_MISSING_ENV, "") not in ("", "0")
    summary = finetune(run, cfg, root / "models" / run.name, root / "checkpoints" / "finetune" / run.name,
                       data_root(), allow_missing=allow_missing)
    write_json(root / "metrics" / "finetune" / f"{run.name}.json", summary)


def arguments(parser) -> None:
    parser.add_argument("run", help="a run name from params.yaml runs")


if __name__ == "__main__":
    run_stage("finetune", main, arguments=arguments)
