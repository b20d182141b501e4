"""MLflow -> pandas -> one DataFrame per table (docs/tracking.md is the contract read here).

    results = fetch_results("tiny")                     # every finished run of electralab-tiny
    table = build_table(TABLES["coco-lm/table3"], results)
    table.frame    # one line per (row, column): ours (median), std, min, max, published, diff

Conventions (docs/reproducing.md):
* "ours" is the median over the fine-tuning seeds that the fine-tuning parent run of (run, task)
  logs as `median_<metric>`; the spread is its `std_`, `min_`, `max_<metric>`.
* Fine-tuning metrics are logged in percentage points, as the papers print them (88.5, not 0.885).
* Only FINISHED runs count. Given the workspace's state (`workspace_state`: the MLflow run ids its
  metrics/pretrain and metrics/finetune files record), only the runs it names count, so every number
  describes the outputs the report sits beside; fine-tuning of another pretraining run than the workspace's
  is left out (stale). Without it (a bare store), the latest start of each (run, task) wins.
* Anything absent stays NaN (rendered "—"), never 0: a missing run, task, metric, or published value; a
  metric whose median is not a number (a diverged model) is marked failed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from electralab import tracking
from electralab.config import PRESETS
from electralab.errors import ConfigError
from electralab.report.published import published_table
from electralab.tables import GLUE_AVG, GLUE_AVG_PARTS, REGISTRY, TABLES, Column, TableSpec

STATS = ("median", "std", "min", "max")
FINAL = "final"  # the `checkpoint` tag of a fine-tuning parent on the finished pretraining run


@dataclass
class Results:
    """What the report reads from one preset's MLflow experiment."""

    preset: str
    tracking_uri: str
    experiment_id: str
    cells: pd.DataFrame  # run, task, checkpoint, label_fraction, metric, median, std, min, max, seeds, ..., failed
    pretrain: pd.DataFrame  # run, method, run_id, steps, dvc_exp, and final_* metrics: one per pretraining run
    missing: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["run", "task", "reason"]))
    stale: list[str] = field(default_factory=list)  # runs whose fine-tuning is of another pretraining run
    # runs whose latest pretraining attempt failed (collapsed, diverged): run, error. Not in any table.
    failed: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["run", "error"]))

    def final_cells(self) -> pd.DataFrame:
        return final_cells(self.cells)


