"""DVC experiments as users run them: `dvc exp run --temp` and `--queue` + `dvc queue start` train in their own
copy of the project and write nothing into the workspace, and their MLflow runs land in the project's store
(DVC points DVC_ROOT at the parent repository for them; docs/training.md)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import mirror_root
from ops_helpers import make_project
from project_helpers import BIN, env_for, run
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
    env = env_for(project, mirror_root())          # no MLFLOW_TRACKING_URI: the project's own mlflow.db
    proc = run([DVC, "repro", "pretrain@mlm"], project, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before = snapshot(project)
    assert json.loads((project / "metrics" / "pretrain" / "mlm.json").read_text())["steps"] == 8

    proc = run([DVC, "exp", "run", "--temp", "-n", "short", "-S", "presets.tiny.pretrain.steps=4", "pretrain@mlm"],
               project, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert snapshot(project) == before
    assert not (project / "checkpoints" / "mlm").exists()

    proc = run([DVC, "exp", "run", "--queue", "-n", "queued", "-S", "presets.tiny.pretrain.steps=6", "pretrain@mlm"],
               project, env)
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

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("electralab-tiny").experiment_id], "tags.run = 'mlm'")
    assert sorted((r.data.tags["dvc_exp"], r.data.params["pretrain.steps"], r.info.status) for r in runs) == [
        ("", "8", "FINISHED"), ("queued", "6", "FINISHED"), ("short", "4", "FINISHED")]
    subprocess.run([DVC, "queue", "stop"], cwd=project, env=env, capture_output=True, timeout=60)
