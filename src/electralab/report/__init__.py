"""The report: the papers' tables and figures regenerated from MLflow, beside the published numbers.

    from electralab.report import build_report
    summary = build_report("tiny", "reports")     # reads electralab-tiny from $MLFLOW_TRACKING_URI / mlflow.db

writes, atomically (a failed build leaves the previous directory untouched):

    reports/index.html                 every table and figure on one self-contained page
    reports/report.md                  what the numbers can and cannot show, every table (Markdown), figures linked
    reports/tables/<paper>_<table>.md  one table, Markdown
    reports/tables/<paper>_<table>.csv one line per (row, column): ours, std, min, max, published, diff
    reports/claims.csv                 every comparison a table makes: ours, spread, p, paper, verdict
    reports/provenance.csv             the pretraining runs read: MLflow run, commit, precision, machine, load
    reports/built.json                 the preset and when the report was built
    reports/figures/<paper>_<fig>.png  the figures
    reports/plots/<paper>_<fig>.csv    the figures' series, for `dvc plots show`

Everything comes from MLflow (docs/tracking.md) except what COCO-LM Fig. 1/5 reads besides the
exported encoders: STS-B pairs and corpus paragraphs (`Sources`). The library knows nothing of DVC.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import pandas as pd

from electralab import tracking
from electralab.config import GuardConfig
from electralab.io import atomic_dir, write_json
from electralab.report import figures as F
from electralab.report.build import (
    PROVENANCE,
    BuiltTable,
    Results,
    WorkspaceState,
    build_tables,
    cell_lookup,
    check_preset,
    check_specs,
    fetch_results,
    glue_average,
    metric_history,
)
from electralab.report.claims import HOLDS, NOISE, REVERSED, check_claims
from electralab.report.limits import limits
from electralab.report.render import claims_details, claims_markdown, page_html, table_html, to_csv, to_markdown
from electralab.report.why import explain, missing_reasons
from electralab.tables import CONTROL_RUN, FIGURES, GLUE_AVG_PARTS, HEADLINE, SQUAD2, TABLES


@dataclass(frozen=True)
class Sources:
    """What the report reads besides MLflow, and how to describe the preset's data."""

    note: str = ""  # the preset's data and model, printed under every table title
    stsb_dev: Path | None = None  # $ELECTRALAB_DATA/glue/STS-B/dev.tsv (Fig. 1/5 similar pairs)
    corpus_files: tuple[Path, ...] = ()  # corpus paragraphs (Fig. 1/5 random pairs)
    random_pairs: int = 200
    # task -> why its dev results can never exist with this data (e.g. QQP: no dev split in the offline mirror):
    # the tables' footnotes say so, and figure panels that need it (GLUE AVG) are left out.
    unavailable: tuple[tuple[str, str], ...] = ()

    def glue_avg_unavailable(self) -> str:
        """Why no GLUE average can ever be computed ("" if it can)."""
        gone = dict(self.unavailable)
        return "; ".join(f"{c.name}: {gone[c.task]}" for c in GLUE_AVG_PARTS if c.task in gone)

    @classmethod
    def of(cls, preset_name: str, preset, data: Path | None) -> "Sources":
        """A preset's sources, with `data` the offline mirror (or None: Fig. 1/5 then says "no data yet")."""
        from electralab.card import describe

        corpus = [data / "corpus" / f.file for f in preset.corpus.mirror] if data else []
        return cls(
            note=describe(preset_name, preset, mirror=data is not None),
            stsb_dev=data / "glue" / "STS-B" / "dev.tsv" if data else None,
            corpus_files=tuple(f for f in corpus if f.exists()),
            unavailable=unavailable(data),
        )


def unavailable(data: Path | None) -> tuple[tuple[str, str], ...]:
    """The tasks whose evaluation split the offline mirror lacks (QQP's dev): their cells can never fill from it."""
    from electralab.finetune.tasks import TASKS, MissingSplit, read_split

    out = []
    for name in TASKS if data is not None else []:
        for split in TASKS[name].eval_splits:
            try:
                read_split(TASKS[name], split.name, data)
            except MissingSplit as e:
                out.append((name, str(e)))
                break
    return tuple(out)


