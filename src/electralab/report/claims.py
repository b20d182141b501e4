"""The papers' claims, checked at the preset that ran: holds, reversed, or within noise.

    claims = check_claims(TABLES["coco-lm/table1"], results)   # one line per comparison

A table makes comparisons: its method against every other row we train (COCO-LM against RoBERTa and
ELECTRA, AMOS Base against each ablation, ...), the extra pairs its spec names (ELECTRA against MLM),
and every pretrained row against the no-pretraining control. For each comparison "A vs B":

- the **score** of a row at one fine-tuning seed is the mean, over the table's tasks that both rows
  have (`claim_columns`), of that seed's value with the configuration the grid selected; seeds are the
  same numbers for every run and task, so a row has one score per seed;
- a row may stand on several pretraining runs: its run and the runs that are other pretraining seeds of it
  (params.yaml `runs.<run>.seed_of`, the MLflow tag `row`); each has its scores per fine-tuning seed;
- **ours** is the difference of the two rows' scores, a row's score the median over its pretraining runs of each
  run's median score (one run: its median); **spread** the pooled standard deviation
  (sqrt((s_A^2 + s_B^2) / 2), ddof=1) of the test's units (below);
- **published** is the same difference from the paper's numbers on the same tasks (where the paper
  prints them per task; TEAMS prints only a GLUE average, which is used instead). Against the control
  the premise "pretraining helps" stands in for it (no paper prints a control);
- the **verdict** comes from Welch's two-sided t-test at ALPHA = 0.05 (`nested_welch`): "holds" when
  significant with the published sign, "reversed" when significant with the other sign, "within noise"
  otherwise; "—" when a row has fewer than two seeds or no published direction exists. Its unit is the
  pretraining run where a row has several (a run's mean over the fine-tuning seeds: the spread between them
  holds the pretraining seeds' noise and the fine-tuning seeds' together), else the fine-tuning seed (one
  pretraining run: its noise is not in the test, which `pretrain_seeds` = 1 says). With one pretraining run a
  side it is the plain Welch test on the per-seed scores; with five seeds a difference of about 1.6 pooled
  standard deviations is the smallest that can be significant, with three pretraining runs a side about 2.8.

**Without its largest task**: a mean over tasks can stand on one of them (at the tiny preset ELECTRA's lead over
the control is STS-B's). Each comparison over two or more tasks is tested again without the task whose own
difference supports the claim's sign most (`largest_task`, its difference `largest_task_ours`), the same test on the
rest: `without_ours`, `without_p_value`, `without_verdict`. A claim that holds only with that task is one task's.

**At equal compute** (TEAMS Fig. 3's framing, and ELECTRA's, which compares at equal FLOPs): each comparison of two
pretrained rows again, the faster row's finished run against the slower row's latest checkpoint, fine-tuned on the
claim's tasks, that had used no more device-hours (the `device_hours` the loop logs: devices x wall-clock hours),
on the tasks both have, with the same test on the fine-tuning seeds. It is each row's own run (a checkpoint is one
run's), and the slower run's checkpoint may come well before equal hours (the fine-tuned checkpoints are at fixed
fractions: `pretrain.checkpoint_fractions`, fine-tuned on `finetune.efficiency_tasks` for the runs of an efficiency
figure). Hours from different machines or loads do not compare: provenance.csv has each run's machine and load.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from electralab.report.build import FINAL, Results, hours_at, row_of
from electralab.report.published import published_table
from electralab.tables import GLUE_AVG, GLUE_AVG_PARTS, Column, TableSpec

ALPHA = 0.05
HOLDS, REVERSED, NOISE, NO_VERDICT = "holds", "reversed", "within noise", "—"
CLAIM_COLUMNS = [
    "table",
    "claim",
    "run",
    "than",
    "tasks",
    "seeds",
    "pretrain_seeds",
    "than_pretrain_seeds",
    "ours",
    "spread",
    "p_value",
    "published",
    "verdict",
    # without its largest task (without_largest): the task that carries the difference most, the claim on the rest
    "largest_task",
    "largest_task_ours",
    "without_ours",
    "without_p_value",
    "without_verdict",
    # at equal compute (at_equal_compute): the rows' device-hours, what was compared (or why nothing), the result
    "hours",
    "than_hours",
    "equal_compute",
    "equal_ours",
    "equal_p_value",
    "equal_verdict",
]


@dataclass(frozen=True)
class Comparison:
    row: str  # the row claimed better (its shown name)
    run: str
    than_row: str
    than: str


def comparisons(spec: TableSpec, setting: str) -> list[Comparison]:
    """The table's comparisons in its published setting (rows we do not train are left out)."""
    rows = {r.run: r.name for r in spec.rows[setting] if r.run}
    pairs = [(spec.subject, run) for run in rows if run not in (spec.subject, spec.control)]
    pairs += [pair for pair in spec.claims if pair[0] in rows and pair[1] in rows]
    pairs += [(run, spec.control) for run in rows if run != spec.control]
    unique = [p for p in dict.fromkeys(pairs) if p[0] in rows and p[1] in rows]
    return [Comparison(rows[a], a, rows[b], b) for a, b in unique]


