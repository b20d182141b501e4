"""Bad input to the stage scripts and the flow, as users meet it: each stops with one `error:` line that names
the file, key or value, exit status 2, no traceback and no output (issue 13's list; docs/operations.md)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import mirror_root
from project_helpers import copy_project, env_for, run, set_param, shrink, stage_args


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    project = copy_project(tmp_path_factory.mktemp("bad-input") / "project")
    shrink(project)
    return project


@pytest.fixture
def project(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "project"))


def fails_with(project: Path, args: list[str], message: str) -> None:
    proc = run([sys.executable, *args], project, env_for(project, mirror_root()))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert error and message in error[0], proc.stderr[-3000:]
    assert not (project / "models").exists() and not (project / "metrics" / "pretrain").exists()


def test_missing_shards_manifest(project):
    fails_with(project, stage_args("pretrain", "mlm"), "data/shards/manifest.json: no such file; run the shards stage")


@pytest.mark.parametrize(
    "stage, message",
    [
        ("shards", "data/corpus/manifest.json: no such file; run the corpus stage first (dvc repro corpus)"),
        ("finetune", "models/mlm/encoder: no exported encoder; run the pretraining first"),
        ("export", "models/mlm/summary.json: no such file; run the pretrain@mlm stage first"),
    ],
)
def test_a_missing_input_directory_is_named(project, stage, message):
    fails_with(project, stage_args(stage, "mlm"), message)


def test_a_missing_vocabulary_stops_pretraining_before_it_starts(project):
    """The vocabulary is copied into the model only once training ends: a wrong path must not cost a run."""
    (project / "data" / "shards").mkdir(parents=True)
    (project / "data" / "shards" / "manifest.json").write_text(
        '{"seq_len": 32, "vocab_size": 1000, "dtype": "uint16", "splits": {}}', encoding="utf-8"
    )
    fails_with(
        project,
        stage_args("pretrain", "mlm"),
        "data/vocab/electralab_tokenizer.json: no such file; run the vocab stage first",
    )


def test_corrupt_shards_manifest(project):
    (project / "data" / "shards").mkdir(parents=True)
    (project / "data" / "shards" / "manifest.json").write_text('{"seq_len": 32, "vocab_si', encoding="utf-8")
    fails_with(project, stage_args("pretrain", "mlm"), "data/shards/manifest.json: not a readable manifest")


@pytest.mark.parametrize(
    "dotted, value, message",
    [
        (
            "presets.tiny.pretrain.adam_betas",
            [1.5, 2.0],
            "presets.tiny.pretrain.adam_betas=[1.5, 2.0]: betas must be in [0, 1)",
        ),
        (
            "presets.tiny.pretrain.checkpoint_fractions",
            [1.5, -1],
            "presets.tiny.pretrain.checkpoint_fractions=[1.5, -1.0]",
        ),
    ],
)
def test_out_of_range_pretraining_settings(project, dotted, value, message):
    set_param(project, dotted, value)
    fails_with(project, stage_args("pretrain", "mlm"), message)


def test_a_deleted_steps_line(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    del params["presets"]["tiny"]["pretrain"]["steps"]
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    fails_with(project, stage_args("pretrain", "mlm"), "presets.tiny.pretrain.steps: missing")


def test_a_key_listed_twice(project):
    text = (project / "params.yaml").read_text()
    (project / "params.yaml").write_text(text.replace("\n    pretrain:\n", "\n    pretrain:\n      steps: 3\n", 1))
    fails_with(project, stage_args("pretrain", "mlm"), "key 'steps' appears twice in one mapping")


def test_runs_that_read_each_other(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["runs"]["mlm"]["reads"] = "models/electra"
    params["runs"]["electra"]["reads"] = "models/mlm"
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cycle = "the runs read each other's output in a cycle (mlm -> electra -> mlm)"
    fails_with(project, ["flows/reproduce.py", "--runs", "electra", "--targets"], cycle)
    fails_with(project, stage_args("pretrain", "mlm"), cycle)
