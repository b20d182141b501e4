"""DVC stage pretrain@<run>: pretrain one run of the registry (params.yaml `runs`).

    python stages/pretrain.py cocolm            # what `dvc repro pretrain@cocolm` runs

Reads data/shards and data/vocab; writes models/<run>/ (encoder/, auxiliary.pt, fractions/,
summary.json) and metrics/pretrain/<run>.json. An interrupted run resumes from checkpoints/<run>/.
With presets.<preset>.pretrain.num_workers > 1, or RAY_ADDRESS set, it runs under Ray Train.
docs/training.md describes the loop, resume and outputs.
"""

from __future__ import annotations

import os
import shutil

from electralab.cli import run_stage
from electralab.config import Params
from electralab.env import repo_root
from electralab.io import write_json
from electralab.runs import check_run, resolve_all


def main(params: Params, args) -> None:
    runs = resolve_all(params)          # a mistake anywhere in the registry stops here, by key path
    check_run(args.run, runs, source=args.params)
    run = runs[args.run]
    root = repo_root()
    shards, vocab = root / "data" / "shards", root / "data" / "vocab"
    out, scratch = root / "models" / run.name, root / "checkpoints" / run.name
    if run.pretrain.num_workers > 1 or os.environ.get("RAY_ADDRESS"):
        from electralab.train.distributed import pretrain_on_ray

        summary = pretrain_on_ray(run, shards, out, scratch, num_workers=run.pretrain.num_workers,
                                  use_gpu=run.pretrain.use_gpu, vocab_dir=vocab)
    else:
        from electralab.train.loop import pretrain

        summary = pretrain(run, shards, out, scratch, vocab_dir=vocab)
    # mlflow_run_id: which MLflow run these outputs are; the report reads only the runs the workspace names.
    write_json(root / "metrics" / "pretrain" / f"{run.name}.json",
               {k: v for k, v in summary.items() if isinstance(v, (int, float)) or k == "mlflow_run_id"})
    # Last: until here a kill resumes from the final checkpoint instead of training again from step 0.
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    run_stage("pretrain", main, arguments=lambda p: p.add_argument("run", help="a run name from params.yaml runs"))
