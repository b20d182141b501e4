"""DVC stage pretrain@<run>: pretrain one run of the registry (params.yaml `runs`).

    python stages/pretrain.py cocolm            # what `dvc repro pretrain@cocolm` runs

Reads data/shards and data/vocab; writes models/<run>/ (encoder/, hf/, auxiliary.pt, fractions/,
summary.json) and metrics/pretrain/<run>.json. An interrupted run resumes from checkpoints/<run>/.
With presets.<preset>.pretrain.num_workers > 1, or RAY_ADDRESS set, it runs under Ray Train.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import stage_main  # noqa: E402

from electralab.config import load_params  # noqa: E402
from electralab.env import repo_root  # noqa: E402
from electralab.io import write_json  # noqa: E402
from electralab.runs import resolve_all  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run name from params.yaml `runs`")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)

    params = load_params(args.params)
    runs = resolve_all(params)          # a mistake anywhere in the registry stops here, by key path
    if args.run not in runs:
        raise SystemExit(f"error: run {args.run!r} is not in {args.params} runs (known: {', '.join(runs)})")
    run = runs[args.run]
    root = repo_root()
    shards, vocab_model = root / "data" / "shards", root / "data" / "vocab" / "spm.model"
    out, scratch = root / "models" / run.name, root / "checkpoints" / run.name
    if run.pretrain.num_workers > 1 or os.environ.get("RAY_ADDRESS"):
        from electralab.train.distributed import pretrain_on_ray

        summary = pretrain_on_ray(run, shards, out, scratch, num_workers=run.pretrain.num_workers,
                                  use_gpu=run.pretrain.use_gpu, vocab_model=vocab_model)
    else:
        from electralab.train.loop import pretrain

        summary = pretrain(run, shards, out, scratch, vocab_model=vocab_model)
    write_json(root / "metrics" / "pretrain" / f"{run.name}.json",
               {k: v for k, v in summary.items() if isinstance(v, (int, float))})


if __name__ == "__main__":
    stage_main(main)
