"""MLflow tracking contracts (docs/tracking.md), shared by each stage's own MLflow module: train/track.py,
finetune/track.py and report/track.py.

* Tracking URI: $MLFLOW_TRACKING_URI when set, else an absolute sqlite:///<project root>/mlflow.db
  (anchored on DVC_ROOT under DVC, the parent repository for a temp or queued experiment, whose copy is
  deleted when it ends; relative paths break inside Ray workers);
  artifacts under <project root>/mlartifacts.
* One experiment per preset ("electralab-<preset>"). Tags on every run: run, method, tables, preset,
  git_sha, dvc_exp, seed (+ stage: pretrain | finetune | report).
* Without MLflow (a GPU machine that has only torch): the same records go to the run log, plain files
  under $ELECTRALAB_RUNLOG (default <project root>/runlog), importable into MLflow later
  (electralab.runlog). $ELECTRALAB_TRACKING picks one: mlflow | file; unset, MLflow when it is installed.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable

from electralab.env import git_output, store_root
from electralab.errors import ConfigError

EXPERIMENT_PREFIX = "electralab-"
BACKEND_ENV, RUNLOG_ENV = "ELECTRALAB_TRACKING", "ELECTRALAB_RUNLOG"
BACKENDS = ("mlflow", "file")
# A fine-tuning's parents tagged with a purpose (the first look's "first_look") are for their own reader: the
# report's latest-of-each reading and its reasons for empty cells skip them.
PURPOSE_TAG = "purpose"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store_root() / 'mlflow.db'}"


@functools.lru_cache(maxsize=None)
def mlflow_installed() -> bool:
    try:
        return importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as none
        return False


def backend() -> str:
    """ "mlflow" or "file": $ELECTRALAB_TRACKING, else MLflow where it is installed (checked per call:
    cheap, and a test may change the environment)."""
    chosen = os.environ.get(BACKEND_ENV, "").strip().lower()
    if chosen and chosen not in BACKENDS:
        raise ConfigError(
            f"{BACKEND_ENV}={chosen!r}: choose one of {list(BACKENDS)}, or unset it (MLflow when "
            f"installed, else the run log)"
        )
    if chosen == "mlflow" and not mlflow_installed():
        raise ConfigError(
            f"{BACKEND_ENV}=mlflow but mlflow is not installed here; unset it to track to the run "
            f"log ({runlog_dir()}) and import that into MLflow later"
        )
    if chosen:
        return chosen
    if mlflow_installed():
        return "mlflow"
    _say_file_once(str(runlog_dir()))
    return "file"


@functools.lru_cache(maxsize=None)
def _say_file_once(where: str) -> None:
    print(
        f"tracking: mlflow is not installed here; runs go to the run log {where} "
        f"(import it into MLflow with electralab.runlog.import_runlog)",
        file=sys.stderr,
    )


def runlog_dir() -> Path:
    return Path(os.environ.get(RUNLOG_ENV) or store_root() / "runlog").resolve()


def client():
    """An MlflowClient on the tracking store, or the run log's FileClient (the same methods)."""
    if backend() == "file":
        from electralab.runlog import FileClient

        return FileClient(runlog_dir())
    from mlflow import MlflowClient

    open_store(tracking_uri())
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
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed (or the process dies)
        MlflowClient(uri).search_experiments(max_results=1)  # creates and migrates the schema
    _OPENED.add(uri)


def mlflow_module(uri: str | None = None):
    """The mlflow module, pointed at the store at `uri` (default: this project's)."""
    import mlflow  # lazily: importing it costs about a second, which small stages and tests feel

    # The asynchronous metric writer otherwise polls its queue with a 1 s timeout, and every flush and end_run
    # waits that second out (2 s at each run's end, each fine-tuning trial's included); buffered, it wakes as soon
    # as it is told to stop, and writes at most once a second meanwhile (pretraining flushes it before each
    # checkpoint, so a kill loses no metric of a step the checkpoint covers). A user's own setting wins.
    os.environ.setdefault("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "1")
    uri = uri or tracking_uri()
    open_store(uri)
    mlflow.set_tracking_uri(uri)
    return mlflow


def ensure_experiment(preset: str) -> str:
    """The experiment id for a preset, created on first use with a local artifact store (the run log
    names experiments by name)."""
    if backend() == "file":
        return experiment_name(preset)
    return ensure_mlflow_experiment(experiment_name(preset))


def ensure_mlflow_experiment(name: str, uri: str | None = None) -> str:
    """The id of MLflow experiment `name` in the store at `uri` (default: this project's), created when absent."""
    uri = uri or tracking_uri()
    mlflow = mlflow_module(uri)
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:"):
        location = (store_root() / "mlartifacts" / name).as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another process (parallel stages)
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def git_sha() -> str:
    """The commit that runs; $ELECTRALAB_GIT_SHA where the copy has no .git (the GPU sprint's). No "+changes":
    `dvc repro` itself rewrites the tracked dvc.lock between stages."""
    return os.environ.get("ELECTRALAB_GIT_SHA") or git_output("rev-parse", "HEAD") or "unknown"


def run_tags(
    *, run: str, method: str, tables: Iterable[str], preset: str, seed: int, stage: str, **extra: Any
) -> dict[str, str]:
    tags = {
        "run": run,
        "method": method,
        "tables": ",".join(tables),
        "preset": preset,
        "git_sha": git_sha(),
        "dvc_exp": os.environ.get("DVC_EXP_NAME", ""),
        "seed": str(seed),
        "stage": stage,
    }
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


def finite(value: Any) -> bool:
    """Whether `value` is a finite number: MLflow rejects NaN in some stores and plots it poorly, and a JSON
    metrics file cannot hold it (a bool is no metric)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of `metrics`, as floats: the others are dropped."""
    return {k: float(v) for k, v in metrics.items() if finite(v)}


def start_run(
    *,
    preset: str,
    run_name: str,
    tags: dict[str, str],
    run_id: str | None = None,
    nested: bool = False,
    system_metrics: bool = False,
):
    """Start (or resume, given run_id) an MLflow run; use as a context manager."""
    mlflow = mlflow_module()
    experiment_id = ensure_experiment(preset)
    if run_id is not None:
        return mlflow.start_run(run_id=run_id, log_system_metrics=system_metrics)
    return mlflow.start_run(
        experiment_id=experiment_id, run_name=run_name, tags=tags, nested=nested, log_system_metrics=system_metrics
    )


def close_orphan(run_id: str, why: str) -> None:
    """Mark the RUNNING run of a killed process KILLED, saying why (a run already closed, or deleted from
    the store meanwhile, is left as it is). MLflow's store or the run log, whichever tracks here."""
    store = client()
    try:
        if store.get_run(run_id).info.status != "RUNNING":
            return
    except Exception:  # not in this store (deleted, or another store)
        return
    store.set_tag(run_id, "error", why)
    store.set_terminated(run_id, "KILLED")


def latest_finished_run(preset: str, run: str, stage: str) -> str | None:
    """The id of the latest finished `stage` run (pretrain, finetune, ...) of `run` in the preset's experiment."""
    mlflow = mlflow_module()
    experiment = mlflow.get_experiment_by_name(experiment_name(preset))
    if experiment is None:
        return None
    found = mlflow.search_runs(
        [experiment.experiment_id],
        output_format="list",
        max_results=1,
        filter_string=f"tags.stage = '{stage}' and tags.run = '{run}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
    )
    return found[0].info.run_id if found else None
