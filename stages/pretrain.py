"""DVC stage pretrain@<run>: pretrain one run of the registry (params.yaml `runs`).

    python stages/pretrain.py cocolm data/shards data/vocab models/cocolm metrics/pretrain/cocolm.json \
        checkpoints/cocolm                      # what `dvc repro pretrain@cocolm` runs

Reads the shards and the vocabulary; writes the model directory (encoder/, auxiliary.pt, fractions/,
summary.json) and the metrics file. An interrupted run resumes from its checkpoints directory.
With presets.<preset>.pretrain.num_workers > 1, or RAY_ADDRESS set, it runs under Ray Train.
docs/training.md describes the loop, resume and outputs.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from electralab.cli import STOP, run_stage
from electralab.config import Params
from electralab.data import read_manifest
from electralab.data.shards import read_shards_manifest
from electralab.data.vocab import TOKENIZER_FILE
from electralab.errors import Stopped
from electralab.io import write_json
from electralab.runs import check_run, resolve_all


def main(params: Params, args) -> None:
    runs = resolve_all(params)  # a mistake anywhere in the registry stops here, by key path
    check_run(args.run, runs, source=args.params)
    run = runs[args.run]
    # Both inputs before any work: the vocabulary is only copied into the model once training ends.
    read_shards_manifest(args.shards)
    read_manifest(args.vocab / TOKENIZER_FILE, "vocab")
    if run.pretrain.num_workers > 1 or os.environ.get("RAY_ADDRESS"):
        from electralab.train.distributed import pretrain_on_ray

        summary = pretrain_on_ray(
            run,
            args.shards,
            args.out,
            args.checkpoints,
            num_workers=run.pretrain.num_workers,
            use_gpu=run.pretrain.use_gpu,
            vocab_dir=args.vocab,
        )
    else:
        from electralab.train.loop import pretrain

        # A stop signal ends the run after its current step, checkpointed (electralab.cli: STOP).
        summary = pretrain(
            run, args.shards, args.out, args.checkpoints, vocab_dir=args.vocab, stop=lambda step: STOP.requested()
        )
        if summary.get("paused"):
            name = signal.Signals(STOP.signum).name
            raise Stopped(f"stopped by {name} at step {summary['steps']} of {run.pretrain.steps}", STOP.signum)
    # mlflow_run_id: which MLflow run these outputs are; the report reads only the runs the workspace names.
    write_json(args.metrics, {k: v for k, v in summary.items() if isinstance(v, (int, float)) or k == "mlflow_run_id"})
    # Last: until here a kill resumes from the final checkpoint instead of training again from step 0.
    shutil.rmtree(args.checkpoints, ignore_errors=True)


def arguments(parser) -> None:
    parser.add_argument("run", help="a run name from params.yaml runs")
    parser.add_argument("shards", type=Path, help="the shards directory (the shards stage's output)")
    parser.add_argument("vocab", type=Path, help="the vocabulary directory (the vocab stage's output)")
    parser.add_argument("out", type=Path, help="the model directory to write")
    parser.add_argument("metrics", type=Path, help="the metrics file to write")
    parser.add_argument("checkpoints", type=Path, help="the run's checkpoints, kept until it ends (resume)")


if __name__ == "__main__":
    run_stage("pretrain", main, arguments=arguments)
