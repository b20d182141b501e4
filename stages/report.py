"""DVC stage report: the papers' tables and figures for the active preset, from MLflow.

    python stages/report.py metrics reports metrics/report.json   # what `dvc repro report` runs

Reads MLflow (the preset's experiment `electralab-<preset>`; docs/tracking.md): only the runs that the metrics
directory's pretrain/<run>.json and finetune/<run>.json name (the workspace's own outputs); and, for COCO-LM
Fig. 1/5 only, STS-B dev and the corpus mirror under $ELECTRALAB_DATA. Writes the report directory (atomic:
index.html, report.md, tables/, figures/, plots/) and its metrics file, then logs the directory to MLflow as
a `stage=report` run. docs/reproducing.md explains how to read it.
"""

from __future__ import annotations

from pathlib import Path

from electralab.cli import run_stage  # first: it holds a stop signal while the rest imports

# isort: split
from electralab.config import Params
from electralab.env import data_root
from electralab.io import write_json
from electralab.report import Sources, build_report
from electralab.report.build import workspace_state
from electralab.report.track import log_report


def main(params: Params, args) -> None:
    sources = Sources.of(params.preset, params.active, data_root())
    # The runs this workspace's outputs are (their metrics files record them): not the latest of each name,
    # which may be another experiment's. A workspace whose stages never recorded one reads the latest.
    state = workspace_state(args.metrics_dir)
    built = build_report(
        params.preset,
        args.out,
        sources=sources,
        runs=params.runs,
        state=state if state.pretrain or state.finetune else None,
    )
    write_json(args.metrics, built["metrics"])
    run_id = log_report(built["results"], args.out, built["tables"])
    filled = sum(c["filled"] for c in built["metrics"]["cells"].values())
    total = sum(c["total"] for c in built["metrics"]["cells"].values())
    print(
        f"report ({params.preset}): {filled}/{total} of our table cells filled -> "
        f"{args.out / 'index.html'} (MLflow run {run_id})"
    )


def arguments(parser) -> None:
    parser.add_argument(
        "metrics_dir", type=Path, help="the workspace's metrics directory (pretrain/<run>.json, finetune/<run>.json)"
    )
    parser.add_argument("out", type=Path, help="the report directory to write")
    parser.add_argument("metrics", type=Path, help="the metrics file to write")


if __name__ == "__main__":
    run_stage("report", main, arguments=arguments)
