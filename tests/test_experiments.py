"""DVC as users run it, where it meets our stages: `dvc exp run --temp` and `--queue` + `dvc queue start` train
in their own copy of the project and write nothing into the workspace, and their MLflow runs land in the
project's store (DVC points DVC_ROOT at the parent repository for them; docs/training.md); a failed
`dvc repro` of fine-tuning or the report leaves their previous results in place (docs/operations.md)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import mirror_root
from ops_helpers import make_project
from project_helpers import BIN, env_for, run, set_param

from electralab.io import sha256_file

DVC = str(BIN / "dvc")


def snapshot(project: Path) -> dict[str, str]:
    """What the workspace's pretrain@mlm left: its files' hashes."""
    files = [*(project / "models" / "mlm").rglob("*"), project / "metrics" / "pretrain" / "mlm.json"]
    return {str(p.relative_to(project)): sha256_file(p) for p in files if p.is_file()}


def experiment_steps(project: Path, env: dict) -> dict[str, int]:
    """`dvc exp show`: experiment name -> the steps its metrics file records."""
    proc = run([DVC, "exp", "show", "--json"], project, env)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for baseline in json.loads(proc.stdout):
        for exp in baseline.get("experiments") or []:
            for revision in exp.get("revs") or []:
                data = revision.get("data") or {}
                metrics = (data.get("metrics") or {}).get("metrics/pretrain/mlm.json", {}).get("data", {})
                if revision.get("name") and "steps" in metrics:
                    out[revision["name"]] = metrics["steps"]
    return out


@pytest.mark.slow
def test_temp_and_queued_experiments_run_and_write_only_in_their_own_copy(tmp_path):
    project = make_project(tmp_path / "project")
    env = env_for(project, mirror_root())  # no MLFLOW_TRACKING_URI: the project's own mlflow.db
    proc = run([DVC, "repro", "pretrain@mlm"], project, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before = snapshot(project)
    assert json.loads((project / "metrics" / "pretrain" / "mlm.json").read_text())["steps"] == 8

    proc = run(
        [DVC, "exp", "run", "--temp", "-n", "short", "-S", "presets.tiny.pretrain.steps=4", "pretrain@mlm"],
        project,
        env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert snapshot(project) == before
    assert not (project / "checkpoints" / "mlm").exists()

    proc = run(
        [DVC, "exp", "run", "--queue", "-n", "queued", "-S", "presets.tiny.pretrain.steps=6", "pretrain@mlm"],
        project,
        env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run([DVC, "queue", "start"], project, env).returncode == 0
    deadline = time.monotonic() + 300
    while "queued" not in experiment_steps(project, env):
        status = run([DVC, "queue", "status"], project, env).stdout
        assert "Failed" not in status, status + run([DVC, "queue", "logs", "queued"], project, env).stdout[-3000:]
        assert time.monotonic() < deadline, status
        time.sleep(2)
    assert experiment_steps(project, env) == {"short": 4, "queued": 6}
    assert snapshot(project) == before
    # docs/operations.md's readable view: only the columns that differ, as Markdown (no terminal-width "...")
    shown = run([DVC, "exp", "show", "--only-changed", "--md"], project, env)
    assert shown.returncode == 0 and "presets.tiny.pretrain.steps" in shown.stdout, shown.stdout + shown.stderr
    assert all(name in shown.stdout for name in ("short", "queued")) and "…" not in shown.stdout

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("electralab-tiny").experiment_id], "tags.run = 'mlm'")
    assert sorted((r.data.tags["dvc_exp"], r.data.params["pretrain.steps"], r.info.status) for r in runs) == [
        ("", "8", "FINISHED"),
        ("queued", "6", "FINISHED"),
        ("short", "4", "FINISHED"),
    ]
    subprocess.run([DVC, "queue", "stop"], cwd=project, env=env, capture_output=True, timeout=60)


@pytest.mark.slow
def test_a_failed_repro_leaves_the_previous_finetuning_result_and_report_in_place(tmp_path):
    """DVC deletes a stage's outputs before it runs it: a failing fine-tuning used to take its last result
    (metrics/finetune/<run>.json, in git and in no cache) with it, and a failing report the previous one."""
    project = make_project(tmp_path / "project")
    env = env_for(project, mirror_root())
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for args in (["repro", "finetune@mlm"], ["repro", "--single-item", "report"]):
        proc = run([DVC, *args], project, env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kept = {
        p: p.read_bytes()
        for p in (
            project / "metrics" / "finetune" / "mlm.json",
            project / "metrics" / "report.json",
            project / "reports" / "report.md",
        )
    }

    set_param(project, "presets.tiny.finetune.max_eval_examples", 0)  # out of range: both stages fail
    for args in (["repro", "finetune@mlm"], ["repro", "--single-item", "report"]):
        proc = run([DVC, *args], project, env)
        assert proc.returncode != 0 and "max_eval_examples=0 is out of range" in proc.stdout + proc.stderr
    assert {p: p.read_bytes() for p in kept} == kept
