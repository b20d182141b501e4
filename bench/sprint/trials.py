"""Fine-tuning without Ray: the preset's grid x the sprint's seeds on each task, trials in worker processes.

The protocol is stages/finetune.py's (electralab.finetune): the same data preparation, trial
(run_trial), fingerprints, result store, median per configuration and selection, and the same tracking
(FinetuneTracker: a parent per task, a child per trial; MLflow, or the run log where MLflow is absent).
Only the executor differs: a pool of spawned processes on one machine, as many trials at a time as the
GPU takes (the small preset's 0.25 GPU per trial, a trial being bound by its kernel launches).

Finished trials are kept in the state (results/); a group's parent is finished as soon as its trials
are, and the run's summary.json appears when every group is done. Trials still running at the hard
deadline are stopped and run again by the next command.
"""

from __future__ import annotations

import concurrent.futures as futures
import copy
import multiprocessing
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from electralab.config import FinetuneConfig, to_dict
from electralab.data.vocab import Tokenizer
from electralab.export import load_encoder
from electralab.finetune.data import TaskData, prepare
from electralab.finetune.grid import Group, ResultStore, TrialSpec, configurations, select
from electralab.finetune.tasks import TASKS
from electralab.finetune.track import FinetuneTracker
from electralab.finetune.trial import TrialSettings, run_trial
from electralab.io import fingerprint, read_json, sha256_file, write_json
from electralab.runs import ResolvedRun

# --- the worker side (module level: spawned processes import it) ----------------------------------

_WORKER: dict = {}