def claim_columns(spec: TableSpec) -> list[Column]:
    """The per-task columns a comparison averages: the table's own task columns, or the GLUE tasks
    where the table prints only an average (TEAMS)."""
    # MNLI counts once, by its matched accuracy (as in the GLUE average); SQuAD 1.1 is never fine-tuned.
    own = [c for c in spec.columns if c in GLUE_AVG_PARTS or c.task == "squad2"]
    glue = [c for c in own if c.task != "squad2"]
    if not glue and any(c.metric == GLUE_AVG for c in spec.columns):
        return list(GLUE_AVG_PARTS)
    return glue or own


def seed_scores(cells: pd.DataFrame, run: str, columns: list[Column]) -> dict[str, dict[int, float]]:
    """{column name: {seed: value}} of one run, for the columns it has."""
    out = {}
    for column in columns:
        line = cells[(cells["run"] == run) & (cells["task"] == column.task) & (cells["metric"] == column.metric)]
        if not line.empty and isinstance(line.iloc[-1]["seeds"], dict) and line.iloc[-1]["seeds"]:
            out[column.name] = line.iloc[-1]["seeds"]
    return out


def published_difference(spec: TableSpec, setting: str, a: str, b: str, columns: list[str]) -> float:
    """The paper's A - B on the same columns (or its GLUE average where it prints no per-task GLUE)."""
    pub = published_table(spec.paper, spec.table, setting).set_index(["row", "column"])["value"]

    def mean(row: str, names: list[str]) -> float:
        values = [pub.get((row, name), np.nan) for name in names]
        return float(np.mean(values)) if values and not np.isnan(values).any() else math.nan

    per_task = mean(a, columns) - mean(b, columns)
    if math.isfinite(per_task):
        return per_task
    average = next((c.name for c in spec.columns if c.metric == GLUE_AVG), None)
    return mean(a, [average]) - mean(b, [average]) if average else math.nan


def verdict(ours: float, p_value: float, published: float) -> str:
    if not (math.isfinite(p_value) and math.isfinite(published)) or published == 0:
        return NO_VERDICT
    if p_value >= ALPHA or ours == 0:
        return NOISE
    return HOLDS if (ours > 0) == (published > 0) else REVERSED


