"""MLflow for one pretraining run: params and tags at the start, metrics over steps, the final
main model (and the auxiliary others read) as artifacts, FAILED status when training stops on an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from electralab import tracking
from electralab.runs import ResolvedRun


class Tracker:
    def __init__(self, mlflow, run_id: str):
        self.mlflow = mlflow
        self.run_id = run_id

    @classmethod
    def start(cls, run: ResolvedRun, resume_id: str | None = None, orphan_id: str | None = None) -> "Tracker":
        """A new MLflow run, or the interrupted one again when resuming (one MLflow run per run).
        `orphan_id`: the run of an attempt killed before it left a checkpoint to resume; it is closed as
        KILLED rather than left RUNNING forever."""
        mlflow = tracking.mlflow_module()
        if orphan_id and orphan_id != resume_id:
            tracking.close_orphan(orphan_id, "killed before its first checkpoint; the run restarted from step 0")
        # threads: what this process trains with (electralab.cli.set_threads), for reading tokens/s across machines
        tags = tracking.run_tags(run=run.name, method=run.method, tables=run.spec.tables, preset=run.preset,
                                 seed=run.seed, stage="pretrain", threads=torch.get_num_threads())
        active = tracking.start_run(preset=run.preset, run_name=run.name, tags=tags, run_id=resume_id,
                                    system_metrics=True)
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

    def fail(self, error: BaseException) -> None:
        self.mlflow.flush_async_logging()
        status = "FAILED" if isinstance(error, Exception) else "KILLED"
        self.mlflow.set_tag("error", f"{type(error).__name__}: {error}"[:5000])
        self.mlflow.end_run(status)

    def finish(self, summary: dict[str, Any], out_dir: Path) -> None:
        self.mlflow.flush_async_logging()
        numbers = {f"final_{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
        self.mlflow.log_metrics(tracking.finite_metrics(numbers), run_id=self.run_id)
        self.mlflow.log_artifacts(str(out_dir / "encoder"), artifact_path="encoder")
        if (out_dir / "auxiliary.pt").exists():
            self.mlflow.log_artifact(str(out_dir / "auxiliary.pt"))
        self.mlflow.log_artifact(str(out_dir / "summary.json"))
        self.mlflow.end_run("FINISHED")
