"""The sprint's settings (written by `prep`, read by every `run`) and the runs it trains.

The runs are params.yaml's own (`runs.mlm`, `runs.electra`, ..., `runs.control`) under the chosen preset,
with only the schedule changed: the steps the plan gives each method, the preset's warm-up fraction of
them, checkpoints and logging scaled to the shorter run. Fine-tuning keeps the preset's grid and settings
with fewer seeds (the first `seeds` of the preset's list) on the GLUE tasks the mirror has complete.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from electralab.config import Params, bounded, build, parse_params, to_dict
from electralab.errors import ConfigError
from electralab.finetune.tasks import TASKS
from electralab.runs import ResolvedRun, check_run, resolve_run

CONTROL = "control"  # the no-pretraining control (params.yaml runs.control, method none)
# The GLUE tasks whose train and dev splits the offline mirror holds in full (../shared/data/SOURCES.md).
COMPLETE_TASKS = ("sst2", "cola", "mrpc", "stsb", "rte")


@dataclass(frozen=True)
class SprintConfig:
    preset: str = "small"
    # runs of params.yaml, in the order they train: ELECTRA first, so that the first command alone sets it beside
    # the control; amos, teams if time allows
    methods: tuple[str, ...] = ("electra", "mlm", "cocolm")
    tasks: tuple[str, ...] = ("stsb", "mrpc")  # where the signal is; any of COMPLETE_TASKS
    seeds: int = bounded(2, lo=1)  # the first N of presets.<preset>.finetune.seeds
    pieces: int = bounded(2, lo=1)  # commands the plan spreads the work over, one after the other on one machine
    piece_seconds: float = bounded(330.0, lo=1.0)  # one command's own budget (the machine's limit is 600 s)
    grace_seconds: float = bounded(30.0, lo=0.0)  # trials still running then are stopped (in worker mode)
    device_minutes: float = bounded(15.0, lo=1.0)  # a session's device time (the device tool's budget)
    probe_seconds: float = bounded(3.0, lo=0.01)  # timed steps per method
    workers: int | None = bounded(None, lo=1)  # fine-tuning processes; None: 8 on a GPU, 1 on a CPU
    pretrain_seconds: float | None = bounded(None, lo=0.01)  # None: the plan's; set: every method this long

    def check(self, where: str) -> None:
        unknown = [t for t in self.tasks if t not in TASKS or TASKS[t].kind == "span"]
        if unknown:
            raise ConfigError(f"{where}.tasks: {unknown[0]!r} is not a GLUE task (choose from {list(COMPLETE_TASKS)})")
        if CONTROL in self.methods:
            raise ConfigError(
                f"{where}.methods: {CONTROL!r} always runs (the no-pretraining control); name the pretraining runs only"
            )
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"{where}.methods={list(self.methods)}: name each run once, at least one")
        from sprint.plan import device_seconds

        planned = device_seconds(self.pieces, self.piece_seconds, self.grace_seconds) / 60
        if planned > self.device_minutes:
            raise ConfigError(
                f"{where}: pieces={self.pieces} of piece_seconds={self.piece_seconds:g} + grace_seconds="
                f"{self.grace_seconds:g} plan {planned:.1f} device-minutes, more than device_minutes="
                f"{self.device_minutes:g} (bench/sprint/plan.py device_seconds: one start, then each command)"
            )


def load_config(values: dict) -> SprintConfig:
    return build(SprintConfig, values, "sprint")


def check_runs(params: Params, cfg: SprintConfig) -> None:
    """Every method is a pretraining run of the registry reading the shards, and the preset fine-tunes."""
    preset = params.presets.get(cfg.preset)
    if preset is None:
        raise ConfigError(f"sprint.preset={cfg.preset!r}: params.yaml has no presets.{cfg.preset}")
    if preset.finetune is None:
        raise ConfigError(f"presets.{cfg.preset}.finetune is not set: the sprint fine-tunes with its grid")
    if cfg.seeds > len(preset.finetune.seeds):
        raise ConfigError(
            f"sprint.seeds={cfg.seeds}: presets.{cfg.preset}.finetune.seeds has only {len(preset.finetune.seeds)}"
        )
    for name in (*cfg.methods, CONTROL):
        check_run(name, params.runs, "sprint.methods")
        if params.runs[name].get("reads", "data/shards") != "data/shards":
            raise ConfigError(
                f"sprint.methods: {name!r} reads {params.runs[name]['reads']}; the sprint trains runs "
                f"that read the shards only"
            )


def sprint_params(params: Params, cfg: SprintConfig, pretrain: dict | None = None) -> Params:
    """params.yaml with `cfg.preset` active, its fine-tuning cut to the sprint's tasks and seeds, and
    `pretrain` (schedule keys) over its pretraining settings."""
    raw = copy.deepcopy(params.raw)
    raw["preset"] = cfg.preset
    preset = raw["presets"][cfg.preset]
    finetune = preset["finetune"]
    finetune["seeds"] = list(params.presets[cfg.preset].finetune.seeds)[: cfg.seeds]
    finetune["tasks"] = list(cfg.tasks)
    preset["pretrain"] = {**preset["pretrain"], **(pretrain or {})}
    return parse_params(raw, f"params.yaml with the sprint's schedule (presets.{cfg.preset})")


def schedule(params: Params, cfg: SprintConfig, steps: int) -> dict:
    """The pretraining keys a `steps`-step sprint run changes: the preset's warm-up as a fraction of its
    steps, a checkpoint and a held-out check every quarter, about 20 log lines."""
    base = params.presets[cfg.preset].pretrain
    guard = to_dict(base.guard)
    return {
        "steps": steps,
        "warmup_steps": round(steps * base.warmup_steps / base.steps),
        "checkpoint_every": max(1, steps // 4),
        "log_every": max(1, min(base.log_every, steps // 20)),
        "guard": {**guard, "every": max(1, min(guard["every"], steps // 4))},
    }


def sprint_run(params: Params, cfg: SprintConfig, name: str, steps: int | None = None) -> ResolvedRun:
    """Run `name` under the sprint's preset; with `steps`, on the sprint's schedule of that length."""
    return resolve_run(sprint_params(params, cfg, schedule(params, cfg, steps) if steps else None), name)
