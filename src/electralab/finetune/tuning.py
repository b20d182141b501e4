"""Trials on Ray Tune: one Tune trial per (configuration, seed) of a group (or per pack of them), run in parallel with
per-trial resources (CPUs locally, a GPU or a fraction of one on a cluster), retried on failure.

    with ray_session(cfg.resources):
        errors = run_trials(specs, data, encoders, settings, cfg.resources, cfg.max_failures, storage, name,
                            on_complete)
    # data: (task, label fraction) -> TaskData; encoders: checkpoint -> encoder directory; settings: the
    # TrialSettings; name: the Tune experiment's, under storage; errors: (trial key, error) of failed trials

* One `Tuner.fit()` runs a whole list of trials: a grid search over the explicit trial specs, so
  tasks with different grids share one experiment and the CPUs stay busy until the last trial.
* The trainable is a function (Ray 2.60's Tune API; no Ray Train inside: a trial is one process).
  Task data and encoder paths go to the object store once (`tune.with_parameters`); each trial
  fetches only its own task's data. Actors are reused between trials (`reuse_actors`), so a worker
  imports torch and loads an encoder once, not once per trial.
* Trials together (`resources.trials_together` = K > 1): a Tune trial is a pack of up to K grid trials that
  share a group, a batch size and an epoch count (the seeds of one configuration, then the next configuration's),
  trained as one batched model (finetune/batched.py) on the trial's resources: a GPU's worth of small trials in
  one process. K = 1 is one grid trial a Tune trial (finetune/trial.py), the default. Either way the driver gets
  one history per grid trial.
* Retries: `FailureConfig(max_failures)` restarts a failed trial (a whole pack) from scratch (it is seconds to
  minutes long; no mid-trial checkpoints). Resume across stage runs is the caller's ResultStore:
  finished trials are never handed to Tune again.
* Local Ray: `num_cpus` = the CPUs this process may use (or resources.local_cpus), no dashboard, workers
  import this same checkout (PYTHONPATH made absolute). With RAY_ADDRESS set it joins that cluster
  instead. A trial asking for more CPUs or GPUs than the cluster has is refused up front (Tune would
  wait for them forever).
"""

from __future__ import annotations

import copy
import ctypes
import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import ray
import torch
from ray import tune

from electralab.config import TrialResources
from electralab.errors import ConfigError
from electralab.export import load_encoder
from electralab.finetune.grid import TrialSpec, packs
from electralab.finetune.trial import run_trial

# Tune writes a CSV/JSON/TensorBoard result log per trial and changes into a trial directory by
# default; we need neither (results go to the ResultStore and MLflow, paths are absolute).
# RAY_AIR_NEW_OUTPUT=0: the classic reporter, which verbose=0 silences (the stage has its own progress bar).
# TUNE_DISABLE_SIGINT_HANDLER=1: Ctrl-C stops the stage as SIGTERM does (electralab.cli), instead of Tune ending the
# grid early and the stage reporting its unfinished trials as a failure.
TUNE_ENV = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_CHDIR_TO_TRIAL_DIR": "0",
    "RAY_AIR_NEW_OUTPUT": "0",
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
}


def local_cpus(resources: TrialResources) -> int:
    return resources.local_cpus or len(os.sched_getaffinity(0))


