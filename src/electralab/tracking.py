"""MLflow tracking contracts (DESIGN.md):

* Tracking URI: $MLFLOW_TRACKING_URI when set, else an absolute sqlite:///<project root>/mlflow.db
  (anchored on DVC_ROOT under DVC, the parent repository for a temp or queued experiment, whose copy is
  deleted when it ends; relative paths break inside Ray workers);
  artifacts under <project root>/mlartifacts.
* One experiment per preset ("electralab-<preset>"). Tags on every run: run, method, tables, preset,
  git_sha, dvc_exp, seed (+ stage: pretrain | finetune | report).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable

from electralab.env import repo_root, store_root

EXPERIMENT_PREFIX = "electralab-"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store_root() / 'mlflow.db'}"


def experiment_name(preset: str) -> str:
    return f"{EXPERIMENT_PREFIX}{preset}"


_OPENED: set[str] = set()


def open_store(uri: str) -> None:
    """Create a SQLite store once, under a lock beside it, before anything uses it: two processes creating
    one store race in MLflow's schema migrations (`duplicate column name: step`), so two stages starting
    together on a fresh store crashed. An existing store passes through in milliseconds; a server needs
    nothing."""
    if uri in _OPENED or not uri.startswith("sqlite:///"):
        return
    from mlflow import MlflowClient

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file is closed (or the process dies)
        MlflowClient(uri).search_experiments(max_results=1)   # creates and migrates the schema
    _OPENED.add(uri)


def _mlflow():
    import mlflow  # imported lazily: start-up time matters for small stages and tests

    open_store(tracking_uri())
    mlflow.set_tracking_uri(tracking_uri())
    return mlflow


def ensure_experiment(preset: str) -> str:
    """The experiment id for a preset, created on first use with a local artifact store."""
    mlflow = _mlflow()
    name = experiment_name(preset)
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if tracking_uri().startswith("sqlite:"):
        location = (store_root() / "mlartifacts" / name).as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another process (parallel stages)
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def git_sha() -> str:
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"   # "unknown": no commit yet


def run_tags(*, run: str, method: str, tables: Iterable[str], preset: str, seed: int, stage: str,
             **extra: Any) -> dict[str, str]:
    tags = {"run": run, "method": method, "tables": ",".join(tables), "preset": preset, "git_sha": git_sha(),
            "dvc_exp": os.environ.get("DVC_EXP_NAME", ""), "seed": str(seed), "stage": stage}
    tags.update({k: str(v) for k, v in extra.items()})
    return tags


def flat_params(nested: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dict -> {"a.b": "value"} with MLflow's 6000-character value limit respected."""
    out: dict[str, str] = {}
    for k, v in nested.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flat_params(v, key))
        else:
            out[key] = str(v)[:6000]
    return out


def finite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """MLflow rejects NaN in some stores and plots it poorly: drop non-finite values."""
    return {k: float(v) for k, v in metrics.items() if v == v and abs(float(v)) != float("inf")}


def start_run(*, preset: str, run_name: str, tags: dict[str, str], run_id: str | None = None,
              nested: bool = False, system_metrics: bool = False):
    """Start (or resume, given run_id) an MLflow run; use as a context manager."""
    mlflow = _mlflow()
    experiment_id = ensure_experiment(preset)
    if run_id is not None:
        return mlflow.start_run(run_id=run_id, log_system_metrics=system_metrics)
    return mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags, nested=nested,
                            log_system_metrics=system_metrics)


def close_orphan(run_id: str, why: str) -> None:
    """Mark the RUNNING run of a killed process KILLED, saying why (a run already closed, or deleted from
    the store meanwhile, is left as it is)."""
    from mlflow import MlflowClient

    open_store(tracking_uri())
    client = MlflowClient(tracking_uri())
    try:
        if client.get_run(run_id).info.status != "RUNNING":
            return
    except Exception:   # not in this store (deleted, or another store)
        return
    client.set_tag(run_id, "error", why)
    client.set_terminated(run_id, "KILLED")


def latest_finished_run(preset: str, run: str, stage: str) -> str | None:
    """The id of the latest finished `stage` run (pretrain, finetune, ...) of `run` in the preset's experiment."""
    mlflow = _mlflow()
    experiment = mlflow.get_experiment_by_name(experiment_name(preset))
    if experiment is None:
        return None
    found = mlflow.search_runs([experiment.experiment_id], output_format="list", max_results=1,
                               filter_string=f"tags.stage = '{stage}' and tags.run = '{run}' and "
                                             f"attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"])
    return found[0].info.run_id if found else None


def mlflow_module():
    """The mlflow module, pointed at this project's tracking store."""
    return _mlflow()
