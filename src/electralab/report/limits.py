"""What a report's numbers can and cannot show, said from its own data (the report's first section).

    lines = limits(specs, results, claims)    # Markdown bullets; [] when nothing needs saying

A verdict is only as good as what stands behind it, and at a small preset three things decide that:

- **one task carrying a claim**: a claim decided on the mean of its tasks whose verdict changes without its largest
  task (claims.py, "Without its largest task") is that task's, not the tasks';
- **tasks that show nothing**: a task on which no trained row of a table beats the table's control (the claims' own
  test, on that task alone) shows no gain from pretraining at this preset, whatever it says of the methods' order;
- **one pretraining run**: a claim whose row stands on one pretraining run tests the fine-tuning seeds' noise only.
"""

from __future__ import annotations

from electralab.report.build import Results
from electralab.report.claims import (
    ALPHA,
    HOLDS,
    NO_VERDICT,
    NOISE,
    REVERSED,
    claim_columns,
    common_seeds,
    comparisons,
    difference,
    pretraining_runs,
    seed_scores,
)
from electralab.tables import TableSpec


def carried_by_one_task(claims) -> list[str]:
    """A line per claim (once, with every table that makes it) that holds or is reversed on its tasks' mean and
    not without its largest task."""
    decided = claims[claims["verdict"].isin([HOLDS, REVERSED])]
    changed = decided[(decided["without_verdict"] != decided["verdict"]) & (decided["without_verdict"] != NO_VERDICT)]
    said: dict[str, list[str]] = {}
    for line in changed.itertuples():
        text = (
            f"**{line.claim}** {line.verdict} on the mean of its tasks ({line.ours:+.2f}) but is "
            f"{line.without_verdict} without {line.largest_task} ({line.largest_task_ours:+.2f} there, "
            f"{line.without_ours:+.2f} on the rest)"
        )
        said.setdefault(text, []).append(line.table)
    return [f"{text}: {', '.join(tables)}." for text, tables in said.items()]


def flat_tasks(specs: dict[str, TableSpec], results: Results) -> list[str]:
    """A line per set of tables whose trained rows beat their control on none of some tasks."""
    cells = results.final_cells()
    said: dict[str, list[str]] = {}
    for key, spec in specs.items():
        columns = claim_columns(spec)
        control = [seed_scores(cells, run, columns) for run in pretraining_runs(cells, spec.control)]
        trained = [c.run for c in comparisons(spec, spec.setting_for[results.preset]) if c.than == spec.control]
        rows = [[seed_scores(cells, run, columns) for run in pretraining_runs(cells, row)] for row in trained]
        rows = [row for row in rows if row]
        if not control or not rows:
            continue

        def beats_control(row: list[dict], name: str) -> bool:
            ours, p_value, _ = difference(row, control, common_seeds([*row, *control], [name]), [name])
            return ours > 0 and p_value < ALPHA

        flat = []
        for column in columns:
            tested = [row for row in rows if all(column.name in s for s in [*row, *control])]
            if tested and not any(beats_control(row, column.name) for row in tested):
                flat.append(column.name)
        if flat:
            text = (
                f"No trained row beats the control on **{', '.join(flat)}** (the claims' test on each task alone): "
                "pretraining shows no gain there at this preset"
            )
            said.setdefault(text, []).append(key)
    return [f"{text} ({', '.join(tables)})." for text, tables in said.items()]


def one_pretraining_run(claims) -> list[str]:
    """A line counting the decided claims whose rows, on either side, stand on one pretraining run."""
    decided = claims[claims["verdict"].isin([HOLDS, REVERSED, NOISE])]
    single = decided[(decided["pretrain_seeds"] <= 1) | (decided["than_pretrain_seeds"] <= 1)]
    if single.empty:
        return []
    return [
        f"{len(single)} of {len(decided)} decided claims compare a row that stands on one pretraining run: their "
        "test holds the fine-tuning seeds' noise, not the pretraining seed's (claims.csv `pretrain_seeds`)."
    ]


def limits(specs: dict[str, TableSpec], results: Results, claims) -> list[str]:
    """The report's limits (module docstring) as Markdown bullets, the claims' (check_claims, every table's)."""
    if claims.empty:
        return []
    lines = [*carried_by_one_task(claims), *flat_tasks(specs, results), *one_pretraining_run(claims)]
    return [f"- {line}" for line in lines]


__all__ = ["carried_by_one_task", "flat_tasks", "limits", "one_pretraining_run"]
