"""Tracking for one pretraining run: params and tags at the start, metrics over steps, the final
main model (and the auxiliary others read) as artifacts, FAILED status when training stops on an error,
KILLED with `paused_at_step` when it stops at a deadline (the next call resumes the same run).

Two implementations with the same methods, chosen where the run starts (`Tracker.start`): MLflow, or
the run log (electralab.runlog) where MLflow is not installed or $ELECTRALAB_TRACKING=file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from electralab import tracking
from electralab.errors import failed_or_killed
from electralab.runs import ResolvedRun


def _tags(run: ResolvedRun) -> dict[str, str]:
    # threads: what this process trains with (electralab.cli.set_threads), for reading tokens/s across machines
    return tracking.run_tags(
        run=run.name,
        method=run.method,
        tables=run.tables,
        preset=run.preset,
        seed=run.seed,
        stage="pretrain",
        threads=torch.get_num_threads(),
        row=run.row,
    )


class Tracker:
    def __init__(self, mlflow, run_id: str):
        self.mlflow = mlflow
        self.run_id = run_id

    @classmethod
    def start(
        cls, run: ResolvedRun, resume_id: str | None = None, orphan_id: str | None = None
    ) -> "Tracker | FileTracker":
        """A new run, or the interrupted one again when resuming (one tracked run per run).
        `orphan_id`: the run of an attempt killed before it left a checkpoint to resume; it is closed as
        KILLED rather than left RUNNING forever."""
        if orphan_id and orphan_id != resume_id:
            tracking.close_orphan(orphan_id, "killed before its first checkpoint; the run restarted from step 0")
        if tracking.backend() == "file":
            return FileTracker.start(run, resume_id)
        mlflow = tracking.mlflow_module()
        active = tracking.start_run(
            preset=run.preset, run_name=run.name, tags=_tags(run), run_id=resume_id, system_metrics=True
        )
        if resume_id is None:
            mlflow.log_params(tracking.flat_params(run.as_params()))
            if run.spec.description:
                mlflow.set_tag("mlflow.note.content", run.spec.description)
        return cls(mlflow, active.info.run_id)

    def tag(self, **tags: Any) -> None:
        self.mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Queued to MLflow's background writer: the training step does not wait on the store."""
        self.mlflow.log_metrics(tracking.finite_metrics(metrics), step=step, run_id=self.run_id, synchronous=False)

    def flush(self) -> None:
        """Every metric queued so far written to the store: called before a checkpoint, so that a kill after it
        loses none of the steps it covers (the writer batches once a second, MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS)."""
        self.mlflow.flush_async_logging()

    def fail(self, error: BaseException) -> None:
        self.flush()
        status = failed_or_killed(error)
        self.mlflow.set_tag("error", f"{type(error).__name__}: {error}"[:5000])
        self.mlflow.end_run(status)

    def pause(self, step: int) -> None:
        self.flush()
        self.mlflow.set_tag("paused_at_step", str(step))
        self.mlflow.end_run("KILLED")  # ended: another run may start in this process; resuming reopens it

    def finish(self, summary: dict[str, Any], out_dir: Path) -> None:
        self.flush()
        numbers = {f"final_{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
        self.mlflow.log_metrics(tracking.finite_metrics(numbers), run_id=self.run_id)
        self.mlflow.log_artifacts(str(out_dir / "encoder"), artifact_path="encoder")
        if (out_dir / "auxiliary.pt").exists():
            self.mlflow.log_artifact(str(out_dir / "auxiliary.pt"))
        self.mlflow.log_artifact(str(out_dir / "summary.json"))
        self.mlflow.end_run("FINISHED")


class FileTracker:
    """The same records in the run log (no system metrics: MLflow's sampler is not there)."""

    def __init__(self, client, run_id: str):
        self.client = client
        self.run_id = run_id

    @classmethod
    def start(cls, run: ResolvedRun, resume_id: str | None = None) -> "FileTracker":
        client = tracking.client()
        if resume_id is not None and client.has_run(resume_id):
            client.update_run(resume_id, "RUNNING")
            return cls(client, resume_id)
        run_id = client.create_run(tracking.experiment_name(run.preset), run_name=run.name, tags=_tags(run)).info.run_id
        client.log_params(run_id, tracking.flat_params(run.as_params()))
        if run.spec.description:
            client.set_tag(run_id, "mlflow.note.content", run.spec.description)
        return cls(client, run_id)

    def tag(self, **tags: Any) -> None:
        self.client.set_tags(self.run_id, tags)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.client.log_metrics(self.run_id, tracking.finite_metrics(metrics), step)

    def flush(self) -> None:
        """Nothing to do: the run log writes each record as it comes."""

    def fail(self, error: BaseException) -> None:
        self.client.set_tag(self.run_id, "error", f"{type(error).__name__}: {error}"[:5000])
        self.client.set_terminated(self.run_id, failed_or_killed(error))

    def pause(self, step: int) -> None:
        self.client.set_tag(self.run_id, "paused_at_step", step)
        self.client.set_terminated(self.run_id, "KILLED")

    def finish(self, summary: dict[str, Any], out_dir: Path) -> None:
        numbers = {f"final_{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
        self.client.log_metrics(self.run_id, tracking.finite_metrics(numbers), 0)
        self.client.log_artifacts(self.run_id, out_dir / "encoder", "encoder")  # weights: named, not copied
        if (out_dir / "auxiliary.pt").exists():
            self.client.log_artifact(self.run_id, out_dir / "auxiliary.pt")
        self.client.log_artifact(self.run_id, out_dir / "summary.json")
        self.client.set_terminated(self.run_id, "FINISHED")
