"""The resolve stage: what each run trains and fine-tunes with, the files pretrain@<run> and finetune@<run>
depend on instead of params.yaml (dvc.yaml). Through DVC: tests/test_pretrain.py's end-to-end test."""

from __future__ import annotations

import json

import yaml
from conftest import ROOT
from project_helpers import load_stage

from electralab.config import load_params
from electralab.runs import resolve_run


def resolve(tmp_path, params: dict, name: str) -> dict[str, dict[str, str]]:
    """Run the stage on `params`; {"pretrain"|"finetune": {run: the file's text}}."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    stage = load_stage("resolve")
    out = tmp_path / name
    stage.run_stage("resolve", stage.main, ["--params", str(path), str(out)], stage.arguments)
    return {kind: {p.stem: p.read_text() for p in (out / kind).glob("*.json")} for kind in ("pretrain", "finetune")}


def test_each_run_gets_what_it_trains_and_fine_tunes_with_and_only_its_own_changes_move_it(tmp_path):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    files = resolve(tmp_path, raw, "before")
    params = load_params(ROOT / "params.yaml")
    assert set(files["pretrain"]) == set(files["finetune"]) == set(params.runs)
    as_params = resolve_run(params, "electra").as_params()
    assert json.loads(files["pretrain"]["electra"]) == json.loads(json.dumps(as_params))
    electra = json.loads(files["finetune"]["electra"])
    assert electra["grids"]["stsb"]["epochs"] == [10] and electra["grids"]["cola"]["epochs"] == [3]  # task_epochs
    assert electra["efficiency_extras"] and not json.loads(files["finetune"]["control"])["efficiency_extras"]
    assert json.loads(files["finetune"]["electra_seed2"])["row"] == "electra"  # the report's row of a seed

    # The ablation budget's steps: the ablation runs' pretraining changes, no main row's, no fine-tuning.
    raw["presets"]["tiny"]["budgets"]["ablation"]["pretrain"]["steps"] = 1000
    after = resolve(tmp_path, raw, "after")
    changed = {run for run in files["pretrain"] if after["pretrain"][run] != files["pretrain"][run]}
    assert changed == {run for run in params.runs if params.runs[run].get("budget") == "ablation"}
    assert after["finetune"] == files["finetune"]
    # A fine-tuning setting: every run's fine-tuning, no pretraining.
    raw["presets"]["tiny"]["finetune"]["task_epochs"]["stsb"] = [5]
    tuned = resolve(tmp_path, raw, "tuned")
    assert tuned["pretrain"] == after["pretrain"]
    assert all(json.loads(text)["grids"]["stsb"]["epochs"] == [5] for text in tuned["finetune"].values())
