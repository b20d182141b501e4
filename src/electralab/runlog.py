"""The run log: MLflow's records in plain files, for machines without MLflow (the GPU sprint's).

    client = FileClient(Path("runlog"))                 # what tracking.client() gives when MLflow is absent
    run_id = client.create_run("electralab-small", run_name="mlm", tags={...}).info.run_id
    client.log_batch(run_id, metrics=[Metric("loss", 2.1, ms, 100)], params=[Param("pretrain.steps", "5000")])
    client.set_terminated(run_id, "FINISHED")
    import_runlog(Path("runlog"), "sqlite:///mlflow.db")  # later, where MLflow is: the same runs, tags, steps

One file per run, `<run id>.jsonl`, one JSON record per line, appended and flushed as it happens, so a
process killed mid-run loses at most the line it was writing (a torn last line is skipped on reading).
Records: create (experiment, name, tags), params, metrics ([key, value, timestamp ms, step]), tags,
artifact (a text kept inline, a small file copied beside the log, a large one named by path: the log must
travel in a few MB), status. The import replays them into MLflow with the same tags, params, metric
steps, timestamps and statuses, parents mapped to their new ids (docs/tracking.md, "Without MLflow").
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, NamedTuple

from electralab.errors import DataError

COPY_LIMIT = 256 << 10  # artifacts up to 256 KiB are copied into the log; larger ones are named
ARTIFACTS = "artifacts"  # <root>/artifacts/<run id>/...: the copied files
STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED")
PARENT_TAG = "mlflow.parentRunId"
LINK_TAGS = (PARENT_TAG, "pretrain_run_id")  # tags that name another run of the log: mapped on import


class Metric(NamedTuple):  # the attributes of mlflow.entities.Metric that the log reads
    key: str
    value: float
    timestamp: int
    step: int


class Param(NamedTuple):
    key: str
    value: str


def now_ms() -> int:
    return int(time.time() * 1000)


class FileClient:
    """The part of mlflow.MlflowClient that electralab's trackers use, writing the run log under `root`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _path(self, run_id: str) -> Path:
        return self.root / f"{run_id}.jsonl"

    def _append(self, run_id: str, record: dict) -> None:
        path = self._path(run_id)
        if record["op"] != "create" and not path.exists():
            raise DataError(f"{path}: no such run in the run log {self.root}")
        line = json.dumps({**record, "t": now_ms()}, default=str)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()

    # --- MlflowClient's names ------------------------------------------------------------------
    def create_run(self, experiment_id: str, run_name: str | None = None, tags: dict | None = None):
        """experiment_id is the experiment's name here (the import finds or creates it by name)."""
        self.root.mkdir(parents=True, exist_ok=True)
        run_id = uuid.uuid4().hex
        self._append(
            run_id,
            {
                "op": "create",
                "experiment": experiment_id,
                "name": run_name,
                "tags": {k: str(v) for k, v in (tags or {}).items()},
            },
        )
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status="RUNNING"))

    def get_run(self, run_id: str):
        run = read_run(self._path(run_id))
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id, status=run.status),
            data=SimpleNamespace(tags=run.tags, params=run.params),
        )

    def has_run(self, run_id: str) -> bool:
        return self._path(run_id).is_file()

    def update_run(self, run_id: str, status: str | None = None, name: str | None = None) -> None:
        if status is not None:
            self._status(run_id, status)

    def set_terminated(self, run_id: str, status: str | None = None, end_time: int | None = None) -> None:
        self._status(run_id, status or "FINISHED")

    def _status(self, run_id: str, status: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"run status {status!r}: choose one of {list(STATUSES)}")
        self._append(run_id, {"op": "status", "status": status})

    def set_tag(self, run_id: str, key: str, value: Any) -> None:
        self.set_tags(run_id, {key: value})

    def log_batch(self, run_id: str, metrics: Iterable = (), params: Iterable = (), tags: Iterable = ()) -> None:
        """metrics/params/tags: objects with .key/.value (.timestamp, .step): MLflow's entities or ours."""
        metrics, params, tags = list(metrics), list(params), list(tags)
        if params:
            self.log_params(run_id, {p.key: p.value for p in params})
        if metrics:
            self._append(
                run_id,
                {"op": "metrics", "metrics": [[m.key, float(m.value), int(m.timestamp), int(m.step)] for m in metrics]},
            )
        if tags:
            self.set_tags(run_id, {t.key: t.value for t in tags})

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._append(run_id, {"op": "artifact", "path": artifact_file, "text": text})

    def log_artifact(self, run_id: str, local_path: str | Path, artifact_path: str | None = None) -> None:
        local = Path(local_path)
        target = f"{artifact_path}/{local.name}" if artifact_path else local.name
        size = local.stat().st_size
        if size <= COPY_LIMIT:
            kept = self.root / ARTIFACTS / run_id / target
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, kept)
            self._append(run_id, {"op": "artifact", "path": target, "copy": kept.relative_to(self.root).as_posix()})
        else:  # named only: where the log is imported, the file may or may not be there
            self._append(run_id, {"op": "artifact", "path": target, "source": str(local.resolve()), "bytes": size})

    def log_artifacts(self, run_id: str, local_dir: str | Path, artifact_path: str | None = None) -> None:
        local_dir = Path(local_dir)
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            parent = path.parent.relative_to(local_dir).as_posix()
            parts = [p for p in (artifact_path, parent if parent != "." else None) if p]
            self.log_artifact(run_id, path, "/".join(parts) or None)

    # --- the trackers' shorthand ---------------------------------------------------------------
    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        self._append(run_id, {"op": "params", "params": {k: str(v) for k, v in params.items()}})

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        t = now_ms()
        self.log_batch(run_id, metrics=[Metric(k, float(v), t, step) for k, v in metrics.items()])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self._append(run_id, {"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    run_id: str
    experiment: str
    name: str | None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: list[tuple[str, float, int, int]] = field(default_factory=list)
    artifacts: list[dict] = field(default_factory=list)
    status: str = "RUNNING"
    start_time: int = 0
    end_time: int | None = None
    records: int = 0


def read_run(path: Path) -> RunRecord:
    """One run's log folded into its final state. A torn last line (a process killed while writing it)
    is skipped; a bad line anywhere else is a DataError naming the file and line."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    run: RunRecord | None = None
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise DataError(f"{path}:{number}: not a JSON record of the run log") from None
        op = record.get("op")
        if run is None:
            if op != "create":
                raise DataError(f"{path}:{number}: the run log starts with {op!r}, not 'create'")
            run = RunRecord(
                path.stem, record["experiment"], record.get("name"), dict(record["tags"]), start_time=record["t"]
            )
        elif op == "params":
            run.params.update(record["params"])
        elif op == "metrics":
            run.metrics += [tuple(m) for m in record["metrics"]]
        elif op == "tags":
            run.tags.update(record["tags"])
        elif op == "artifact":
            run.artifacts.append(record)
        elif op == "status":
            run.status = record["status"]
            run.end_time = record["t"] if run.status != "RUNNING" else None
        else:
            raise DataError(f"{path}:{number}: unknown record {op!r} in the run log")
        run.records += 1
    if run is None:
        raise DataError(f"{path}: an empty run log")
    return run


def read_runs(root: str | Path) -> list[RunRecord]:
    """Every run under `root`: runs without a parent first, each group oldest first (a parent and its first
    child can share a millisecond; the import needs the parent's new id first)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no run log here (no such directory)")
    return sorted(
        (read_run(p) for p in root.glob("*.jsonl")), key=lambda r: (PARENT_TAG in r.tags, r.start_time, r.run_id)
    )


# ------------------------------------------------------------------------------------------------
# Import into MLflow
# ------------------------------------------------------------------------------------------------


def import_runlog(root: str | Path, tracking_uri: str | None = None) -> dict[str, int]:
    """Replay the run log under `root` into MLflow (the project's store unless `tracking_uri`).

    Each imported run carries the tags runlog_id and runlog_records: importing again skips the runs that
    did not change and replaces those that grew since (a run resumed after an earlier import). A run the
    log leaves RUNNING (its process was killed) is imported as KILLED. Returns counts."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.entities import Param as MlflowParam

    from electralab import tracking

    root = Path(root)
    uri = tracking_uri or tracking.tracking_uri()
    client = MlflowClient(uri)
    ids: dict[str, str] = {}  # run-log id -> MLflow run id
    counts = {"imported": 0, "unchanged": 0, "replaced": 0, "artifacts_not_found": 0}
    for run in read_runs(root):
        experiment = tracking.ensure_mlflow_experiment(run.experiment, uri)
        found = client.search_runs([experiment], f"tags.runlog_id = '{run.run_id}'")
        if found and found[0].data.tags.get("runlog_records") == str(run.records):
            ids[run.run_id] = found[0].info.run_id
            counts["unchanged"] += 1
            continue
        for old in found:
            client.delete_run(old.info.run_id)
        tags = {**run.tags, "runlog_id": run.run_id, "runlog_records": str(run.records)}
        for link in LINK_TAGS:
            if tags.get(link):
                tags[link] = ids.get(tags[link], tags[link])
        if run.status == "RUNNING":
            tags["runlog_note"] = "left RUNNING in the run log (its process ended without closing it)"
        created = client.create_run(experiment, start_time=run.start_time, tags=tags, run_name=run.name)
        run_id = created.info.run_id
        params = [MlflowParam(k, v[:6000]) for k, v in run.params.items()]
        for i in range(0, len(params), 100):  # MLflow's limits per batch
            client.log_batch(run_id, params=params[i : i + 100])
        metrics = [MlflowMetric(k, v, t, s) for k, v, t, s in run.metrics]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[i : i + 1000])
        for artifact in run.artifacts:
            counts["artifacts_not_found"] += not _import_artifact(client, run_id, root, artifact)
        status = "KILLED" if run.status == "RUNNING" else run.status
        client.set_terminated(run_id, status, end_time=run.end_time or run.start_time)
        ids[run.run_id] = run_id
        counts["replaced" if found else "imported"] += 1
    return counts


def _import_artifact(client, run_id: str, root: Path, artifact: dict) -> bool:
    """Log one artifact record; False when the file it names is not on this machine."""
    target = Path(artifact["path"])
    directory = target.parent.as_posix() if target.parent.as_posix() != "." else None
    if "text" in artifact:
        client.log_text(run_id, artifact["text"], artifact["path"])
        return True
    source = root / artifact["copy"] if "copy" in artifact else Path(artifact["source"])
    if not source.is_file():
        client.set_tag(run_id, f"artifact_not_found.{artifact['path']}"[:250], str(source))
        return False
    client.log_artifact(run_id, str(source), directory)  # both keep the logged file name
    return True


__all__ = ["COPY_LIMIT", "FileClient", "Metric", "Param", "RunRecord", "import_runlog", "read_run", "read_runs"]
