"""DVC stage first_look: the headline's first claim in minutes (`make first-look`; docs/reproducing.md).

    python stages/first_look.py metrics first_look checkpoints/first_look control electra
                                                # what `dvc repro first_look` runs

Fine-tunes the named runs' encoders (models/<run>/, their pretrain stages' outputs) with the preset's
`first_look` changes of its fine-tuning (the tiny preset: STS-B alone), then builds the report from
exactly those fine-tunings and the pretraining runs metrics/pretrain/<run>.json names. Writes first_look/:
finetune/<run>.json, report/ (the report stage's pages, mostly empty but for these rows) and README.md (the
claims against the control, and what a first look can and cannot show). Its fine-tunings are its own: the
finetune@<run> stages and the report stage never read them, and their MLflow parents are tagged
`purpose=first_look`, which a report of the latest runs skips. An interrupted grid resumes from the checkpoints.
"""

from __future__ import annotations

import os
from pathlib import Path

from electralab.cli import run_stage  # first: it holds a stop signal while the rest imports

# isort: split
from electralab.config import Params
from electralab.env import ALLOW_MISSING_ENV, data_root
from electralab.errors import ConfigError
from electralab.io import atomic_dir, write_json
from electralab.report.build import WorkspaceState, workspace_state
from electralab.runs import check_run, resolve_all
from electralab.tables import CONTROL_RUN

PURPOSE = "first_look"  # the MLflow parents' `purpose` tag (tracking.PURPOSE_TAG)


def main(params: Params, args) -> None:
    runs = resolve_all(params)  # a mistake anywhere in the registry stops here, by key path
    for run in args.runs:
        check_run(run, runs, source=args.params)
    if CONTROL_RUN not in args.runs:
        raise ConfigError(f"first_look: runs {args.runs} lack the control ({CONTROL_RUN!r}), the claims' baseline")
    cfg = params.active.first_look_finetune(f"presets.{params.preset}.first_look")
    pretrained = workspace_state(args.metrics_dir).pretrain
    for run in args.runs:
        if run not in pretrained:
            raise ConfigError(f"{args.metrics_dir / 'pretrain' / f'{run}.json'}: missing; `dvc repro pretrain@{run}`")
    from electralab.finetune.protocol import finetune  # imports torch, Ray and MLflow
    from electralab.report import Sources, build_report

    allow = os.environ.get(ALLOW_MISSING_ENV, "") not in ("", "0")  # tasks the mirror lacks are skipped
    data = data_root()
    results = {
        run: finetune(
            runs[run], cfg, Path("models") / run, args.checkpoints / run, data, allow_missing=allow, purpose=PURPOSE
        )
        for run in args.runs
    }
    state = WorkspaceState(
        {run: pretrained[run] for run in args.runs}, {run: r["mlflow"] for run, r in results.items()}
    )
    with atomic_dir(args.out) as tmp:
        for run, result in results.items():
            write_json(tmp / "finetune" / f"{run}.json", result)
        built = build_report(
            params.preset, tmp / "report", sources=Sources.of(params.preset, params.active, data), state=state
        )
        claims = built["claims"]
        against = claims[(claims["than"] == CONTROL_RUN) & claims["run"].isin(args.runs)].drop_duplicates("run")
        (tmp / "README.md").write_text(summary(params.preset, cfg, args.runs, against), encoding="utf-8")
    print((args.out / "README.md").read_text(encoding="utf-8"))


def summary(preset: str, cfg, runs: list[str], against) -> str:
    tasks = ", ".join(f"`{t}`" for t in cfg.tasks)
    lines = [
        f"# First look — {preset} preset",
        "",
        f"Runs {', '.join(runs)}, one pretraining seed each, fine-tuned on {tasks} with seeds "
        f"{', '.join(map(str, cfg.seeds))} (the median; `presets.{preset}.first_look`). The full report of these "
        "rows: report/index.html.",
        "",
        "| claim | tasks | ours | spread | verdict |",
        "|---|---|---|---|---|",
        *(f"| {c.claim} | {c.tasks} | {c.ours:.1f} | {c.spread:.1f} | {c.verdict} |" for c in against.itertuples()),
        "",
        "What it can show: whether these runs' pretraining beats no pretraining on these tasks at this preset, "
        "against the fine-tuning seeds' spread. What it cannot: the other tasks and methods, the spread between "
        "pretraining seeds, or the papers' orderings; `make repro` runs the headline for those.",
        "",
    ]
    return "\n".join(lines)


def arguments(parser) -> None:
    parser.add_argument("metrics_dir", type=Path, help="the workspace's metrics directory (pretrain/<run>.json)")
    parser.add_argument("out", type=Path, help="the first look's directory to write")
    parser.add_argument("checkpoints", type=Path, help="the grids' finished trials, kept until each ends")
    parser.add_argument("runs", nargs="+", help="runs of params.yaml `runs:`, the control among them")


if __name__ == "__main__":
    run_stage("first_look", main, arguments=arguments)
