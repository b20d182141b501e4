"""The claims a table makes, checked (report/claims.py): which comparisons, the per-seed scores, the
published difference, Welch's test and the verdicts; and the per-seed values read back from MLflow."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from electralab.report.build import Results, fetch_results
from electralab.report.claims import (
    HOLDS,
    NO_VERDICT,
    NOISE,
    REVERSED,
    check_claims,
    claim_columns,
    comparisons,
    welch_p_value,
)
from electralab.report.published import published_table
from electralab.tables import TABLES

SEEDS = (1, 2, 3, 4, 5)
NOISE_OF_SEED = {1: -0.4, 2: -0.2, 3: 0.0, 4: 0.2, 5: 0.4}
TASKS = [
    ("mnli", "accuracy"),
    ("qnli", "accuracy"),
    ("sst2", "accuracy"),
    ("cola", "mcc"),
    ("rte", "accuracy"),
    ("mrpc", "accuracy"),
    ("stsb", "spearman"),
]


def results(levels: dict[str, float], spread: float = 1.0, rows: dict[str, str] | None = None) -> Results:
    """Every run at `level` on every task, seed k at level + spread * NOISE_OF_SEED[k]; `rows`: run -> the run it
    is another pretraining seed of (its `row`)."""
    lines = []
    for run, level in levels.items():
        for task, metric in TASKS:
            seeds = {s: level + spread * NOISE_OF_SEED[s] for s in SEEDS}
            values = np.array(list(seeds.values()))
            lines.append(
                {
                    "run": run,
                    "row": (rows or {}).get(run, run),
                    "task": task,
                    "checkpoint": "final",
                    "label_fraction": 1.0,
                    "metric": metric,
                    "median": float(np.median(values)),
                    "std": float(values.std()),
                    "min": values.min(),
                    "max": values.max(),
                    "seeds": seeds,
                    "train_examples": TRAIN_EXAMPLES[task],
                    "run_id": run,
                    "failed": False,
                }
            )
    return Results("tiny", "sqlite://", "0", pd.DataFrame(lines), pd.DataFrame(columns=["run", "method", "run_id"]))


TRAIN_EXAMPLES = {"mnli": 480, "qnli": 320, "sst2": 20_000, "cola": 8_551, "rte": 2_490, "mrpc": 3_668, "stsb": 5_749}


def by_claim(frame: pd.DataFrame) -> dict[str, pd.Series]:
    return {f"{line.run}>{line.than}": line for _, line in frame.iterrows()}


def test_a_table_compares_its_method_with_every_row_its_extra_pairs_and_everything_with_the_control():
    spec = TABLES["coco-lm/table1"]
    pairs = [(c.run, c.than) for c in comparisons(spec, "base")]
    assert pairs == [
        ("cocolm", "mlm"),
        ("cocolm", "electra"),
        ("electra", "mlm"),
        ("mlm", "control"),
        ("electra", "control"),
        ("cocolm", "control"),
    ]
    # MNLI counts once (by MNLI-m), as in the GLUE average; TEAMS prints only a GLUE average.
    assert [c.name for c in claim_columns(spec)] == ["MNLI-m", "QQP", "QNLI", "SST-2", "CoLA", "RTE", "MRPC", "STS-B"]
    assert [c.name for c in claim_columns(TABLES["amos/table2"])] == ["MNLI-m"]  # GLUE only: SQuAD is not in the score
    assert len(claim_columns(TABLES["teams/table1"])) == 8


def test_clear_orderings_hold_a_reversal_is_named_and_a_tie_is_within_noise():
    frame = check_claims(
        TABLES["coco-lm/table1"], results({"cocolm": 60.0, "electra": 65.0, "mlm": 60.2, "control": 40.0})
    )
    claims = by_claim(frame)
    assert claims["cocolm>electra"]["verdict"] == REVERSED  # the paper: COCO-LM above ELECTRA
    assert claims["electra>mlm"]["verdict"] == HOLDS
    assert claims["cocolm>mlm"]["verdict"] == NOISE  # 0.2 points apart, seeds spread 1.6
    assert all(claims[f"{r}>control"]["verdict"] == HOLDS for r in ("mlm", "electra", "cocolm"))
    line = claims["cocolm>electra"]
    assert line["ours"] == pytest.approx(-5.0) and line["seeds"] == 5 and line["p_value"] < 1e-6
    assert line["spread"] == pytest.approx(np.std([v for v in NOISE_OF_SEED.values()], ddof=1))
    assert line["tasks"] == "MNLI-m, QNLI, SST-2, CoLA, RTE, MRPC, STS-B"  # QQP: not fine-tuned here
    assert math.isnan(claims["cocolm>control"]["published"])  # no paper prints a control


def test_the_published_difference_is_the_papers_mean_over_the_same_tasks():
    frame = check_claims(
        TABLES["coco-lm/table1"], results({"cocolm": 60.0, "electra": 59.0, "mlm": 58.0, "control": 40.0})
    )
    pub = published_table("coco-lm", "table1", "base").set_index(["row", "column"])["value"]
    tasks = ["MNLI-m", "QNLI", "SST-2", "CoLA", "RTE", "MRPC", "STS-B"]
    expected = np.mean([pub[("COCO-LM", t)] for t in tasks]) - np.mean([pub[("ELECTRA (Ours)", t)] for t in tasks])
    assert by_claim(frame)["cocolm>electra"]["published"] == pytest.approx(expected)
    # TEAMS prints only a GLUE average: that is the published side there.
    teams = by_claim(
        check_claims(TABLES["teams/table1"], results({"teams": 61.0, "electra": 60.0, "mlm": 59.0, "control": 40.0}))
    )
    pub = published_table("teams", "table1", "small").set_index(["row", "column"])["value"]
    assert teams["teams>electra"]["published"] == pytest.approx(
        pub[("TEAMS-Small", "GLUE")] - pub[("ELECTRA-Small (Our reimplementation)", "GLUE")]
    )


def test_missing_rows_or_single_seeds_give_no_verdict():
    frame = by_claim(check_claims(TABLES["coco-lm/table1"], results({"cocolm": 60.0, "control": 40.0})))
    assert frame["cocolm>electra"]["verdict"] == NO_VERDICT and frame["cocolm>electra"]["seeds"] == 0
    assert frame["cocolm>control"]["verdict"] == HOLDS
    assert math.isnan(welch_p_value(np.array([1.0]), np.array([2.0, 3.0])))
    assert welch_p_value(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 1.0


def test_a_row_constant_over_its_seeds_is_tested_without_a_warning():
    """The control at chance on QNLI scores 50.0 with every seed (seen in the headline run): Welch's test against
    it is the other row's one-sample t-test against 50, and scipy's precision warning (the constant side's zero
    variance) is not printed into the report stage's log."""
    from scipy import stats

    varying, constant = np.array([49.85, 50.4, 50.05, 52.95, 50.0]), np.full(5, 50.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = welch_p_value(varying, constant)
    assert p == pytest.approx(stats.ttest_1samp(varying, 50.0).pvalue)


def test_per_seed_values_come_back_from_the_fine_tuning_parents(store):
    """The store's mlm/electra/cocolm parents log seed<k>_<metric> around their medians (report_helpers)."""
    res = fetch_results("tiny", store.uri)
    cells = res.final_cells()
    line = cells[(cells["run"] == "electra") & (cells["task"] == "cola") & (cells["metric"] == "mcc")].iloc[0]
    assert sorted(line["seeds"]) == [1, 2, 3, 4, 5]
    assert np.median(list(line["seeds"].values())) == pytest.approx(line["median"])
    claims = by_claim(check_claims(TABLES["coco-lm/table1"], res))
    # cocolm sits 0.5 points above electra and 1.0 above mlm on every task, seeds within +-0.2: all hold.
    assert claims["cocolm>electra"]["verdict"] == HOLDS and claims["cocolm>mlm"]["verdict"] == HOLDS
    assert claims["electra>mlm"]["verdict"] == HOLDS
    assert claims["cocolm>control"]["verdict"] == NO_VERDICT  # the store has no control row


def test_the_report_says_how_much_of_each_training_set_was_used():
    from electralab.report import training_data_note

    note = training_data_note(results({"cocolm": 60.0}))
    assert "mnli 480 (a subset of 392,702)" in note and "sst2 20,000 (a subset of 67,349)" in note
    assert "cola 8,551 (all)" in note


def seeded(levels: dict[str, list[float]], spread: float = 1.0) -> Results:
    """Rows on several pretraining runs: row -> each run's level (runs row, row_seed2, row_seed3, ...)."""
    runs = {
        (row if i == 0 else f"{row}_seed{i + 1}"): (row, level)
        for row, ls in levels.items()
        for i, level in enumerate(ls)
    }
    return results(
        {run: level for run, (_, level) in runs.items()}, spread, {run: row for run, (row, _) in runs.items()}
    )


def test_a_rows_pretraining_seeds_are_the_units_of_its_test():
    """Three pretraining runs of ELECTRA 20 points apart (each tight over its fine-tuning seeds) against MLM:
    one run alone would hold against MLM; the three together are within noise, with the runs' spread."""
    spec = TABLES["coco-lm/table1"]
    alone = by_claim(check_claims(spec, results({"electra": 70.0, "mlm": 58.0})))["electra>mlm"]
    assert alone["verdict"] == HOLDS and (alone["pretrain_seeds"], alone["than_pretrain_seeds"]) == (1, 1)
    line = by_claim(check_claims(spec, seeded({"electra": [70.0, 50.0, 60.0], "mlm": [58.0, 59.0, 57.0]})))[
        "electra>mlm"
    ]
    assert (line["pretrain_seeds"], line["than_pretrain_seeds"], line["seeds"]) == (3, 3, 5)
    assert line["verdict"] == NOISE
    assert line["ours"] == pytest.approx(60.0 - 58.0)  # the medians of the runs' medians
    assert line["spread"] == pytest.approx(np.sqrt((np.var([70, 50, 60], ddof=1) + np.var([58, 59, 57], ddof=1)) / 2))
    # Tight pretraining seeds: holds, and the test is Welch's on the runs' means
    line = by_claim(check_claims(spec, seeded({"electra": [65.0, 64.0, 66.0], "mlm": [58.0, 59.0, 57.0]})))[
        "electra>mlm"
    ]
    from scipy import stats

    assert line["verdict"] == HOLDS
    assert line["p_value"] == pytest.approx(stats.ttest_ind([65, 64, 66], [58, 59, 57], equal_var=False).pvalue)


def test_a_row_on_one_pretraining_run_is_tested_on_its_fine_tuning_seeds_against_anothers_runs():
    """Several runs against one (the control): the one's fine-tuning seeds stand for its noise, and
    claims.csv says it stands on one pretraining run."""
    from scipy import stats

    spec = TABLES["coco-lm/table1"]
    line = by_claim(check_claims(spec, seeded({"electra": [65.0, 64.0, 66.0], "control": [40.0]})))["electra>control"]
    assert (line["pretrain_seeds"], line["than_pretrain_seeds"]) == (3, 1) and line["verdict"] == HOLDS
    control = [40.0 + NOISE_OF_SEED[s] for s in SEEDS]
    assert line["p_value"] == pytest.approx(stats.ttest_ind([65, 64, 66], control, equal_var=False).pvalue)


def test_a_tables_cell_of_a_row_on_several_pretraining_runs_pools_every_seed():
    from electralab.report.build import cell_lookup

    res = seeded({"electra": [70.0, 50.0, 60.0], "control": [40.0]})
    lookup = cell_lookup(res.final_cells())
    cell = lookup[("electra", "stsb", "spearman")]
    values = [level + NOISE_OF_SEED[s] for level in (70.0, 50.0, 60.0) for s in SEEDS]
    assert cell["median"] == pytest.approx(np.median(values)) and cell["std"] == pytest.approx(np.std(values, ddof=1))
    assert (cell["min"], cell["max"], cell["failed"]) == (pytest.approx(49.6), pytest.approx(70.4), False)
    assert ("electra_seed2", "stsb", "spearman") not in lookup  # the seeds are the row's, not rows of their own
    assert lookup[("control", "stsb", "spearman")]["median"] == pytest.approx(40.0)  # one run: its own cell
    # One pretraining seed diverged on a task: the row's cell is failed, not the other seeds' median
    cells = res.final_cells().copy()
    broken = (cells["run"] == "electra_seed3") & (cells["task"] == "stsb")
    cells.loc[broken, "failed"] = True
    assert cell_lookup(cells)[("electra", "stsb", "spearman")]["failed"]


def test_at_equal_compute_the_faster_rows_end_meets_the_slower_rows_last_checkpoint_within_its_hours():
    """COCO-LM beats ELECTRA and MLM at equal tokens but took 3 device-hours to their 1 and 0.8; its checkpoint at 25%
    (0.75 h; 50% is 1.5 h), fine-tuned on STS-B and MRPC, is 15 below ELECTRA's end: reversed at equal compute."""
    import dataclasses

    from electralab.report.render import claims_markdown

    spec = TABLES["coco-lm/table1"]
    res = results({"cocolm": 70.0, "electra": 65.0, "mlm": 60.0, "control": 40.0})
    early = results({"cocolm": 50.0}).cells
    early = early[early["task"].isin(["stsb", "mrpc"])]
    cells = pd.concat([res.cells, early.assign(checkpoint="025"), early.assign(checkpoint="050")], ignore_index=True)
    runs = ["cocolm", "electra", "mlm", "control"]
    pretrain = pd.DataFrame({"run": runs, "method": runs, "run_id": runs, "steps": [8000] * 4})
    res = dataclasses.replace(res, cells=cells, pretrain=pretrain)
    total = {"cocolm": 3.0, "electra": 1.0, "mlm": 0.8, "control": 0.01}
    history = pd.DataFrame(
        [(run, "device_hours", step, h * step / 8000) for run, h in total.items() for step in range(0, 8001, 100)],
        columns=["run", "metric", "step", "value"],
    )
    claims = by_claim(check_claims(spec, res, history))
    assert claims["cocolm>electra"]["verdict"] == HOLDS  # at equal tokens
    line = claims["cocolm>electra"]
    assert (line["hours"], line["than_hours"]) == (pytest.approx(3.0), pytest.approx(1.0))
    assert line["equal_ours"] == pytest.approx(50.0 - 65.0) and line["equal_verdict"] == REVERSED
    assert line["equal_compute"] == "cocolm at 25%: 0.75 of electra's 1.00 device-hours; MRPC, STS-B"
    assert claims["cocolm>mlm"]["equal_verdict"] == REVERSED  # 0.75 h within MLM's 0.8
    none = claims["electra>mlm"]  # the slower row has no fine-tuned checkpoint
    assert math.isnan(none["equal_ours"]) and none["equal_verdict"] == NO_VERDICT
    assert none["equal_compute"] == "electra has no fine-tuned checkpoint within mlm's 0.80 device-hours"
    control = claims["cocolm>control"]  # no pretraining compute to equal
    assert control["equal_compute"] == "" and math.isnan(control["equal_ours"])
    text = claims_markdown(check_claims(spec, res, history))
    assert "| At equal compute |" in text and "reversed, -15.00 (p 0.000; cocolm at 25%" in text
    without = check_claims(spec, res)  # no device-hours: the columns stay empty and the table as before
    assert without["equal_ours"].isna().all() and "At equal compute" not in claims_markdown(without)


def carried_by_stsb() -> Results:
    """ELECTRA and COCO-LM at 49 on every task but STS-B (110 and 80), MLM and the control at 50 throughout."""
    res = results({"electra": 49.0, "cocolm": 49.0, "mlm": 50.0, "control": 50.0})
    cells = res.cells.copy()
    for run, level in (("electra", 110.0), ("cocolm", 80.0)):
        at = cells.index[(cells["run"] == run) & (cells["task"] == "stsb")][0]
        cells.at[at, "seeds"] = {s: level + NOISE_OF_SEED[s] for s in SEEDS}
    return Results("tiny", "sqlite://", "0", cells, res.pretrain)


def test_a_claim_carried_by_one_task_is_tested_again_without_it():
    """ELECTRA 61 points above the control on STS-B and 1 below on the six other tasks: +7.9 on the mean holds, and
    without STS-B the claim is reversed; COCO-LM's deficit against ELECTRA is STS-B's too (its most negative task)."""
    from electralab.report.render import claims_markdown

    spec = TABLES["coco-lm/table1"]
    res = carried_by_stsb()
    claims = by_claim(check_claims(spec, res))
    line = claims["electra>control"]
    assert line["ours"] == pytest.approx(60 / 7 - 6 / 7) and line["verdict"] == HOLDS
    assert (line["largest_task"], line["largest_task_ours"]) == ("STS-B", pytest.approx(60.0))
    assert line["without_ours"] == pytest.approx(-1.0) and line["without_verdict"] == REVERSED
    assert line["without_p_value"] < 0.01
    reversal = claims["cocolm>electra"]  # -30 on STS-B, 0 elsewhere: the task is the one pulling most negative
    assert reversal["verdict"] == REVERSED and reversal["largest_task"] == "STS-B"
    assert reversal["without_ours"] == pytest.approx(0.0) and reversal["without_verdict"] == NOISE
    tie = claims["mlm>control"]  # no difference: no direction, nothing to leave out
    assert tie["largest_task"] == "" and tie["without_verdict"] == NO_VERDICT
    text = claims_markdown(check_claims(spec, res))
    assert "| Without its largest task |" in text and "reversed, -1.00 (p 0.001; STS-B +60.00 left out)" in text
    # A claim on one task (AMOS Table 2's MNLI-m) has nothing to leave out.
    one = check_claims(TABLES["amos/table2"], results({"amos": 60.0, "control": 40.0}))
    assert (one["largest_task"] == "").all() and (one["without_verdict"] == NO_VERDICT).all()
    older = check_claims(spec, res).drop(columns=["largest_task", "without_ours"])  # a claims.csv of before
    assert "Without its largest task" not in claims_markdown(older)


def test_the_report_says_which_claims_rest_on_one_task_which_tasks_show_nothing_and_the_pretraining_seeds():
    from electralab.report.limits import limits

    spec = TABLES["coco-lm/table1"]
    res = carried_by_stsb()
    lines = limits({spec.key: spec}, res, check_claims(spec, res))
    assert (
        "- **ELECTRA (Ours) > No pretraining (control)** holds on the mean of its tasks (+7.71) but is reversed "
        "without STS-B (+60.00 there, -1.00 on the rest): coco-lm/table1."
    ) in lines
    carried = [line.split("**")[1] for line in lines if "on the mean of its tasks" in line]
    assert carried == [  # ELECTRA > MLM and COCO-LM > MLM and the control the same way; COCO-LM < ELECTRA: STS-B's -30
        "COCO-LM > RoBERTa (Ours)",
        "COCO-LM > ELECTRA (Ours)",
        "ELECTRA (Ours) > RoBERTa (Ours)",
        "ELECTRA (Ours) > No pretraining (control)",
        "COCO-LM > No pretraining (control)",
    ]
    # Every row but on STS-B sits at or below the control: those six tasks show no gain from pretraining here.
    assert "- No trained row beats the control on **MNLI-m, QNLI, SST-2, CoLA, RTE, MRPC** (" in "\n".join(lines)
    assert lines[-1].startswith("- 6 of 6 decided claims compare a row that stands on one pretraining run")
    # Clear claims on every task, three pretraining runs a row: nothing to say.
    seeded_rows = {"electra": [70.0, 69.0, 71.0], "control": [40.0, 41.0, 39.0]}
    clear = seeded(seeded_rows)
    assert limits({"teams/table1": TABLES["teams/table1"]}, clear, check_claims(TABLES["teams/table1"], clear)) == []