def init_ray(resources: TrialResources) -> bool:
    """Start Ray unless it runs already; returns whether this call started it. RAY_ADDRESS joins that
    cluster (whose workers have the project installed, docs/finetuning.md); otherwise a local Ray with
    `local_cpus` CPUs, no dashboard, and workers that import this checkout (PYTHONPATH made absolute:
    trials run in other processes, where a relative `src` or another installed copy would win)."""
    os.environ.update(TUNE_ENV)
    # Without the result loggers Tune's ResultGrid warns that it finds no result.json for any trial.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    # A trial's threads follow its CPUs (the trainable sets torch's too), not the stage's OMP_NUM_THREADS.
    env = {**TUNE_ENV, "OMP_NUM_THREADS": str(max(1, int(resources.cpus)))}
    if not address:
        src = str(Path(__file__).resolve().parents[2])  # the directory holding this `electralab` package
        paths = [src, *(str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    ray.init(
        address=address or None,
        num_cpus=None if address else local_cpus(resources),
        include_dashboard=False,
        runtime_env={"env_vars": env},
        logging_level=logging.WARNING,
    )
    return True


@contextmanager
def ray_session(resources: TrialResources) -> Iterator[None]:
    """Ray for the duration of a stage: one that runs already is used as is (tests start one per
    session); one started here is shut down at the end."""
    started = init_ray(resources)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def check_resources(resources: TrialResources) -> None:
    """Refuse requests the cluster can never satisfy (Tune would wait for them forever)."""
    available = ray.cluster_resources()
    for name, key, asked in (("cpus", "CPU", resources.cpus), ("gpus", "GPU", resources.gpus)):
        if asked > available.get(key, 0):
            raise ConfigError(
                f"finetune.resources.{name}={asked:g} per trial, but the Ray cluster has "
                f"{available.get(key, 0):g} {key}s; lower it (e.g. "
                f"-S presets.<preset>.finetune.resources.{name}=...)"
            )


def pack_specs(config: dict) -> list[TrialSpec]:
    return [TrialSpec.from_dict(d) for d in config["trials"]]


class Collector(tune.Callback):
    """Driver side: hands every completed grid trial's history to `on_complete(spec, history)` as its pack
    finishes."""

    def __init__(self, on_complete: Callable[[TrialSpec, list[dict]], None]):
        self.on_complete = on_complete

    def __getstate__(self) -> dict:
        # Tune pickles its callbacks into the experiment directory for Tuner.restore, which we do not
        # use (resume is the ResultStore); the driver-side closure (MLflow client, files) stays out.
        return {}

    def __setstate__(self, state: dict) -> None:
        self.on_complete = lambda spec, history: None

    def on_trial_complete(self, iteration, trials, trial, **info):
        for spec, history in zip(pack_specs(trial.config), json.loads(trial.last_result["histories"])):
            self.on_complete(spec, history)


def trainable(config: dict, *, refs: dict, encoders: dict[str, str], settings, gpus: float, threads: int) -> None:
    """A Tune trial (runs in a Ray worker): fine-tune its pack of grid trials, report their histories (one trial
    alone: after every evaluation; a pack trained together: at its end)."""
    torch.set_num_threads(threads)
    specs = pack_specs(config)
    group = specs[0].group
    data = ray.get(refs[(group.task, group.label_fraction)])
    device = torch.device("cuda") if gpus > 0 and torch.cuda.is_available() else torch.device("cpu")
    encoder = cached_encoder(encoders[group.checkpoint])

    def report(history: list[dict]) -> None:
        tune.report({**history[-1], "histories": json.dumps([history])})

    try:
        if len(specs) == 1:
            run_trial(data, encoder, specs[0].hparams, specs[0].seed, settings, device, report)
        else:
            from electralab.finetune.batched import run_trials as train_together

            histories = train_together(
                data, encoder, [s.hparams for s in specs], [s.seed for s in specs], settings, device
            )
            tune.report({"histories": json.dumps(histories)})
    finally:
        release_freed_memory()


def release_freed_memory() -> None:
    """Hand the heap memory a finished trial freed back to the OS. Tune runs every trial in a new thread of a
    reused worker, and glibc keeps what a thread freed in that thread's arena for later: on 25 Nov 2026 the two
    workers of finetune@teams held 9.8 and 11.2 GB after about 25 full-size trials each, and Ray's memory
    monitor killed one (the stage failed). A probe of 21 trials, each in a new thread: 2.2 GB and growing
    without this, about 0.8 GB after each trial with it (docs/finetuning.md, "Memory"). glibc only; a no-op
    elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_ENCODERS: dict[str, Any] = {}


def cached_encoder(directory: str):
    """A fresh copy of the encoder at `directory` (loaded from disk once per worker process)."""
    key = f"{directory}:{os.stat(Path(directory) / 'weights.pt').st_mtime_ns}"
    if key not in _ENCODERS:
        _ENCODERS.clear()  # keep one: a worker moves from one checkpoint to the next
        _ENCODERS[key] = load_encoder(directory)
    return copy.deepcopy(_ENCODERS[key])


def run_trials(
    specs: list[TrialSpec],
    data: dict,
    encoders: dict[str, Path],
    settings,
    resources: TrialResources,
    max_failures: int,
    storage: Path,
    name: str,
    on_complete: Callable[[TrialSpec, list[dict]], None],
    trainable_fn: Callable | None = None,
) -> list[tuple[str, str]]:
    """Run `specs` on Tune; `on_complete(spec, history)` in the driver as each one finishes (a pack's together).
    Returns (trial key, error) for the trials that failed after their retries."""
    if not specs:
        return []
    check_resources(resources)
    refs = {key: ray.put(value) for key, value in data.items()}
    fn = tune.with_parameters(
        trainable_fn or trainable,
        refs=refs,
        settings=settings,
        gpus=resources.gpus,
        encoders={k: str(v) for k, v in encoders.items()},
        threads=max(1, int(resources.cpus)),
    )
    asked = {"cpu": resources.cpus, "gpu": resources.gpus}
    grid = [[s.as_dict() for s in pack] for pack in packs(specs, resources.trials_together)]
    tuner = tune.Tuner(
        tune.with_resources(fn, {k: v for k, v in asked.items() if v}),
        param_space={"trials": tune.grid_search(grid)},
        tune_config=tune.TuneConfig(
            reuse_actors=True,
            max_concurrent_trials=resources.max_concurrent,
            trial_name_creator=lambda t: pack_name(pack_specs(t.config)),
            trial_dirname_creator=lambda t: f"trial-{t.trial_id}",
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(Path(storage).resolve()),
            failure_config=tune.FailureConfig(max_failures=max_failures),
            callbacks=[Collector(on_complete)],
            verbose=0,
        ),
    )
    errors = []
    for result in tuner.fit():
        if result.error is not None:  # the trial's own exception, not Ray's wrapper with its traceback
            cause = getattr(result.error, "cause", None) or result.error
            first_line = (str(cause).strip().splitlines() or [""])[0]
            why = f"{type(cause).__name__}: {first_line} (traceback: {result.path}/error.txt)"
            errors += [(spec.key, why) for spec in pack_specs(result.config)]
    return errors


def pack_name(specs: list[TrialSpec]) -> str:
    return specs[0].key + (f" and {len(specs) - 1} more" if len(specs) > 1 else "")


__all__ = [
    "TUNE_ENV",
    "Collector",
    "cached_encoder",
    "check_resources",
    "init_ray",
    "local_cpus",
    "release_freed_memory",
    "ray_session",
    "run_trials",
    "trainable",
]
