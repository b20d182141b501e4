"""MLflow tracking contracts (DESIGN.md):

* Tracking URI: $MLFLOW_TRACKING_URI when set, else an absolute sqlite:///<project root>/mlflow.db
  (anchored on DVC_ROOT under DVC: relative paths break inside Ray workers and DVC temp experiments);
  artifacts under <project root>/mlartifacts.
* One experiment per preset ("electralab-<preset>"). Tags on every run: run, method, tables, preset,
  git_sha, dvc_exp, seed (+ stage: pretrain | finetune | report).
* Without MLflow (a GPU machine that has only torch): the same records go to the run log, plain files
  under $ELECTRALAB_RUNLOG (default <project root>/runlog), importable into MLflow later
  (electralab.runlog). $ELECTRALAB_TRACKING picks one: mlflow | file; unset, MLflow when it is installed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

from electralab.env import repo_root
from electralab.errors import ConfigError

EXPERIMENT_PREFIX = "electralab-"
BACKEND_ENV, RUNLOG_ENV = "ELECTRALAB_TRACKING", "ELECTRALAB_RUNLOG"
BACKENDS = ("mlflow", "file")


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


@functools.lru_cache(maxsize=None)
def mlflow_installed() -> bool:
    try:
        return importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):   # a broken or blocked install counts as none
        return False


def backend() -> str:
    """"mlflow" or "file": $ELECTRALAB_TRACKING, else MLflow where it is installed (checked per call:
    cheap, and a test may change the environment)."""
    chosen = os.environ.get(BACKEND_ENV, "").strip().lower()
    if chosen and chosen not in BACKENDS:
        raise ConfigError(f"{BACKEND_ENV}={chosen!r}: choose one of {list(BACKENDS)}, or unset it (MLflow when "
                          f"installed, else the run log)")
    if chosen == "mlflow" and not mlflow_installed():
        raise ConfigError(f"{BACKEND_ENV}=mlflow but mlflow is not installed here; unset it to track to the run "
                          f"log ({runlog_dir()}) and import that into MLflow later")
    if chosen:
        return chosen
    if mlflow_installed():
        return "mlflow"
    _say_file_once(str(runlog_dir()))
    return "file"


@functools.lru_cache(maxsize=None)
def _say_file_once(where: str) -> None:
    print(f"tracking: mlflow is not installed here; runs go to the run log {where} "
          f"(import it into MLflow with electralab.runlog.import_runlog)", file=sys.stderr)


def runlog_dir() -> Path:
    return Path(os.environ.get(RUNLOG_ENV) or repo_root() / "runlog").resolve()


def client():
    """An MlflowClient on the tracking store, or the run log's FileClient (the same methods)."""
    if backend() == "file":
        from electralab.runlog import FileClient

        return FileClient(runlog_dir())
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri())


def metric(key: str, value: float, timestamp: int, step: int):
    """A metric entity both clients take (MLflow's own where it is installed)."""
    if mlflow_installed():
        from mlflow.entities import Metric
    else:
        from electralab.runlog import Metric
    return Metric(key, value, timestamp, step)


def param(key: str, value: str):
    if mlflow_installed():
        from mlflow.entities import Param
    else:
        from electralab.runlog import Param
    return Param(key, value)


def experiment_name(preset: str) -> str:
    return f"{EXPERIMENT_PREFIX}{preset}"


def _mlflow():
    import mlflow  # imported lazily: start-up time matters for small stages and tests

    mlflow.set_tracking_uri(tracking_uri())
    return mlflow


def ensure_experiment(preset: str) -> str:
    """The experiment id for a preset, created on first use with a local artifact store (the run log
    names experiments by name)."""
    if backend() == "file":
        return experiment_name(preset)
    return ensure_mlflow_experiment(experiment_name(preset))


def ensure_mlflow_experiment(name: str, uri: str | None = None) -> str:
    """The id of MLflow experiment `name` in the store at `uri` (default: this project's), created when absent."""
    import mlflow

    uri = uri or tracking_uri()
    mlflow.set_tracking_uri(uri)
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:"):
        location = (repo_root() / "mlartifacts" / name).as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another process (parallel stages)
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def git_sha() -> str:
    """The commit that runs; $ELECTRALAB_GIT_SHA where the copy has no .git (the GPU sprint's)."""
    if os.environ.get("ELECTRALAB_GIT_SHA"):
        return os.environ["ELECTRALAB_GIT_SHA"]
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


def mlflow_module():
    """The mlflow module, pointed at this project's tracking store."""
    return _mlflow()
