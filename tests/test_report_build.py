"""Tables built from a real SQLite MLflow store holding known values (tests/report_helpers.py):
medians and spread, published values and differences, ordering, GLUE AVG, AMOS Table 2's
differences, missing cells as missing, the latest finished parent winning, and clear errors."""

from __future__ import annotations

import html
import math

import numpy as np
import pytest
from report_helpers import COCOLM_MNLI, median_of

from electralab.errors import ConfigError
from electralab.report.build import build_table, fetch_results
from electralab.report.render import to_markdown
from electralab.tables import TABLES


@pytest.fixture(scope="module")
def results(store):
    return fetch_results("tiny", store.uri)


def cell(table, row, column):
    line = table.frame[(table.frame["row"] == row) & (table.frame["column"] == column)]
    assert len(line) == 1, (row, column)
    return line.iloc[0]


def test_cells_are_the_parents_medians_with_spread_published_and_difference(results):
    t = build_table(TABLES["coco-lm/table3"], results)
    c = cell(t, "RTD Only", "CoLA")
    ours = median_of("cocolm_rtd_only", "cola", "mcc")
    assert (c["run"], c["ours"], c["std"], c["min"], c["max"]) == ("cocolm_rtd_only", ours, 0.3, ours - 0.5, ours + 0.4)
    assert c["published"] == 67.3 and c["diff"] == pytest.approx(ours - 67.3)
    stsb = cell(t, "w/o. Rel-Pos", "STS-B")  # Spearman, not Pearson
    assert stsb["ours"] == median_of("cocolm_no_relpos", "stsb", "spearman") and stsb["published"] == 90.6
    assert cell(t, "CLM Only", "MNLI-mm")["ours"] == median_of("cocolm_clm_only", "mnli", "accuracy_mm")
    assert t.decimals == 1 and t.setting == "base" and t.frame["preset"].eq("tiny").all()


def test_rows_and_columns_keep_the_papers_order(results):
    t = build_table(TABLES["coco-lm/table3"], results)
    assert list(dict.fromkeys(t.frame["row"])) == [
        "COCO-LM Base",
        "RTD Only",
        "CLM Only",
        "SCL + RTD",
        "w/o. Rel-Pos",
        "w. ELECTRA's Auxiliary",
        "w. Random Replacements",
        "w. Converged Auxiliary",
        "All-Token LM Only",
        "CLM w/o. Copy",
        "CLM w/o. Stop-grad",
        "No pretraining (control)",
    ]
    assert list(dict.fromkeys(t.frame["column"])) == [
        "MNLI-m",
        "MNLI-mm",
        "QQP",
        "QNLI",
        "SST-2",
        "CoLA",
        "RTE",
        "MRPC",
        "STS-B",
        "AVG",
    ]
    assert cell(t, "w. Random Replacements", "AVG")["group"] == "Training Signal"


def test_missing_cells_and_runs_stay_missing_not_zero(results):
    t = build_table(TABLES["coco-lm/table3"], results)
    rte = cell(t, "CLM w/o. Copy", "RTE")  # that parent was never logged
    assert math.isnan(rte["ours"]) and math.isnan(rte["std"]) and math.isnan(rte["diff"]) and rte["published"] == 76.9
    assert math.isnan(cell(t, "CLM w/o. Copy", "AVG")["ours"])  # an average over 7 of 8 tasks would mislead
    never = t.frame[t.frame["row"] == "CLM w/o. Stop-grad"]  # a run with no fine-tuning at all
    assert never["ours"].isna().all() and never["published"].notna().all()
    md = to_markdown(t)
    assert "| — / 76.9 |" in md and "| 0.0" not in md and "| nan" not in md.lower()
    teams = build_table(TABLES["teams/table1"], results)
    assert math.isnan(cell(teams, "TEAMS-Small", "SQuAD 1.1 EM")["ours"])  # not in the fine-tuning grid


# COCO-LM Table 1 caption: Spearman for STS-B, Matthews for CoLA, accuracy for the rest; MNLI matched.
GLUE_AVG_METRICS = [
    ("mnli", "accuracy"),
    ("qqp", "accuracy"),
    ("qnli", "accuracy"),
    ("sst2", "accuracy"),
    ("cola", "mcc"),
    ("rte", "accuracy"),
    ("mrpc", "accuracy"),
    ("stsb", "spearman"),
]


