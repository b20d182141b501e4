"""MLflow for fine-tuning (docs/tracking.md): a parent run per (pretraining run, task, checkpoint, label
fraction) with one child run per trial, all written from the driver process (one writer for the
SQLite store; trials never talk to MLflow).

    tracker = FinetuneTracker(run, seeds, scratch / "parents.json")
    parent = tracker.parent(group, task, fingerprint)          # created once, reused when resuming
    tracker.trial(spec, parent, result)                         # a child as each trial finishes
    tracker.finish(group, parent, selection, metrics, params)   # medians, spread, medians.csv -> FINISHED

Parent ids are kept in the scratch directory so that a resumed grid continues the same parents; a
failed stage marks its open parents FAILED (the report reads FINISHED runs only). Where MLflow is not
installed the same records go to the run log (tracking.client(); electralab.runlog).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from electralab import tracking
from electralab.errors import failed_or_killed
from electralab.finetune.grid import Group, Selection, TrialSpec
from electralab.finetune.tasks import Task
from electralab.io import read_json, write_json
from electralab.runs import ResolvedRun
from electralab.tracking import PURPOSE_TAG


class FinetuneTracker:
    def __init__(
        self, run: ResolvedRun, seeds: tuple[int, ...], state_path: Path, pretrain_run_id: str = "", purpose: str = ""
    ):
        self.run = run
        self.client = tracking.client()
        self.experiment = tracking.ensure_experiment(run.preset)
        # git_sha costs a subprocess: the tags are built once and copied per run.
        self.tags = tracking.run_tags(
            run=run.name,
            method=run.method,
            tables=run.tables,
            preset=run.preset,
            seed=",".join(map(str, seeds)),
            stage="finetune",
            pretrain_run_id=pretrain_run_id,
            row=run.row,
            **({PURPOSE_TAG: purpose} if purpose else {}),
        )
        self.state_path = Path(state_path)
        self.parents: dict[str, dict] = read_json(self.state_path) if self.state_path.is_file() else {}
        self.open: set[str] = set()

    def _group_tags(self, group: Group, task: Task) -> dict[str, str]:
        return {
            **self.tags,
            "task": group.task,
            "main_metric": task.main_metric,
            "checkpoint": group.checkpoint,
            "label_fraction": str(group.label_fraction),
        }

    def parent(self, group: Group, task: Task, fingerprint: str) -> str:
        """The group's parent run: the one an interrupted stage started for the same inputs, or a new one."""
        known = self.parents.get(group.key)
        if known and known["fingerprint"] != fingerprint:  # its inputs changed: it will never be finished
            tracking.close_orphan(known["run_id"], "fine-tuning stopped; its inputs changed before it resumed")
        if known and known["fingerprint"] == fingerprint:
            try:
                if self.client.get_run(known["run_id"]).info.status != "RUNNING":
                    self.client.update_run(known["run_id"], status="RUNNING")
                self.open.add(known["run_id"])
                return known["run_id"]
            except Exception:  # deleted from the store meanwhile: start a new one
                pass
        run_id = self.client.create_run(
            self.experiment, run_name=f"{self.run.name}/{group.key}", tags=self._group_tags(group, task)
        ).info.run_id
        self.parents[group.key] = {"run_id": run_id, "fingerprint": fingerprint}
        write_json(self.state_path, self.parents)
        self.open.add(run_id)
        return run_id

    def trial(self, spec: TrialSpec, parent_id: str, result: dict) -> str:
        """A child run: the configuration and seed as params, the dev metrics of every evaluation (step = epoch)."""
        Metric, Param = tracking.metric, tracking.param
        tags = {
            **self.tags,
            "stage": "finetune-trial",
            "seed": str(spec.seed),
            "task": spec.group.task,
            "checkpoint": spec.group.checkpoint,
            "label_fraction": str(spec.group.label_fraction),
            "config": spec.hparams.name,
            "mlflow.parentRunId": parent_id,
        }
        run_id = self.client.create_run(
            self.experiment,
            tags=tags,
            run_name=f"{self.run.name}/{spec.group.key} {spec.hparams.name} seed={spec.seed}",
        ).info.run_id
        now = int(time.time() * 1000)
        metrics = [
            Metric(name, float(value), now, int(h["epoch"]))
            for h in result["history"]
            for name, value in h.items()
            if name != "epoch" and tracking.finite(value)
        ]
        params = [
            Param(k, str(v))
            for k, v in {
                **asdict(spec.hparams),
                "seed": spec.seed,
                "task": spec.group.task,
                "checkpoint": spec.group.checkpoint,
                "label_fraction": spec.group.label_fraction,
            }.items()
        ]
        self.client.log_batch(run_id, metrics=metrics, params=params)
        self.client.set_terminated(run_id, "FINISHED")
        return run_id

    def finish(self, parent_id: str, selection: Selection, metrics: dict[str, float], params: dict[str, Any]) -> None:
        """The selected configuration's median/std/min/max of every metric, counts and hours, the
        selected configuration and settings as params, medians.csv; then FINISHED."""
        Metric, Param = tracking.metric, tracking.param
        now = int(time.time() * 1000)
        by_seed = {f"seed{seed}_{m}": v for seed, values in selection.by_seed.items() for m, v in values.items()}
        values = {**selection.stats, **by_seed, **metrics}
        flat = {
            **{f"selected.{k}": v for k, v in asdict(selection.best).items()},
            "selected.config": selection.best.name,
            **tracking.flat_params(params),
        }
        numbers = tracking.finite_metrics(values)
        self.client.log_batch(
            parent_id,
            metrics=[Metric(k, v, now, 0) for k, v in numbers.items()],
            params=[Param(k, str(v)[:6000]) for k, v in flat.items()],
        )
        self.client.log_text(parent_id, selection.medians.to_csv(index=False), "medians.csv")
        failed = sorted(
            k.removeprefix("median_")
            for k, v in selection.stats.items()
            if k.startswith("median_") and not tracking.finite(v)
        )
        if failed:  # every configuration diverged (NaN): the report shows these cells as failed, not missing
            self.client.set_tag(parent_id, "failed_metrics", ",".join(failed))
        self.client.set_terminated(parent_id, "FINISHED")
        self.open.discard(parent_id)

    def missing(self, group: Group, task: Task, reason: str) -> str:
        """A FINISHED parent without metrics whose `missing` tag says why (the report lists it); its id."""
        tags = {**self._group_tags(group, task), "missing": reason[:5000], "mlflow.note.content": f"missing: {reason}"}
        run_id = self.client.create_run(self.experiment, run_name=f"{self.run.name}/{group.key}", tags=tags).info.run_id
        self.client.set_terminated(run_id, "FINISHED")
        return run_id

    def fail(self, error: BaseException) -> None:
        status = failed_or_killed(error)
        for run_id in sorted(self.open):
            self.client.set_tag(run_id, "error", f"{type(error).__name__}: {error}"[:5000])
            self.client.set_terminated(run_id, status)
        self.open.clear()


__all__ = ["FinetuneTracker"]
