"""DVC stage finetune@<run>: fine-tune one run of the registry on GLUE and SQuAD 2.0 with the preset's
grid and seeds on Ray Tune, and track it in MLflow (docs/finetuning.md, docs/tracking.md).

    python stages/finetune.py cocolm models/cocolm metrics/finetune/cocolm.json checkpoints/finetune/cocolm
                                                # what `dvc repro finetune@cocolm` runs

Reads the model directory (the encoder with its vocabulary, and fractions/ for the efficiency curves) and the
task data ($ELECTRALAB_DATA mirror, or the Hugging Face hub); writes the metrics file. An interrupted grid
resumes from the checkpoints directory without re-running finished trials. A requested task whose data is
missing fails the stage (exit 2) unless it is a known gap of the offline mirror or ELECTRALAB_ALLOW_MISSING=1
is set; then it is recorded as missing in the metrics file and MLflow.
"""

from __future__ import annotations

import os
from pathlib import Path

from electralab.cli import run_stage
from electralab.config import Params
from electralab.env import ALLOW_MISSING_ENV, data_root
from electralab.errors import ConfigError
from electralab.io import write_json
from electralab.runs import check_run, resolve_all


def main(params: Params, args) -> None:
    runs = resolve_all(params)  # a mistake anywhere in the registry stops here, by key path
    check_run(args.run, runs, source=args.params)
    cfg = params.active.finetune
    if cfg is None:
        raise ConfigError(f"presets.{params.preset}.finetune is not set: this preset has no fine-tuning grid")
    from electralab.finetune.protocol import finetune  # imports torch, Ray and MLflow

    # A requested task without its data fails the stage (and `dvc repro`, and the flow) unless allowed.
    allow_missing = os.environ.get(ALLOW_MISSING_ENV, "") not in ("", "0")
    write_json(
        args.metrics,
        finetune(runs[args.run], cfg, args.model, args.checkpoints, data_root(), allow_missing=allow_missing),
    )


def arguments(parser) -> None:
    parser.add_argument("run", help="a run name from params.yaml runs")
    parser.add_argument("model", type=Path, help="the run's model directory (its pretrain stage's output)")
    parser.add_argument("metrics", type=Path, help="the metrics file to write")
    parser.add_argument("checkpoints", type=Path, help="the grid's finished trials, kept until it ends")


if __name__ == "__main__":
    run_stage("finetune", main, arguments=arguments)