def test_glue_avg_is_the_mean_of_our_eight_medians_with_mnli_matched(results):
    t = build_table(TABLES["coco-lm/table1"], results)
    expected = np.mean([median_of("electra", task, metric) for task, metric in GLUE_AVG_METRICS])
    avg = cell(t, "ELECTRA (Ours)", "AVG")
    assert avg["ours"] == pytest.approx(expected) and avg["published"] == 85.5
    assert math.isnan(avg["std"])  # no seed spread of an average of medians
    teams = build_table(TABLES["teams/table2"], results)
    assert cell(teams, "Only RTD (i.e., ELECTRA)", "GLUE")["ours"] == pytest.approx(expected)
    assert teams.decimals == 2


def test_latest_finished_parent_wins(results):
    """(cocolm, mnli) was logged three times: the first, a later re-run (wins), a still later FAILED one."""
    t = build_table(TABLES["coco-lm/table1"], results)
    assert cell(t, "COCO-LM", "MNLI-m")["ours"] == COCOLM_MNLI
    assert cell(t, "COCO-LM", "QQP")["ours"] == median_of("cocolm", "qqp", "accuracy")


def test_reference_rows_show_the_paper_only(results):
    t = build_table(TABLES["coco-lm/table1"], results)
    bert = t.frame[t.frame["row"] == "BERT [11]"]
    assert (bert["run"] == "").all() and bert["ours"].isna().all()
    assert cell(t, "BERT [11]", "MNLI-m")["published"] == 84.5
    assert math.isnan(cell(t, "BERT [11]", "MNLI-mm")["published"])  # printed "84.5/-"
    assert list(dict.fromkeys(t.frame["row"]))[-4:] == [
        "RoBERTa (Ours)",
        "ELECTRA (Ours)",
        "COCO-LM",
        "No pretraining (control)",
    ]
    assert "| BERT [11] | reference | — / 84.5 | — / — |" in to_markdown(t)


def test_amos_table2_rows_are_differences_from_our_amos(results):
    t = build_table(TABLES["amos/table2"], results)
    base = cell(t, "AMOS Base", "SQuAD 2.0 F1")
    assert base["ours"] == median_of("amos", "squad2", "f1") and base["published"] == 87.2
    c = cell(t, "4-layer gen.", "SQuAD 2.0 F1")
    step = median_of("amos_gen4", "squad2", "f1") - median_of("amos", "squad2", "f1")
    assert c["ours"] == pytest.approx(step) and c["published"] == -1.2
    assert c["min"] == pytest.approx(step - 0.5) and c["max"] == pytest.approx(step + 0.4) and c["std"] == 0.3
    assert c["diff"] == pytest.approx(step + 1.2)
    assert math.isnan(cell(t, "12-layer gen.", "MNLI-m")["ours"])  # amos_gen12 not trained
    assert "w. final mix weights" not in set(t.frame["row"])  # Table 8 only
    assert f"| +{step:.1f} ±0.3 / -1.2 (+{step + 1.2:.1f}) |" in to_markdown(t)


def test_titles_state_the_preset_and_the_published_setting(results):
    for spec in TABLES.values():
        t = build_table(spec, results)
        assert "ours: tiny preset" in t.title and f"paper: {t.setting} setting" in t.title
        assert "[tiny preset:" in t.title


def test_other_presets_compare_with_their_published_setting(results):
    results_pp = type(results)(**{**results.__dict__, "preset": "base_pp"})
    t = build_table(TABLES["coco-lm/table1"], results_pp)
    assert t.setting == "base++" and "[tiny preset:" not in t.title
    ours = t.frame[t.frame["row"] == "RoBERTa (Ours)"]
    assert (ours["run"] == "mlm").all() and ours["published"].isna().all()  # the paper has no such base++ row
    assert cell(t, "COCO-LM", "MNLI-m")["published"] == 90.2


def test_unknown_preset_and_missing_experiment_are_clear_errors(store):
    with pytest.raises(ConfigError, match="preset='huge' is not a preset"):
        fetch_results("huge", store.uri)
    with pytest.raises(ConfigError, match="no MLflow experiment 'electralab-base' for preset='base'.*electralab-tiny"):
        fetch_results("base", store.uri)


# ---- why a cell is empty, and the compact page --------------------------------------------------------

QQP_OFFLINE = "no dev split: glue/QQP/dev.tsv is not in the ELECTRALAB_DATA mirror"


def explained(key, results, reasons=None):
    from electralab.report.why import explain

    table = build_table(TABLES[key], results)
    explain(table, results, reasons or {}, {"qqp": QQP_OFFLINE})
    return table


