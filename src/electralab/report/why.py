"""Why a cell of our numbers is empty, in words: the `why` column of every table (CSV) and the footnotes of
the page. "—" alone cannot tell "not trained yet" from "can never be filled with this data".

    reasons = missing_reasons(results)             # (run, task) -> the fine-tuning stage's reason (MLflow)
    explain(table, results, reasons, unavailable)  # adds table.frame["why"]

Reasons, most specific first: the reason the fine-tuning stage logged for a task it could not run (a `missing`
tag, e.g. "no dev split: glue/QQP/dev.tsv is not in the ELECTRALAB_DATA mirror"); the GLUE average's missing
parts; a task outside the fine-tuning grid (SQuAD 1.1); a task the data source lacks (`unavailable`, from the
report stage); a run not fine-tuned or not pretrained yet; a difference whose base row is empty.
"""

from __future__ import annotations

import math

import pandas as pd

from electralab import tracking
from electralab.finetune.tasks import TASKS
from electralab.report.build import BuiltTable, Results, cell_lookup, without_purpose
from electralab.tables import GLUE_AVG, GLUE_AVG_PARTS, Column


def missing_reasons(results: Results) -> dict[tuple[str, str], str]:
    """(run, task) -> the reason a fine-tuning parent gave for not running (its `missing` tag), final checkpoint
    and all labels, the latest parent winning."""
    mlflow = tracking.mlflow_module(results.tracking_uri)
    parents = mlflow.search_runs(
        [results.experiment_id], filter_string="tags.stage = 'finetune'", output_format="pandas"
    )
    if parents.empty or "tags.missing" not in parents:
        return {}
    parents = parents[parents["tags.missing"].notna() & (parents["tags.missing"] != "")]
    parents = without_purpose(parents)
    for tag, final in (("tags.checkpoint", "final"), ("tags.label_fraction", "1.0")):
        if tag in parents:
            parents = parents[parents[tag].fillna(final).isin([final, ""])]
    parents = parents.sort_values("start_time")
    return {(r["tags.run"], r["tags.task"]): r["tags.missing"] for _, r in parents.iterrows()}


def _why(
    run: str,
    column: Column,
    lookup: dict,
    reasons: dict,
    unavailable: dict[str, str],
    finetuned: set[str],
    pretrained: set[str],
    preset: str,
) -> str:
    if column.metric == GLUE_AVG:
        absent = [c.name for c in GLUE_AVG_PARTS if (run, c.task, c.metric) not in lookup]
        if len(absent) < len(GLUE_AVG_PARTS) or run in finetuned:
            return f"GLUE average of all eight GLUE tasks; missing here: {', '.join(absent)}"
    elif (run, column.task) in reasons:
        return f"{column.name}: {reasons[(run, column.task)]}"
    elif column.task not in TASKS:
        return f"{column.name}: not in the fine-tuning grid (docs/finetuning.md)"
    if run not in finetuned and run not in pretrained:
        return f"run {run} is not trained yet: dvc repro pretrain@{run} finetune@{run}"
    if run not in finetuned:
        return f"run {run} is not fine-tuned yet: dvc repro finetune@{run}"
    if column.task in unavailable:
        return f"{column.name}: {unavailable[column.task]}"
    return f"{column.name}: not fine-tuned on this task (presets.{preset}.finetune.tasks)"


def explain(
    table: BuiltTable, results: Results, reasons: dict[tuple[str, str], str], unavailable: dict[str, str] | None = None
) -> None:
    """Add `why` to table.frame: empty where our number is there, else the reason (see the module docstring)."""
    lookup = cell_lookup(results.final_cells())
    finetuned = set(results.cells["run"])
    pretrained = set(results.pretrain["run"])
    columns = {c.name: c for c in table.spec.columns}
    base = table.spec.differences_from
    base_run = table.frame.loc[table.frame["row"] == base, "run"].iloc[0] if base else None
    why = []
    for line in table.frame.itertuples():
        ours = line.ours
        if not (isinstance(ours, float) and math.isnan(ours)):
            why.append("")
        elif not line.run:
            why.append("a published baseline, not trained here")
        else:
            column = columns[line.column]
            own = (line.run, column.task, column.metric) in lookup or (
                column.metric == GLUE_AVG and all((line.run, c.task, c.metric) in lookup for c in GLUE_AVG_PARTS)
            )
            if own and base and line.row != base:  # a difference from the base row needs that row too
                why.append(
                    f"a difference from the {base} row, empty: "
                    + _why(base_run, column, lookup, reasons, unavailable or {}, finetuned, pretrained, results.preset)
                )
            else:
                why.append(
                    _why(line.run, column, lookup, reasons, unavailable or {}, finetuned, pretrained, results.preset)
                )
    table.frame["why"] = pd.Series(why, index=table.frame.index, dtype=object)


__all__ = ["explain", "missing_reasons"]
