"""The report in MLflow: one run per build (`stage=report`) holding the report directory as artifacts,
and under it one child run per (table, row we train) (`stage=report-row`) whose metrics are the row's
cells, so that the MLflow UI's compare view shows a table's rows with their medians:

    tags.stage = 'report-row' and tags.report_latest = 'true' and tags.tables = 'amos/table2'

Metric names: `<column>` (our median; AMOS Table 2: the difference from our AMOS Base), `std/<column>`,
`published/<column>`, `diff/<column>`. The rows of older builds keep their numbers and get
`report_latest=false`, so the filter above shows only the newest build.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from electralab import tracking
from electralab.errors import failed_or_killed
from electralab.report.build import BuiltTable, Results

ROW_STAGE = "report-row"


def _row_metrics(lines) -> dict[str, float]:
    metrics = {}
    for line in lines.itertuples():
        for prefix, value in (
            ("", line.ours),
            ("std/", line.std),
            ("published/", line.published),
            ("diff/", line.diff),
        ):
            if not math.isnan(value):
                metrics[f"{prefix}{line.column}"] = float(value)
    return metrics


def log_report(results: Results, reports_dir: str | Path, tables: dict[str, BuiltTable]) -> str:
    """Log a finished report directory and its rows to the preset's experiment; returns the run id."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(results.tracking_uri)
    methods = dict(zip(results.pretrain["run"], results.pretrain["method"]))
    where = str(Path(reports_dir).resolve())
    # A build killed before it ended left its run RUNNING: close it (one directory is built by one stage at a time).
    for orphan in client.search_runs(
        [results.experiment_id], "tags.stage = 'report' and attributes.status = 'RUNNING'"
    ):
        if orphan.data.tags.get("reports_dir") == where:
            client.set_tag(orphan.info.run_id, "error", "killed before it ended; built again")
            client.set_terminated(orphan.info.run_id, "KILLED")
    tags = tracking.run_tags(
        run="report", method="", tables=[], preset=results.preset, seed=0, stage="report", reports_dir=where
    )
    parent = client.create_run(results.experiment_id, run_name=f"report-{results.preset}", tags=tags)
    parent_id = parent.info.run_id
    try:
        client.log_artifacts(parent_id, str(reports_dir))
        now = int(time.time() * 1000)
        new_rows = set()
        for key, table in tables.items():
            frame = table.frame[table.frame["run"] != ""]
            for row, lines in frame.groupby("row", sort=False):
                run = lines["run"].iloc[0]
                row_tags = tracking.run_tags(
                    run=run,
                    method=methods.get(run, ""),
                    tables=[key],
                    preset=results.preset,
                    seed=0,
                    stage=ROW_STAGE,
                    report_row=row,
                    report_latest="true",
                    setting=table.setting,
                )
                row_tags["mlflow.parentRunId"] = parent_id
                child = client.create_run(results.experiment_id, run_name=f"{key} | {row}", tags=row_tags)
                client.log_batch(
                    child.info.run_id, metrics=[Metric(k, v, now, 0) for k, v in _row_metrics(lines).items()]
                )
                client.set_terminated(child.info.run_id)
                new_rows.add(child.info.run_id)
        older = client.search_runs(
            [results.experiment_id], f"tags.stage = '{ROW_STAGE}' and tags.report_latest = 'true'", max_results=50_000
        )
        for run in older:
            if run.info.run_id not in new_rows:
                client.set_tag(run.info.run_id, "report_latest", "false")
    except BaseException as error:
        client.set_tag(parent_id, "error", f"{type(error).__name__}: {error}"[:5000])
        client.set_terminated(parent_id, failed_or_killed(error))
        raise
    client.set_terminated(parent_id)
    return parent_id


__all__ = ["ROW_STAGE", "log_report"]