def test_every_empty_cell_of_ours_says_why_and_no_filled_one_does(results):
    reasons = {("cocolm_no_copy", "rte"): "no dev split: glue/RTE/dev.tsv is not in the ELECTRALAB_DATA mirror"}
    for key in TABLES:
        frame = explained(key, results, reasons).frame
        assert (frame["ours"].isna() == (frame["why"] != "")).all(), key
    t3 = explained("coco-lm/table3", results, reasons)
    assert cell(t3, "CLM w/o. Copy", "RTE")["why"] == f"RTE: {reasons[('cocolm_no_copy', 'rte')]}"
    assert cell(t3, "CLM w/o. Copy", "AVG")["why"] == "GLUE average of all eight GLUE tasks; missing here: RTE"
    assert cell(t3, "CLM w/o. Stop-grad", "QQP")["why"] == (
        "run cocolm_no_stopgrad is not trained yet: dvc repro pretrain@cocolm_no_stopgrad finetune@cocolm_no_stopgrad"
    )
    assert (
        cell(explained("coco-lm/table3", results), "CLM w/o. Copy", "RTE")["why"]
        == f"RTE: not fine-tuned on this task (presets.{results.preset}.finetune.tasks)"
    )  # no reason logged
    teams = explained("teams/table1", results)
    assert (
        cell(teams, "TEAMS-Small", "SQuAD 1.1 EM")["why"] == "SQuAD 1.1 EM: not in the fine-tuning grid "
        "(docs/finetuning.md)"
    )
    table1 = explained("coco-lm/table1", results)
    assert cell(table1, "BERT [11]", "RTE")["why"] == "a published baseline, not trained here"


def test_the_reasons_the_fine_tuning_stage_logs_reach_the_report(tmp_path, monkeypatch):
    """A task the stage could not run (FinetuneTracker.missing, as finetune@<run> logs it) -> its reason."""
    from conftest import ROOT

    from electralab.config import load_params
    from electralab.finetune.grid import Group
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.track import FinetuneTracker
    from electralab.report.why import missing_reasons
    from electralab.runs import resolve_all

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = resolve_all(load_params(ROOT / "params.yaml"))["mlm"]
    tracker = FinetuneTracker(run, (1, 2), tmp_path / "parents.json")
    tracker.missing(Group("qqp"), TASKS["qqp"], QQP_OFFLINE)
    tracker.missing(Group("mnli", checkpoint="050"), TASKS["mnli"], "not the final checkpoint: not a table cell")
    first_look = FinetuneTracker(run, (1, 2), tmp_path / "first_look.json", purpose="first_look")
    first_look.missing(Group("rte"), TASKS["rte"], "the first look's, not the report's")
    results = fetch_results("tiny", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert missing_reasons(results) == {("mlm", "qqp"): QQP_OFFLINE}


def test_the_page_is_compact_footnotes_empty_cells_and_colours_verdicts_when_the_table_has_them(results):
    from electralab.report.render import VERDICT_LEGEND, page_html, table_html

    table = explained("coco-lm/table3", results)
    page = page_html("t", [], [table_html(table)], {})
    assert (
        html.escape(VERDICT_LEGEND) not in page and "verdict-" not in page.split("</style>")[1]
    )  # no verdicts: no colour
    compact, details = page.split("<details>")[0], page.split("<details>")[1]
    assert "±" not in compact and "±" in details  # the spread only in the details
    footnotes = compact.split('<ol class="why">')[1]  # under the table, each reason once
    whys = set(table.frame.loc[table.frame["run"] != "", "why"]) - {""}
    assert footnotes.count("<li>") == len(whys) and all(html.escape(w) in footnotes for w in whys)
    assert compact.count('<sup class="why"') == (table.frame["ours"].isna() & (table.frame["run"] != "")).sum()

    frame = table.frame  # the claim verdicts, as the report's data will carry them
    frame["verdict"] = np.where(
        frame["row"] == "RTD Only", "holds", np.where(frame["row"] == "CLM Only", "within noise", "")
    )
    frame["row_verdict"] = np.where(frame["row"] == "RTD Only", "reversed", "")
    page = page_html("t", [], [table_html(table)], {})
    assert html.escape(VERDICT_LEGEND) in page
    assert (
        page.count('class="num verdict-holds"')
        == page.count('class="num verdict-within-noise"')
        == len(TABLES["coco-lm/table3"].columns)
    )
    assert 'class="name verdict-reversed">RTD Only<' in page