def welch_p_value(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p of Welch's t-test (NaN with fewer than two values a side; 1 when nothing varies)."""
    return nested_welch([a], [b])[0]


def units(runs: list[np.ndarray]) -> np.ndarray:
    """A row's units of test: its pretraining runs' mean scores where it has several, else its run's scores."""
    return np.array([r.mean() for r in runs]) if len(runs) > 1 else runs[0]


def nested_welch(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[float, float]:
    """(two-sided p, pooled spread) of Welch's t-test between two rows, each a list of its pretraining runs' scores
    per fine-tuning seed, on their `units`. NaN with fewer than two units a side; p 1 when nothing varies."""
    from scipy import stats

    x, y = units(a), units(b)
    if len(x) < 2 or len(y) < 2:
        return math.nan, math.nan
    spread = float(math.sqrt((np.var(x, ddof=1) + np.var(y, ddof=1)) / 2))
    if np.std(x) == 0 and np.std(y) == 0:
        return (0.0 if np.mean(x) != np.mean(y) else 1.0), spread
    with warnings.catch_warnings():
        # One side constant (a task at chance: QNLI's control at 50.0 every seed) makes scipy warn of precision
        # loss in that side's variance; it is exactly 0, and Welch's p is then exactly the other side's t-test.
        warnings.filterwarnings("ignore", "Precision loss occurred in moment calculation", RuntimeWarning)
        return float(stats.ttest_ind(x, y, equal_var=False).pvalue), spread


def pretraining_runs(cells: pd.DataFrame, run: str) -> list[str]:
    """The pretraining runs of `run`'s row: itself, then those whose `row` is it, that have cells."""
    return sorted(set(cells.loc[row_of(cells) == run, "run"]), key=lambda name: (name != run, name))


def common_seeds(runs: list[dict[str, dict[int, float]]], names: list[str]) -> list[int]:
    """The fine-tuning seeds that every run's seed_scores has on every column in `names` (none without either)."""
    return sorted(set.intersection(*[set(s[n]) for s in runs for n in names])) if runs and names else []


def scores(by_column: dict[str, dict[int, float]], columns: list[str], seeds: list[int]) -> np.ndarray:
    """A run's score at each seed (seed_scores' values): the mean over `columns`."""
    return np.array([np.mean([by_column[name][seed] for name in columns]) for seed in seeds])


def at_equal_compute(
    spec: TableSpec, results: Results, history: pd.DataFrame, c: Comparison, columns: list[Column]
) -> dict:
    """The claim's columns of at-equal-compute (module docstring) for comparison `c`; `history` holds the runs'
    logged `device_hours` (build.metric_history). Against the control (no pretraining compute) nothing."""
    steps = dict(zip(results.pretrain["run"], pd.to_numeric(results.pretrain["steps"], errors="coerce")))
    cost = {run: hours_at(history, run, steps.get(run, math.nan)) for run in (c.run, c.than)}
    out = {"hours": cost[c.run], "than_hours": cost[c.than], "equal_compute": ""}
    out |= {"equal_ours": math.nan, "equal_p_value": math.nan, "equal_verdict": NO_VERDICT}
    if c.than == spec.control:
        return out
    if not all(math.isfinite(h) for h in cost.values()):
        return out | {
            "equal_compute": "no device-hours logged for " + " and ".join(r for r in cost if math.isnan(cost[r]))
        }
    fast, slow = sorted((c.run, c.than), key=cost.get)
    full = results.cells[results.cells["label_fraction"] == 1.0]
    tags = sorted(set(full.loc[full["run"] == slow, "checkpoint"]) - {FINAL})
    within = [(hours_at(history, slow, round(int(tag) / 100 * steps[slow])), tag) for tag in tags]
    within = [(at, tag) for at, tag in within if at <= cost[fast]]
    if not within:
        why = f"{slow} has no fine-tuned checkpoint within {fast}'s {cost[fast]:.2f} device-hours"
        return out | {"equal_compute": why}
    at, tag = max(within)
    by_run = {
        fast: seed_scores(full[full["checkpoint"] == FINAL], fast, columns),
        slow: seed_scores(full[full["checkpoint"] == tag], slow, columns),
    }
    shared = [name for name in by_run[c.run] if name in by_run[c.than]]
    seeds = common_seeds(list(by_run.values()), shared)
    if len(seeds) < 2:
        return out | {"equal_compute": f"{slow} at {int(tag)}% has no per-seed scores on the claim's tasks"}
    a, b = scores(by_run[c.run], shared, seeds), scores(by_run[c.than], shared, seeds)
    ours = float(np.median(a) - np.median(b))
    p_value, _ = nested_welch([a], [b])
    published = published_difference(spec, spec.setting_for[results.preset], c.row, c.than_row, shared)
    compared = f"{slow} at {int(tag)}%: {at:.2f} of {fast}'s {cost[fast]:.2f} device-hours; {', '.join(shared)}"
    return out | {
        "equal_compute": compared,
        "equal_ours": ours,
        "equal_p_value": p_value,
        "equal_verdict": verdict(ours, p_value, published),
    }


def row_score(runs: list[np.ndarray]) -> float:
    """A row's score: the median over its pretraining runs of each run's median over the fine-tuning seeds."""
    return float(np.median([np.median(r) for r in runs]))


def difference(mine: list[dict], theirs: list[dict], seeds: list[int], names: list[str]) -> tuple[float, float, float]:
    """(ours, p, spread) of a claim on the tasks `names`: the rows' score difference and `nested_welch`; `mine` and
    `theirs` are the two rows' pretraining runs' seed_scores."""
    a, b = [scores(s, names, seeds) for s in mine], [scores(s, names, seeds) for s in theirs]
    if not (seeds and names and all(np.isfinite(x).all() for x in a + b)):
        return math.nan, math.nan, math.nan
    return row_score(a) - row_score(b), *nested_welch(a, b)


def without_largest(
    mine: list[dict], theirs: list[dict], seeds: list[int], shared: list[str], ours: float, published_of
) -> dict:
    """The claim's columns without its largest task (module docstring); `published_of(tasks)` is the paper's
    difference on `tasks`. Nothing where the claim has one task or no direction."""
    out = {"largest_task": "", "largest_task_ours": math.nan, "without_ours": math.nan}
    out |= {"without_p_value": math.nan, "without_verdict": NO_VERDICT}
    if len(shared) < 2 or not math.isfinite(ours) or ours == 0:
        return out
    own = {name: difference(mine, theirs, seeds, [name])[0] for name in shared}
    largest = max(shared, key=lambda name: math.copysign(1, ours) * own[name])
    rest = [name for name in shared if name != largest]
    rest_ours, rest_p, _ = difference(mine, theirs, seeds, rest)
    return out | {
        "largest_task": largest,
        "largest_task_ours": own[largest],
        "without_ours": rest_ours,
        "without_p_value": rest_p,
        "without_verdict": verdict(rest_ours, rest_p, published_of(rest)),
    }


def check_claims(spec: TableSpec, results: Results, history: pd.DataFrame | None = None) -> pd.DataFrame:
    """The table's claims (module docstring); with `history` (the runs' logged device-hours) at equal compute too."""
    setting = spec.setting_for[results.preset]
    cells = results.final_cells()
    columns = claim_columns(spec)
    lines = []
    for c in comparisons(spec, setting):
        mine = [seed_scores(cells, run, columns) for run in pretraining_runs(cells, c.run)]
        theirs = [seed_scores(cells, run, columns) for run in pretraining_runs(cells, c.than)]
        every = [*mine, *theirs]
        shared = [name for name in (mine or [{}])[0] if theirs and all(name in s for s in every)]
        seeds = common_seeds(every, shared)
        published_of = partial(published_difference, spec, setting, c.row, c.than_row)
        if c.than == spec.control:
            published_of = lambda names: 1.0  # noqa: E731 (the premise: pretraining helps)
        ours, p_value, spread = difference(mine, theirs, seeds, shared)
        published = published_of(shared)
        lines.append(
            {
                "table": spec.key,
                "claim": f"{c.row} > {c.than_row}",
                "run": c.run,
                "than": c.than,
                "tasks": ", ".join(shared),
                "seeds": len(seeds),
                "pretrain_seeds": len(mine) if seeds else 0,
                "than_pretrain_seeds": len(theirs) if seeds else 0,
                "ours": ours,
                "spread": spread,
                "p_value": p_value,
                "published": math.nan if c.than == spec.control else published,
                "verdict": verdict(ours, p_value, published),
                **without_largest(mine, theirs, seeds, shared, ours, published_of),
                **(at_equal_compute(spec, results, history, c, columns) if history is not None else {}),
            }
        )
    return pd.DataFrame(lines, columns=CLAIM_COLUMNS)


__all__ = [
    "ALPHA",
    "CLAIM_COLUMNS",
    "HOLDS",
    "NOISE",
    "NO_VERDICT",
    "REVERSED",
    "at_equal_compute",
    "check_claims",
    "claim_columns",
    "common_seeds",
    "comparisons",
    "difference",
    "nested_welch",
    "pretraining_runs",
    "row_score",
    "scores",
    "verdict",
    "welch_p_value",
    "without_largest",
]
