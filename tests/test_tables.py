"""The table registry (electralab.tables) is the one place that says which run belongs where: a run's
tables, the runs of a table and a run's fine-tuning extras follow from it, and a new ablation row is a row
there plus its run in params.yaml."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from electralab.config import load_params, parse_params
from electralab.errors import ConfigError
from electralab.runs import resolve_all, runs_for_tables
from electralab.tables import REGISTRY, TABLES, Row, in_efficiency_figure, in_few_shot_figure, tables_of

ROOT = Path(__file__).resolve().parents[1]
PARAMS = load_params(ROOT / "params.yaml")


def test_a_runs_tables_are_the_tables_and_figures_that_name_it():
    runs = resolve_all(PARAMS)
    assert runs["mlm"].tables == ("coco-lm/table1", "coco-lm/fig3", "amos/table1", "amos/fig4", "teams/table1")
    assert runs["cocolm_clm_only"].tables == ("coco-lm/table3", "coco-lm/fig7")
    # the last row of every table at its budget, in no figure
    assert runs["control"].tables == ("coco-lm/table1", "amos/table1", "teams/table1")
    assert set(runs["control_ablation"].tables) == set(TABLES) - set(runs["control"].tables)
    assert "tables" not in runs["mlm"].as_params()  # a label, not what it trains: no resume fingerprint
    assert [run for run in PARAMS.runs if not runs[run].tables] == [], "a run no table or figure needs"
    # another pretraining seed of a row: the row's tables, not its figures (they plot runs by name)
    assert runs["mlm_seed2"].tables == ("coco-lm/table1", "amos/table1", "teams/table1") and not tables_of("mlm_seed2")


def test_the_fine_tuning_extras_follow_the_figures():
    assert [run for run in PARAMS.runs if in_efficiency_figure(run)] == ["mlm", "electra", "cocolm", "amos"]
    assert [run for run in PARAMS.runs if in_few_shot_figure(run)] == ["cocolm_ablation", "cocolm_clm_only"]


def test_a_new_row_is_a_row_in_the_registry_and_a_run_in_params(monkeypatch):
    raw = copy.deepcopy(PARAMS.raw)
    raw["runs"]["cocolm_scl_cold"] = {
        "method": "cocolm",
        "budget": "ablation",
        "reads": "data/shards",
        "settings": {"scl_temperature": 0.5},
    }
    table3 = REGISTRY["coco-lm/table3"]
    rows = {"base": (*table3.rows["base"], Row(None, "cocolm_scl_cold", "SCL at temperature 0.5"))}
    monkeypatch.setitem(REGISTRY, table3.key, dataclasses.replace(table3, rows=rows))
    params = parse_params(raw)
    assert resolve_all(params)["cocolm_scl_cold"].tables == ("coco-lm/table3",)
    assert "cocolm_scl_cold" in runs_for_tables(params, ["coco-lm/table3"])


def test_a_run_naming_its_tables_is_told_where_they_are_now():
    raw = copy.deepcopy(PARAMS.raw)
    raw["runs"]["mlm"]["tables"] = ["coco-lm/table1"]
    with pytest.raises(ConfigError, match=r"runs.mlm.tables: .* src/electralab/tables.py; remove the key"):
        resolve_all(parse_params(raw))


def test_the_stages_whose_outputs_follow_the_registry_depend_on_it():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]

    def depends(stage: dict) -> bool:  # the file itself, or a folder holding it
        return any(
            "src/electralab/tables.py".startswith(d.rstrip("/") + ("" if d.endswith(".py") else "/"))
            for d in stage["deps"]
            if isinstance(d, str)
        )

    # the fine-tuning's extras: through what the resolve stage writes of them for each run
    assert depends(stages["resolve"]) and "resolved/finetune/${key}.json" in stages["finetune"]["do"]["deps"]
    assert depends(stages["export"]["do"])  # the model card's tables
    assert depends(stages["report"])
    # Not pretraining: a run's tables only label it in MLflow, and a new row must not retrain every run.
    assert not depends(stages["pretrain"]["do"])