def final_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells of the finished pretraining runs, fine-tuned on all labels (the tables' cells)."""
    return cells[(cells["checkpoint"] == FINAL) & (cells["label_fraction"] == 1.0)]


def check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise ConfigError(f"preset={preset!r} is not a preset; choose one of {list(PRESETS)}")


def experiment_id(preset: str, tracking_uri: str) -> str:
    """The preset's experiment, or a ConfigError naming it, the store and the experiments it has."""
    check_preset(preset)
    mlflow = tracking.mlflow_module(tracking_uri)
    name = tracking.experiment_name(preset)
    found = mlflow.get_experiment_by_name(name)
    if found is None:
        known = sorted(e.name for e in mlflow.search_experiments())
        raise ConfigError(
            f"no MLflow experiment {name!r} for preset={preset!r} in {tracking_uri} "
            f"(experiments there: {', '.join(known) or 'none'}); run the pretrain and finetune "
            f"stages of this preset first, or point MLFLOW_TRACKING_URI at their store"
        )
    return found.experiment_id


@dataclass(frozen=True)
class WorkspaceState:
    """The MLflow runs a workspace's outputs are: metrics/pretrain/<run>.json `mlflow_run_id`, and
    metrics/finetune/<run>.json `mlflow` (its parents and the pretraining run it fine-tuned)."""

    pretrain: dict[str, str]  # run -> pretraining MLflow run id
    finetune: dict[str, dict]  # run -> {"pretrain_run_id": id, "parents": {group: id}}


def workspace_state(metrics_dir: str | Path) -> WorkspaceState:
    """Read the run ids the stages recorded under metrics_dir (metrics files without them name no run)."""

    def read(kind: str) -> dict[str, dict]:
        out = {}
        for path in sorted((Path(metrics_dir) / kind).glob("*.json")):
            try:
                out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise ConfigError(f"{path}: not a metrics file ({e}); run its stage again") from None
        return out

    pretrain = {run: m["mlflow_run_id"] for run, m in read("pretrain").items() if m.get("mlflow_run_id")}
    finetune = {run: m["mlflow"] for run, m in read("finetune").items() if isinstance(m.get("mlflow"), dict)}
    return WorkspaceState(pretrain, finetune)


def _latest_finished(runs: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    runs = runs[runs["status"] == "FINISHED"]
    return runs.sort_values("start_time").drop_duplicates(key, keep="last")


def _search(mlflow, experiment: str, stage: str) -> pd.DataFrame:
    return mlflow.search_runs(
        experiment_ids=[experiment], filter_string=f"tags.stage = '{stage}'", output_format="pandas"
    )


def without_purpose(parents: pd.DataFrame) -> pd.DataFrame:
    """The fine-tuning parents made for the report: not those tagged with another reader's purpose (the first
    look's; tracking.PURPOSE_TAG)."""
    return parents[_tag(parents, tracking.PURPOSE_TAG, "") == ""] if not parents.empty else parents


def _tag(runs: pd.DataFrame, name: str, default: str) -> pd.Series:
    """A tag column, `default` where the tag (or the whole column) is absent."""
    column = f"tags.{name}"
    if column not in runs:
        return pd.Series(default, index=runs.index, dtype=object)
    return runs[column].fillna(default).replace("", default)


def _finetune_cells(parents: pd.DataFrame) -> pd.DataFrame:
    """Fine-tuning parents (one per run, task, checkpoint, label fraction) -> one line per metric."""
    columns = [
        "run",
        "row",
        "task",
        "checkpoint",
        "label_fraction",
        "metric",
        *STATS,
        "seeds",
        "train_examples",
        "run_id",
        "failed",
    ]
    if parents.empty:
        return pd.DataFrame(columns=columns)
    parents = parents.assign(
        run=_tag(parents, "run", ""),
        task=_tag(parents, "task", ""),
        checkpoint=_tag(parents, "checkpoint", FINAL),
        label_fraction=pd.to_numeric(_tag(parents, "label_fraction", "1.0")),
    )
    parents = _latest_finished(parents, ["run", "task", "checkpoint", "label_fraction"])
    row = _tag(parents, "row", "")  # runs from before the tag: each its own row
    parents = parents.assign(row=row.where(row != "", parents["run"]))
    metrics = sorted(c.removeprefix("metrics.median_") for c in parents if c.startswith("metrics.median_"))
    by_seed = [
        (c, *re.fullmatch(r"metrics\.seed(\d+)_(.+)", c).groups())
        for c in parents
        if re.fullmatch(r"metrics\.seed(\d+)_(.+)", c)
    ]
    failed = _tag(parents, "failed_metrics", "")
    lines = []
    for i, p in parents.iterrows():
        where = {
            "run": p["run"],
            "row": p["row"],
            "task": p["task"],
            "checkpoint": p["checkpoint"],
            "label_fraction": p["label_fraction"],
        }
        for m in metrics:
            if pd.isna(p[f"metrics.median_{m}"]):
                continue
            stats = {s: p.get(f"metrics.{s}_{m}", np.nan) for s in STATS}
            seeds = {int(seed): float(p[c]) for c, seed, metric in by_seed if metric == m and not pd.isna(p[c])}
            lines.append(
                {
                    **where,
                    "metric": m,
                    **stats,
                    "seeds": seeds,
                    "train_examples": p.get("metrics.num_train_examples", np.nan),
                    "run_id": p["run_id"],
                    "failed": False,
                }
            )
        for m in filter(None, failed[i].split(",")):  # diverged: no number, and the cell says so
            lines.append(
                {
                    **where,
                    "metric": m,
                    **{s: np.nan for s in STATS},
                    "seeds": {},
                    "train_examples": np.nan,
                    "run_id": p["run_id"],
                    "failed": True,
                }
            )
    return pd.DataFrame(lines, columns=columns).astype({s: float for s in STATS} | {"failed": bool})


def _missing(parents: pd.DataFrame) -> pd.DataFrame:
    """The groups whose latest fine-tuning recorded them as missing (its `missing` tag says why)."""
    if parents.empty or "tags.missing" not in parents:
        return pd.DataFrame(columns=["run", "task", "reason"])
    parents = _latest_finished(
        parents.assign(
            run=_tag(parents, "run", ""),
            task=_tag(parents, "task", ""),
            checkpoint=_tag(parents, "checkpoint", FINAL),
            label_fraction=_tag(parents, "label_fraction", "1.0"),
        ),
        ["run", "task", "checkpoint", "label_fraction"],
    )
    found = parents[parents["tags.missing"].fillna("") != ""]
    return pd.DataFrame({"run": found["run"], "task": found["task"], "reason": found["tags.missing"]}).reset_index(
        drop=True
    )


# A pretraining run's provenance, from its tags (train/loop.py): column -> tag. Older runs lack some: "".
PROVENANCE = {"commit": "git_sha", "precision": "precision", "machine": "machine", "load_at_start": "load_at_start"}


def _pretrain_runs(runs: pd.DataFrame) -> pd.DataFrame:
    if runs.empty:
        return pd.DataFrame(columns=["run", "method", "run_id", "steps", "dvc_exp", *PROVENANCE, "ended"])
    runs = _latest_finished(runs.assign(run=_tag(runs, "run", "")), ["run"])
    out = pd.DataFrame(
        {
            "run": runs["run"],
            "method": _tag(runs, "method", ""),
            "run_id": runs["run_id"],
            "steps": pd.to_numeric(runs.get("params.pretrain.steps"), errors="coerce"),
            "dvc_exp": _tag(runs, "dvc_exp", ""),
            **{name: _tag(runs, tag, "") for name, tag in PROVENANCE.items()},
            "ended": pd.to_datetime(runs["end_time"], utc=True).dt.strftime("%Y-%m-%d %H:%M"),
        }
    )
    for column in runs:
        if column.startswith("metrics.final_"):
            out[column.removeprefix("metrics.")] = runs[column]
    return out.reset_index(drop=True)


def _failed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs whose latest pretraining attempt ended FAILED (the collapse guard, a diverged loss)."""
    if runs.empty:
        return pd.DataFrame(columns=["run", "error"])
    runs = runs.assign(run=_tag(runs, "run", ""), error=_tag(runs, "error", "failed"))
    latest = runs[runs["status"] != "RUNNING"].sort_values("start_time").drop_duplicates(["run"], keep="last")
    return latest.loc[latest["status"] == "FAILED", ["run", "error"]].reset_index(drop=True)


def fetch_results(preset: str, tracking_uri: str | None = None, state: WorkspaceState | None = None) -> Results:
    """The finished pretraining runs and fine-tuning parents of the preset's experiment: those `state` names
    (a workspace's outputs), or the latest of each when it is None; and the runs whose pretraining failed."""
    uri = tracking_uri or tracking.tracking_uri()
    experiment = experiment_id(preset, uri)
    mlflow = tracking.mlflow_module(uri)
    parents, pretrain = _search(mlflow, experiment, "finetune"), _search(mlflow, experiment, "pretrain")
    failed = _failed_runs(pretrain)
    stale = []
    if state is None:  # the latest of each: not a fine-tuning made for another reader (the first look's)
        parents = without_purpose(parents)
    else:
        pretrain = pretrain[pretrain["run_id"].isin(set(state.pretrain.values()))] if not pretrain.empty else pretrain
        stale = sorted(run for run, f in state.finetune.items() if f.get("pretrain_run_id") != state.pretrain.get(run))
        keep = {pid for run, f in state.finetune.items() if run not in stale for pid in f.get("parents", {}).values()}
        parents = parents[parents["run_id"].isin(keep)] if not parents.empty else parents
        failed = failed[~failed["run"].isin(set(state.pretrain))].reset_index(drop=True)  # a newer output stands
    return Results(
        preset, uri, experiment, _finetune_cells(parents), _pretrain_runs(pretrain), _missing(parents), stale, failed
    )


def hours_at(history: pd.DataFrame, run: str, step: float, hours: str = "device_hours") -> float:
    """`run`'s logged `hours` (metric_history) interpolated at `step`; NaN where it logged none."""
    logged = history[(history["run"] == run) & (history["metric"] == hours)]
    if logged.empty or not np.isfinite(step):
        return np.nan
    return float(np.interp(step, logged["step"], logged["value"]))


def metric_history(results: Results, runs: list[str], metrics: list[str]) -> pd.DataFrame:
    """Logged values over steps of the pretraining runs: run, metric, step, value (absent ones left out)."""
    from mlflow import MlflowClient

    client = MlflowClient(results.tracking_uri)
    ids = dict(zip(results.pretrain["run"], results.pretrain["run_id"]))
    lines = []
    for run in runs:
        if run not in ids:
            continue
        for metric in metrics:
            lines += [(run, metric, m.step, m.value) for m in client.get_metric_history(ids[run], metric)]
    history = pd.DataFrame(lines, columns=["run", "metric", "step", "value"])
    return history.sort_values(["run", "metric", "step"], kind="stable").reset_index(drop=True)


# --- tables ----------------------------------------------------------------------------------------


@dataclass
class BuiltTable:
    spec: TableSpec
    preset: str
    setting: str  # the published setting compared with
    frame: pd.DataFrame
    decimals: int  # the paper's printed precision

    @property
    def title(self) -> str:
        title = f"{self.spec.name} — ours: {self.preset} preset, paper: {self.setting} setting — {self.spec.caption}"
        if self.preset == "tiny":
            title += " [tiny preset: miniature models on a tiny corpus; compare orderings, not values]"
        if self.spec.differences_from:
            title += f" (rows other than {self.spec.differences_from}: differences from it)"
        return title


TABLE_COLUMNS = [
    "preset",
    "setting",
    "group",
    "row",
    "run",
    "column",
    "ours",
    "std",
    "min",
    "max",
    "published",
    "published_std",
    "failed",
    "diff",
]


def row_of(cells: pd.DataFrame) -> pd.Series:
    """Each cell's row: the run whose table rows it goes into (the `row` tag; cells made without one: its run)."""
    return cells["row"] if "row" in cells else cells["run"]


def cell_lookup(cells: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, float]]:
    """(run, task, metric) -> {median, std, min, max} from final_cells(): for a row that stands on several
    pretraining runs (the `row` tag), keyed by the row's run, over every (pretraining, fine-tuning) seed's value
    of them all, failed when any of them failed."""
    out = {}
    for (row, task, metric), group in cells.groupby([row_of(cells), cells["task"], cells["metric"]], sort=False):
        if len(group) == 1:
            r = group.iloc[0]
            out[(row, task, metric)] = {**{s: r[s] for s in STATS}, "failed": bool(r["failed"])}
            continue
        failed = bool(group["failed"].any())
        values = np.array([v for seeds in group["seeds"] for v in seeds.values()], dtype=float)
        if failed:
            pooled = dict.fromkeys(STATS, np.nan)
        elif len(values) > 1:
            pooled = dict(zip(STATS, [np.median(values), np.std(values, ddof=1), values.min(), values.max()]))
        else:  # no per-seed values logged: the runs' medians
            pooled = {**dict.fromkeys(STATS, np.nan), "median": float(np.median(group["median"]))}
        out[(row, task, metric)] = {**pooled, "failed": failed}
    return out


def glue_average(lookup: dict, run: str) -> float:
    """The GLUE average of a run from our medians (NaN unless all eight tasks are there)."""
    values = [lookup.get((run, c.task, c.metric), {}).get("median", np.nan) for c in GLUE_AVG_PARTS]
    return float(np.mean(values)) if not np.isnan(values).any() else np.nan


def cell_value(lookup: dict, run: str | None, column: Column) -> dict[str, float]:
    """Our median, std, min, max of one (run, column) and whether it failed; NaN where absent."""
    missing = {s: np.nan for s in STATS}
    if run is None:
        return missing
    if column.metric == GLUE_AVG:
        # The average of medians has no seed spread of its own: std/min/max stay empty.
        return {**missing, "median": glue_average(lookup, run)}
    return lookup.get((run, column.task, column.metric), missing)


def build_table(spec: TableSpec, results: Results) -> BuiltTable:
    """One table: our medians and spread, the published value and the difference, per (row, column)."""
    setting = spec.setting_for[results.preset]
    pub = published_table(spec.paper, spec.table, setting).set_index(["row", "column"])
    lookup = cell_lookup(results.final_cells())
    unknown = [r.published for r in spec.rows[setting] if r.published and r.published not in pub.index]
    if unknown:
        raise ConfigError(
            f"report table {spec.key} names row {unknown[0]!r}, which published.csv does not have "
            f"in setting {setting!r}"
        )
    lines = []
    for row in spec.rows[setting]:
        group = pub.loc[row.published, "group"].iloc[0] if row.published else ""
        for column in spec.columns:
            ours = cell_value(lookup, row.run, column)
            key = (row.published, column.name)
            published = pub.loc[key, "value"] if row.published and key in pub.index else np.nan
            published_std = pub.loc[key, "std"] if row.published and key in pub.index else np.nan
            lines.append(
                {
                    "preset": results.preset,
                    "setting": setting,
                    "group": group,
                    "row": row.name,
                    "run": row.run or "",
                    "column": column.name,
                    "ours": ours["median"],
                    "std": ours["std"],
                    "min": ours["min"],
                    "max": ours["max"],
                    "published": published,
                    "published_std": published_std,
                    "failed": bool(ours.get("failed", False)),
                }
            )
    frame = pd.DataFrame(lines, columns=TABLE_COLUMNS[:-1])
    if spec.differences_from:
        frame = _as_differences(frame, spec.differences_from)
    frame["diff"] = frame["ours"] - frame["published"]
    return BuiltTable(spec, results.preset, setting, frame, printed_decimals(spec))


def printed_decimals(spec: TableSpec) -> int:
    """The paper's precision in this table (TEAMS prints 81.99, the others 88.5)."""
    lines = published_table(spec.paper, spec.table)
    return int(lines.loc[lines["column"] != "Params (M)", "decimals"].max())


def _as_differences(frame: pd.DataFrame, base_row: str) -> pd.DataFrame:
    """AMOS Table 2: every row but the base shown as ours minus our base row (the paper prints the
    differences the same way). The seeds' min/max move with it; the std is the row's own."""
    frame = frame.copy()
    base = frame[frame["row"] == base_row].set_index("column")["ours"]
    others = frame["row"] != base_row
    shift = frame.loc[others, "column"].map(base)
    for stat in ("ours", "min", "max"):
        frame.loc[others, stat] = frame.loc[others, stat] - shift
    return frame


def build_tables(results: Results) -> dict[str, BuiltTable]:
    return {key: build_table(spec, results) for key, spec in TABLES.items()}


def check_specs(registry_runs) -> None:
    """Every run a table or figure names must be in params.yaml's registry (a renamed run would leave a row
    empty)."""
    registry = set(registry_runs)
    for key, entry in REGISTRY.items():
        for run in entry.runs():
            if run not in registry:
                kind = "table" if key in TABLES else "figure"
                raise ConfigError(
                    f"report {kind} {key} names run {run!r}, which is not in params.yaml runs "
                    f"(known: {', '.join(sorted(registry))})"
                )


__all__ = [
    "BuiltTable",
    "FINAL",
    "Results",
    "WorkspaceState",
    "workspace_state",
    "TABLE_COLUMNS",
    "build_table",
    "build_tables",
    "cell_lookup",
    "cell_value",
    "row_of",
    "final_cells",
    "check_preset",
    "check_specs",
    "experiment_id",
    "fetch_results",
    "glue_average",
    "hours_at",
    "metric_history",
]