def stem(key: str) -> str:
    """ "coco-lm/table3" -> "coco-lm_table3" (file names)."""
    return key.replace("/", "_")


# --- figures -----------------------------------------------------------------------------------------

HISTORY_METRICS = sorted(
    {m for series in F.SCL_SERIES.values() for _, m, _ in series}
    | {m for _, m in F.COPY_CLM_PANELS}
    | {m for _, m, _ in F.MIX_SERIES}
    | {"rtd_acc_replaced", "wall_hours", *F.DETECTOR_GAINS, F.TOKEN_COSINE}
)


def cosines(results: Results, sources: Sources) -> pd.DataFrame:
    """COCO-LM Fig. 1/5 data: [CLS] cosines of random corpus pairs and STS-B score-5 pairs, per run,
    with the encoder (and its vocabulary) each pretraining run logged as the `encoder` artifact."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from electralab.data.vocab import TOKENIZER_FILE, Tokenizer
    from electralab.export import load_encoder

    frame = pd.DataFrame(columns=["run", "pairs", "cosine"])
    pairs = {
        "random": F.corpus_pairs(sources.corpus_files, sources.random_pairs),
        "similar": F.read_stsb_similar(sources.stsb_dev) if sources.stsb_dev and sources.stsb_dev.exists() else [],
    }
    if not pairs["random"] and not pairs["similar"]:
        return frame
    ids = dict(zip(results.pretrain["run"], results.pretrain["run_id"]))
    parts = [frame]
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per encoder otherwise
    for run in F.COSINE_RUNS:
        if run not in ids:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                encoder_dir = Path(
                    mlflow.artifacts.download_artifacts(
                        run_id=ids[run], artifact_path="encoder", dst_path=tmp, tracking_uri=results.tracking_uri
                    )
                )
            except (MlflowException, OSError):  # no encoder logged (yet): that panel says "no data yet"
                continue
            if not (encoder_dir / TOKENIZER_FILE).exists():  # exported without its vocabulary
                continue
            encoder, tokenizer = load_encoder(encoder_dir), Tokenizer(encoder_dir)
            for kind, texts in pairs.items():
                values = F.pair_cosines(encoder, tokenizer, texts)
                parts.append(pd.DataFrame({"run": run, "pairs": kind, "cosine": values}))
    return pd.concat(parts, ignore_index=True)


def make_figures(results: Results, sources: Sources):
    """Every figure: key -> (matplotlib Figure, its series as a DataFrame for DVC plots or None)."""
    preset = results.preset
    coco, amos = FIGURES["coco-lm/fig3"], FIGURES["amos/fig4"]  # MNLI against pretraining hours
    headline_runs = list(dict.fromkeys(run for key in HEADLINE for run in TABLES[key].runs()))
    history_runs = sorted(
        {r for s in F.SCL_SERIES.values() for r, _, _ in s}
        | {r for r, _ in F.COPY_CLM_RUNS}
        | {r for r, _, _ in F.CURRICULUM_SERIES}
        | {r for r, _, _ in F.MIX_SERIES}
        | {*coco.runs(), *amos.runs()}
        | set(headline_runs)
    )
    history = metric_history(results, history_runs, HISTORY_METRICS)
    scl = [s for series in F.SCL_SERIES.values() for s in series]
    copy_clm = [(run, metric, label) for _, metric in F.COPY_CLM_PANELS for run, label in F.COPY_CLM_RUNS]
    coco_hours, amos_hours = (
        F.efficiency_points(results.cells, results.pretrain, history, figure.runs()) for figure in (coco, amos)
    )
    crop = F.sweep_points(results.cells, FIGURES["coco-lm/fig4"].series, [F.MNLI_M, F.MNLI_MM, F.GLUE_COLUMN])
    depth = F.sweep_points(results.cells, FIGURES["teams/fig4"].series, F.SWEEP_COLUMNS)
    negatives = F.sweep_points(results.cells, FIGURES["teams/fig5"].series, F.SWEEP_COLUMNS)
    lookup = cell_lookup(results.final_cells())
    reference = F.NEGATIVES_REFERENCE  # ELECTRA at the ablation budget: Fig. 5's reference line
    electra = {
        F.GLUE_COLUMN.name: glue_average(lookup, reference),
        SQUAD2[1].name: lookup.get((reference, SQUAD2[1].task, SQUAD2[1].metric), {}).get("median", math.nan),
    }
    cos = cosines(results, sources)
    # Panels that can never fill with this data (GLUE AVG without QQP offline) are left out, not drawn empty.
    glue = [] if sources.glue_avg_unavailable() else [F.GLUE_COLUMN]
    crop_columns, sweep_columns = [F.MNLI_M, F.MNLI_MM, *glue], [*glue, SQUAD2[1]]
    headline = F.headline_points(results.cells, headline_runs, GLUE_AVG_PARTS)
    pretrained = [run for run in headline_runs if run != CONTROL_RUN]
    learning = F.learning_points(history, pretrained)
    return {
        "headline": (F.headline_figure(headline, headline_runs, CONTROL_RUN, preset), headline),
        "learning_curves": (
            F.learning_curves_figure(learning, pretrained, GuardConfig().min_base_rate_gain, preset),
            learning,
        ),
        "coco-lm/fig1-5": (F.cosine_figure(cos, preset), None),
        "coco-lm/fig3": (
            F.efficiency_figure(
                coco_hours,
                coco.subject,
                coco.series["end points"],
                f"COCO-LM Fig. 3: MNLI dev vs pretraining hours ({preset} preset)",
            ),
            coco_hours,
        ),
        "coco-lm/fig4": (F.crop_figure(crop, preset, crop_columns), F.sweep_frame(crop)),
        "coco-lm/fig7a": (F.scl_cosine_figure(history, preset), F.history_frame(history, scl)),
        "coco-lm/fig8": (F.copy_clm_figure(history, preset), F.history_frame(history, copy_clm)),
        "amos/fig3a": (F.mix_weights_figure(history, preset), F.history_frame(history, F.MIX_SERIES)),
        "amos/fig3b": (F.curriculum_figure(history, preset), F.history_frame(history, F.CURRICULUM_SERIES)),
        "amos/fig4": (
            F.efficiency_figure(
                amos_hours,
                amos.subject,
                amos.series["end points"],
                f"AMOS Fig. 4: MNLI dev vs pretraining hours ({preset} preset)",
            ),
            amos_hours,
        ),
        "teams/fig4": (F.generator_depth_figure(depth, preset, sweep_columns), F.sweep_frame(depth)),
        "teams/fig5": (F.negatives_figure(negatives, electra, preset, sweep_columns), F.sweep_frame(negatives)),
    }


# --- the report --------------------------------------------------------------------------------------


def training_data_note(results: Results) -> str:
    """How many training examples each fine-tuned task used, against its official training set."""
    from electralab.finetune.tasks import OFFICIAL_TRAIN_SIZES

    cells = results.final_cells()
    used = cells.dropna(subset=["train_examples"]).groupby("task")["train_examples"].max()
    parts = []
    for task, n in used.items():
        full = OFFICIAL_TRAIN_SIZES.get(task)
        share = "all" if full and n >= full else f"a subset of {full:,}" if full else ""
        parts.append(f"{task} {int(n):,} ({share})" if share else f"{task} {int(n):,}")
    return (
        (
            "Fine-tuning examples per task (a subset is a fixed sample, or all the offline mirror has): "
            + "; ".join(parts)
            + "."
        )
        if parts
        else ""
    )


def mark_verdicts(table: BuiltTable, claims: pd.DataFrame) -> None:
    """`row_verdict` for the page: the verdict of the table's claim about each row, i.e. its subject against
    that row (the subject's own row: against the no-pretraining control); none where no claim was decided."""
    decided = claims[(claims["run"] == table.spec.subject) & claims["verdict"].isin([HOLDS, REVERSED, NOISE])]
    verdicts = {
        table.spec.subject if than == table.spec.control else than: verdict
        for than, verdict in zip(decided["than"], decided["verdict"])
    }
    table.frame["row_verdict"] = table.frame["run"].map(verdicts).fillna("")


def summary_metrics(results: Results, tables: dict[str, BuiltTable], claims: pd.DataFrame | None = None) -> dict:
    """DVC metrics (metrics/report.json): per run our GLUE average, MNLI-m and SQuAD 2.0 F1 medians,
    per table how many of our cells are filled and how many claims hold, are reversed or within noise.
    Absent values are left out (JSON has no NaN)."""
    lookup = cell_lookup(results.final_cells())
    runs = sorted({run for run, _, _ in lookup})
    per_run = {
        "glue_avg": {r: glue_average(lookup, r) for r in runs},
        "mnli_m": {r: lookup.get((r, "mnli", "accuracy"), {}).get("median", math.nan) for r in runs},
        "squad2_f1": {r: lookup.get((r, "squad2", "f1"), {}).get("median", math.nan) for r in runs},
    }
    out = {name: {r: round(v, 4) for r, v in values.items() if not math.isnan(v)} for name, values in per_run.items()}
    out["cells"] = {}
    for key, t in tables.items():
        ours = t.frame[t.frame["run"] != ""]
        out["cells"][key] = {"filled": int(ours["ours"].notna().sum()), "total": int(len(ours))}
    if claims is not None and not claims.empty:
        out["claims"] = {
            key: {str(v): int(n) for v, n in group["verdict"].value_counts().items()}
            for key, group in claims.groupby("table", sort=False)
        }
    return out


def provenance(results: Results, state: WorkspaceState | None) -> list[str]:
    """Where the numbers come from (Markdown lines): the pretraining runs and their DVC experiments, the runs
    left out because their fine-tuning is of another pretraining run, the tasks that could not run and why."""
    where = (
        "the runs this workspace's metrics/pretrain and metrics/finetune files name"
        if state is not None
        else "the latest finished run of each name (no workspace state given)"
    )
    out = [
        f"Numbers come from {where}.",
        "",
        "| run | MLflow run | DVC experiment | steps | commit | precision | machine | load at start | ended (UTC) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.pretrain.sort_values("run").itertuples():
        steps = "" if pd.isna(r.steps) else f"{r.steps:.0f}"
        out.append(
            f"| `{r.run}` | {r.run_id[:8]} | {r.dvc_exp or 'workspace'} | {steps} | {r.commit[:7]} | {r.precision} "
            f"| {r.machine} | {r.load_at_start} | {r.ended} |"
        )
    for run in results.stale:
        out.append(
            f"\n`{run}`: its fine-tuning is of another pretraining run than models/{run} (stale; "
            f"dvc repro finetune@{run}), so its fine-tuning cells are left empty."
        )
    if len(results.missing):
        out += ["", "Could not run (fine-tuning recorded them as missing):", ""]
        out += [f"- `{m.run}` {m.task}: {m.reason}" for m in results.missing.sort_values(["run", "task"]).itertuples()]
    return out


def build_report(
    preset: str,
    out_dir: str | Path,
    tracking_uri: str | None = None,
    *,
    sources: Sources | None = None,
    runs: Iterable[str] | None = None,
    state: WorkspaceState | None = None,
) -> dict:
    """Build every table and figure of `preset` from MLflow into out_dir (replaced atomically).

    runs: the run names of params.yaml's registry, to check that every table names existing runs.
    state: the MLflow runs the workspace's outputs name (build.workspace_state): only those are read.
    Returns {"preset", "tables": {key: BuiltTable}, "figures": {key: png path}, "metrics": {...}}."""
    check_preset(preset)
    if runs is not None:
        check_specs(runs)
    sources = sources or Sources()
    results = fetch_results(preset, tracking_uri, state)
    tables = build_tables(results)
    compute = metric_history(results, sorted({r for t in tables.values() for r in t.spec.runs()}), ["device_hours"])
    claims = {key: check_claims(table.spec, results, compute) for key, table in tables.items()}
    reasons = missing_reasons(results)
    for key, table in tables.items():  # the `why` of every empty cell, and each row's claim verdict
        explain(table, results, reasons, dict(sources.unavailable))
        mark_verdicts(table, claims[key])
    out_dir = Path(out_dir)
    figure_paths: dict[str, Path] = {}
    built = datetime.now(timezone.utc)
    with atomic_dir(out_dir) as tmp:
        for sub in ("tables", "figures", "plots"):
            (tmp / sub).mkdir()
        markdown = []
        for key, table in tables.items():
            md = to_markdown(table, sources.note) + "\n" + claims_markdown(claims[key])
            (tmp / "tables" / f"{stem(key)}.md").write_text(md, encoding="utf-8")
            to_csv(table, tmp / "tables" / f"{stem(key)}.csv")
            markdown.append(md)
        all_claims = pd.concat(list(claims.values()), ignore_index=True)
        all_claims.to_csv(tmp / "claims.csv", index=False, float_format="%.6g")
        columns = ["run", "method", "run_id", "dvc_exp", "steps", *PROVENANCE, "ended"]
        results.pretrain[columns].sort_values("run").to_csv(tmp / "provenance.csv", index=False)
        write_json(tmp / "built.json", {"preset": preset, "built_utc": f"{built:%Y-%m-%d %H:%M}"})
        for key, (figure, series) in make_figures(results, sources).items():
            F.save(figure, tmp / "figures" / f"{stem(key)}.png")
            if series is not None:
                series.to_csv(tmp / "plots" / f"{stem(key)}.csv", index=False, float_format="%.6g")
            figure_paths[key] = out_dir / "figures" / f"{stem(key)}.png"
        title = f"electralab report — {preset} preset"
        intro = [
            f"Built {built:%Y-%m-%d %H:%M} UTC from MLflow experiment "
            f"{tracking.experiment_name(preset)} ({results.tracking_uri})."
        ]
        if sources.note:
            intro.append(f"Data: {sources.note}")
        if used := training_data_note(results):
            intro.append(used)
        for failure in results.failed.itertuples():  # a broken run is named, never a table cell
            intro.append(f"Not in any table: run {failure.run}, whose pretraining failed ({failure.error}).")
        links = "\n\n".join(f"![{key}](figures/{stem(key)}.png)" for key in figure_paths)
        origin = provenance(results, state)
        bounds = limits({key: table.spec for key, table in tables.items()}, results, all_claims)
        shows = "## What these numbers can and cannot show\n\n" + "\n".join(bounds) + "\n\n" if bounds else ""
        (tmp / "report.md").write_text(
            f"# {title}\n\n" + "\n\n".join(intro) + f"\n\n{shows}## Where the numbers come "
            "from\n\n" + "\n".join(origin) + "\n\n" + "\n".join(markdown) + f"\n## Figures\n\n{links}\n",
            encoding="utf-8",
        )
        runs_line = "; ".join(
            f"{r.run} {r.run_id[:8]} ({r.dvc_exp or 'workspace'})"
            for r in results.pretrain.sort_values("run").itertuples()
        )
        intro = [
            *intro,
            *(line.replace("`", "").strip() for line in origin if line.strip() and not line.startswith("|")),
            f"Pretraining runs (MLflow run, DVC experiment): {runs_line or 'none'}",
            *(line.removeprefix("- ").replace("**", "") for line in bounds),
        ]
        pngs = {key: tmp / "figures" / f"{stem(key)}.png" for key in figure_paths}
        tables_html = [table_html(t, sources.note) + claims_details(claims[k]) for k, t in tables.items()]
        left_out = sources.glue_avg_unavailable()
        notes = (
            [
                f"GLUE AVG panels are left out (COCO-LM Fig. 4, TEAMS Fig. 4 and 5): the average needs all eight "
                f"GLUE tasks, and with this data {left_out}."
            ]
            if left_out
            else []
        )
        (tmp / "index.html").write_text(page_html(title, intro, tables_html, pngs, notes), encoding="utf-8")
    return {
        "preset": preset,
        "tables": tables,
        "claims": all_claims,
        "figures": figure_paths,
        "metrics": summary_metrics(results, tables, all_claims),
        "results": results,
    }


__all__ = ["Sources", "build_report", "make_figures", "mark_verdicts", "stem", "summary_metrics", "TABLES"]