def _init_worker(data: dict[str, TaskData], settings: TrialSettings, device: str, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER.update(data=data, settings=settings, device=torch.device(device), encoders={})


def _encoder(directory: str):
    """A fresh copy of the encoder at `directory` (read from disk once per worker and weights file)."""
    key = f"{directory}:{os.stat(Path(directory) / 'weights.pt').st_mtime_ns}"
    cache = _WORKER["encoders"]
    if key not in cache:
        cache.clear()
        cache[key] = load_encoder(directory)
    return copy.deepcopy(cache[key])


def _trial(spec: dict, encoder_dir: str) -> list[dict]:
    spec = TrialSpec.from_dict(spec)
    return run_trial(
        _WORKER["data"][spec.group.task],
        _encoder(encoder_dir),
        spec.hparams,
        spec.seed,
        _WORKER["settings"],
        _WORKER["device"],
    )


# --- the driver side ------------------------------------------------------------------------------


class Finetuner:
    """Fine-tunes one run after another with the same tasks, settings and pool (one per command)."""

    def __init__(
        self,
        cfg: FinetuneConfig,
        data_root: Path,
        vocab_dir: Path,
        device: torch.device,
        workers: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        tokenizer = Tokenizer(vocab_dir)
        self.cfg, self.device, self.workers, self.clock = cfg, device, workers, clock
        self.data = {t: prepare(TASKS[t], tokenizer, cfg, data_root)[1.0] for t in cfg.tasks}
        self.settings = TrialSettings.of(cfg)
        self.pool: futures.ProcessPoolExecutor | None = None
        self.longest_trial_s = 0.0  # submitted to finished, in the sprint's clock (later deadlines judge by it)

    def grid(self, task: str):
        return configurations(self.cfg.search_space(TASKS[task]))

    def trial_steps(self) -> int:
        """Optimizer steps of one run's whole grid (what the fine-tuning time scales with)."""
        return sum(
            -(-len(self.data[t].train) // hp.batch_size) * hp.epochs * len(self.cfg.seeds)
            for t in self.cfg.tasks
            for hp in self.grid(t)
        )

    def run(
        self,
        run: ResolvedRun,
        encoder_dir: Path,
        state: Path,
        soft: float,
        hard: float,
        progress: Callable[[], None] = lambda: None,
        pretrain_run_id: str = "",
    ) -> bool:
        """Every trial of `run` that is not in the store yet, until `soft` (no new trial starts) or `hard`
        (running ones are stopped); `progress()` after each finished trial. Returns whether all groups are
        done (summary.json written). `pretrain_run_id`: the tracked run that made the encoder (a tag of
        the parents, as stages/finetune.py sets it)."""
        summary_path = state / "summary.json"
        summary = read_json(summary_path) if summary_path.is_file() else {}
        weights = sha256_file(encoder_dir / "weights.pt")
        if summary.get("encoder_sha256") != weights:  # another encoder (pretrained again on a fresh
            summary = {"encoder_sha256": weights, "tasks": {}}  # machine): its results do not carry over
        groups = [Group(t) for t in self.cfg.tasks if t not in summary["tasks"]]
        prints = {
            g: fingerprint(g.key, weights, self.data[g.task].fingerprint, asdict(self.settings), self.cfg.max_seq_len)
            for g in groups
        }
        store = ResultStore(state / "results")
        tracker = FinetuneTracker(run, self.cfg.seeds, state / "parents.json", pretrain_run_id)
        finals: dict[TrialSpec, dict] = {}
        specs = {g: [TrialSpec(g, hp, s) for hp in self.grid(g.task) for s in self.cfg.seeds] for g in groups}

        def record(spec: TrialSpec, result: dict) -> None:
            task = TASKS[spec.group.task]
            parent = tracker.parent(spec.group, task, prints[spec.group])
            if result.get("mlflow_parent") != parent:  # not tracked under this parent yet
                result |= {"mlflow_child": tracker.trial(spec, parent, result), "mlflow_parent": parent}
                store.put(spec, result)
            last = result["history"][-1]
            finals[spec] = {m: last[m] for m in task.metrics if m in last}
            if all(s in finals for s in specs[spec.group]):
                self._finish(spec.group, specs[spec.group], finals, tracker, parent, summary)
                write_json(summary_path, summary)

        def complete(spec: TrialSpec, history: list[dict]) -> None:
            result = {"fingerprint": prints[spec.group], "history": history}
            store.put(spec, result)  # first: a finished trial never runs again
            record(spec, result)
            progress()

        try:
            todo = []
            for group, group_specs in specs.items():
                for spec in group_specs:
                    done = store.get(spec, prints[group])
                    if done is None:
                        todo.append(spec)
                    else:
                        record(spec, done)
            # The longest trials first: the last ones to finish are then short.
            todo.sort(key=lambda s: -len(self.data[s.group.task].train) * s.hparams.epochs / s.hparams.batch_size)
            self._execute(todo, encoder_dir, soft, hard, complete)
        except BaseException as error:
            tracker.fail(error)
            raise
        return len(summary["tasks"]) == len(self.cfg.tasks)

    def _finish(
        self, group: Group, specs: list[TrialSpec], finals: dict, tracker: FinetuneTracker, parent: str, summary: dict
    ) -> None:
        task = TASKS[group.task]
        selection = select({s: finals[s] for s in specs}, self.grid(group.task), task.main_metric)
        data = self.data[group.task]
        grid = asdict(self.cfg.search_space(task))
        tracker.finish(
            parent,
            selection,
            {**data.counts, "configurations": len(self.grid(group.task)), "trials": len(specs)},
            {
                "grid": grid,
                "data": data.sources,
                "finetune": {
                    k: v
                    for k, v in to_dict(self.cfg).items()
                    if k in ("max_seq_len", "adam_betas", "weight_decay", "clip_norm")
                },
            },
        )
        summary["tasks"][group.task] = {
            "main_metric": task.main_metric,
            "config": selection.best.name,
            **selection.stats,
            "seeds": {str(k): v for k, v in selection.by_seed.items()},
        }

    def _execute(self, todo: list[TrialSpec], encoder_dir: Path, soft: float, hard: float, complete) -> None:
        if self.workers <= 1:  # in this process, one after another (a CPU, the dry run)
            _init_worker(self.data, self.settings, str(self.device), torch.get_num_threads())
            for spec in todo:
                if self.clock() >= soft:
                    return
                began = self.clock()
                history = _trial(spec.as_dict(), str(encoder_dir))
                self.longest_trial_s = max(self.longest_trial_s, self.clock() - began)
                complete(spec, history)
            return
        pool = self._pool()
        waiting, running, began = list(todo), {}, {}
        while waiting or running:
            while waiting and len(running) < self.workers and self.clock() < soft:
                spec = waiting.pop(0)
                future = pool.submit(_trial, spec.as_dict(), str(encoder_dir))
                running[future], began[future] = spec, self.clock()
            if not running:
                return
            done, _ = futures.wait(running, timeout=max(0.0, hard - self.clock()), return_when=futures.FIRST_COMPLETED)
            if not done:  # the hard deadline: stop the workers, the trials run again next time
                self.close(kill=True)
                return
            for future in done:
                self.longest_trial_s = max(self.longest_trial_s, self.clock() - began.pop(future))
                complete(running.pop(future), future.result())

    def _pool(self) -> futures.ProcessPoolExecutor:
        if self.pool is None:
            threads = 1 if self.device.type == "cuda" else max(1, torch.get_num_threads() // self.workers)
            self.pool = futures.ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.data, self.settings, str(self.device), threads),
            )
        return self.pool

    def close(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        if kill:  # ProcessPoolExecutor cannot stop a running task: end its processes
            for process in list(getattr(self.pool, "_processes", {}).values()):
                process.kill()
        self.pool.shutdown(wait=not kill, cancel_futures=True)
        self.pool = None
