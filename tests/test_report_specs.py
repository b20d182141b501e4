"""The table registry against params.yaml's runs and the published data: every run a table or figure names
exists, every published row and column named exists, rows are in the papers' order."""

from __future__ import annotations

from pathlib import Path

import pytest

from electralab.config import PRESETS, load_params
from electralab.errors import ConfigError
from electralab.report.build import check_specs
from electralab.report.published import published_table
from electralab.runs import TABLES as RUN_TABLES
from electralab.runs import run_specs
from electralab.tables import GLUE_AVG, REGISTRY, TABLES

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
FINETUNE_TASKS = {"mnli", "qqp", "qnli", "sst2", "cola", "rte", "mrpc", "stsb", "squad2", "squad1"}


@pytest.fixture(scope="module")
def registry():
    return run_specs(load_params(PARAMS))


def test_the_issue_tables_are_specified():
    assert list(TABLES) == [
        "coco-lm/table1",
        "coco-lm/table3",
        "amos/table1",
        "amos/table2",
        "amos/table8",
        "amos/table9",
        "teams/table1",
        "teams/table2",
        "teams/table3",
        "teams/table4",
    ]
    assert set(TABLES) <= set(RUN_TABLES)


@pytest.mark.parametrize("key", list(REGISTRY))
def test_every_run_of_a_table_or_figure_is_in_params_yaml(key, registry):
    for run in REGISTRY[key].runs():
        assert run in registry, f"{key}: run {run!r} is not in params.yaml runs"


@pytest.mark.parametrize("key", list(TABLES))
def test_rows_are_the_published_rows_in_the_papers_order(key):
    spec = TABLES[key]
    assert set(spec.setting_for) == set(PRESETS) and set(spec.setting_for.values()) <= set(spec.rows)
    for setting, rows in spec.rows.items():
        printed = list(dict.fromkeys(published_table(spec.paper, spec.table, setting)["row"]))
        named = [r.published for r in rows if r.published]
        assert named == printed, f"{key} {setting}: spec rows {named} != the paper's {printed}"
        for row in rows:
            assert row.run or row.published, f"{key} {setting}: a row with neither a run nor a published name"


@pytest.mark.parametrize("key", list(TABLES))
def test_columns_exist_in_the_data_and_name_contract_metrics(key):
    spec = TABLES[key]
    printed = list(dict.fromkeys(published_table(spec.paper, spec.table)["column"]))
    names = [c.name for c in spec.columns]
    assert names == [c for c in printed if c != "Params (M)"], "columns in the paper's order"
    for column in spec.columns:
        assert (column.task is None) == (column.metric == GLUE_AVG)
        assert column.task is None or column.task in FINETUNE_TASKS


def test_a_table_naming_an_unknown_run_is_a_clear_error(registry):
    check_specs(registry)  # the real registry passes
    with pytest.raises(ConfigError, match="coco-lm/table3 names run 'cocolm_no_copy'"):
        check_specs(set(registry) - {"cocolm_no_copy"})
