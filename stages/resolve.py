"""DVC stage resolve: what each run of the registry trains with, one file per run.

    python stages/resolve.py resolved           # what `dvc repro resolve` runs

Writes resolved/<run>.json for every run of params.yaml `runs:` at the active preset: the run's method settings,
model, generators and pretraining schedule as the library resolves them (ResolvedRun.as_params). Each
pretrain@<run> stage depends on its own file rather than on params.yaml's sections and the schema's source
(config.py): DVC compares the file, so a change anywhere else (another budget, another run, a new key of the
schema at its default) retrains no run whose configuration stayed the same. Seconds; a mistake anywhere in
the registry stops it, by key path, before any file is replaced.
"""

from __future__ import annotations

from pathlib import Path

from electralab.cli import run_stage  # first: it holds a stop signal while the rest imports

# isort: split
from electralab.config import Params
from electralab.io import atomic_dir, write_json
from electralab.runs import resolve_all


def main(params: Params, args) -> None:
    runs = resolve_all(params)
    with atomic_dir(args.out) as tmp:
        for name, run in runs.items():
            write_json(tmp / f"{name}.json", run.as_params())
    print(f"resolve: {len(runs)} runs of the {params.preset} preset -> {args.out}")


def arguments(parser) -> None:
    parser.add_argument("out", type=Path, help="the directory to write, one <run>.json per run")


if __name__ == "__main__":
    run_stage("resolve", main, arguments=arguments)
