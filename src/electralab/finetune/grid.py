"""The grid protocol: every configuration of a task's search space x the same seeds; the median over
the seeds per configuration; the configuration with the best median of the task's main metric is the
result, reported with its median and the seeds' spread.

    configs = configurations(cfg.grids.glue_small)                 # [HParams, ...] in grid order
    trials = [TrialSpec(Group("rte"), hp, seed) for hp in configs for seed in cfg.seeds]
    selection = select(final_metrics, configs, main_metric="accuracy")
    selection.best, selection.stats["median_accuracy"], selection.medians   # medians: one row per config

Finished trials are kept in a ResultStore (checkpoints/finetune/<run>/results/) so that a re-run of an
interrupted grid skips them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from electralab.config import SearchSpace
from electralab.io import read_json, write_json

FINAL = "final"  # the `checkpoint` of the finished pretraining run (docs/tracking.md)


@dataclass(frozen=True)
class HParams:
    """One configuration of the grid (COCO-LM Tables 7/8: peak LR, max epochs, batch size, warm-up)."""

    lr: float
    epochs: int
    batch_size: int
    warmup: float

    @property
    def name(self) -> str:
        return f"lr={self.lr:g},epochs={self.epochs},bs={self.batch_size},warmup={self.warmup:g}"


def configurations(space: SearchSpace) -> list[HParams]:
    """Every combination, in a fixed order (ties in selection go to the earlier one)."""
    return [
        HParams(lr, epochs, batch, warmup)
        for lr in space.lr
        for epochs in space.epochs
        for batch in space.batch_size
        for warmup in space.warmup
    ]


@dataclass(frozen=True)
class Group:
    """What one MLflow parent run holds: a task fine-tuned from one checkpoint of the pretraining run
    (`final`, or a fraction of pretraining such as `050`) on a fraction of its training labels."""

    task: str
    checkpoint: str = FINAL
    label_fraction: float = 1.0

    @property
    def key(self) -> str:
        key = self.task
        if self.checkpoint != FINAL:
            key += f"@ckpt{self.checkpoint}"
        if self.label_fraction != 1.0:
            key += f"@labels{self.label_fraction:g}"
        return key


@dataclass(frozen=True)
class TrialSpec:
    """One Tune trial: a configuration and a seed of a group."""

    group: Group
    hparams: HParams
    seed: int

    @property
    def key(self) -> str:
        return f"{self.group.key}/{self.hparams.name}/seed={self.seed}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialSpec":
        return cls(Group(**d["group"]), HParams(**d["hparams"]), int(d["seed"]))


def packs(specs: list[TrialSpec], together: int) -> list[list[TrialSpec]]:
    """`specs` in packs of at most `together` that one batched model can train (one group, batch size and epoch
    count), in the order of each pack's first trial in `specs`."""
    by_kind: dict[tuple, list[list[TrialSpec]]] = {}
    out = []
    for spec in specs:
        kind = (spec.group, spec.hparams.batch_size, spec.hparams.epochs)
        open_packs = by_kind.setdefault(kind, [])
        if not open_packs or len(open_packs[-1]) == together:
            open_packs.append([])
            out.append(open_packs[-1])
        open_packs[-1].append(spec)
    return out


# --------------------------------------------------------------------------------------------
# Median per configuration, best configuration
# --------------------------------------------------------------------------------------------


@dataclass
class Selection:
    best: HParams
    stats: dict[str, float]  # median_/std_/min_/max_<metric> over the best configuration's seeds
    by_seed: dict[int, dict[str, float]]  # the best configuration's metrics per seed (the claim tests)
    medians: pd.DataFrame  # one row per configuration: its values, seeds, median of every metric


def _score(value: float) -> float:
    return value if math.isfinite(value) else -math.inf  # an undefined median never wins


def select(finals: dict[TrialSpec, dict[str, float]], configs: list[HParams], main_metric: str) -> Selection:
    """`finals`: each finished trial's metrics at its last evaluation. The best configuration has the
    highest median of `main_metric` (ties: the earlier in `configs`). The spread is the population
    standard deviation (ddof=0), min and max over that configuration's seeds."""
    by_config: dict[HParams, dict[int, dict[str, float]]] = {}
    for spec, metrics in finals.items():
        by_config.setdefault(spec.hparams, {})[spec.seed] = metrics
    names = sorted({m for metrics in finals.values() for m in metrics})
    if main_metric not in names:
        raise ValueError(f"select: no trial reported {main_metric!r} (reported: {', '.join(names) or 'nothing'})")
    rows = []
    for hp in configs:
        if hp in by_config:
            values = {m: [r.get(m, np.nan) for r in by_config[hp].values()] for m in names}
            rows.append(
                {
                    "config": hp.name,
                    **asdict(hp),
                    "seeds": len(by_config[hp]),
                    **{m: float(np.median(v)) for m, v in values.items()},
                }
            )
    best_row = max(range(len(rows)), key=lambda i: (_score(rows[i][main_metric]), -i))
    best = HParams(**{k: rows[best_row][k] for k in ("lr", "epochs", "batch_size", "warmup")})
    stats = {}
    for metric in names:
        values = np.array([r.get(metric, np.nan) for r in by_config[best].values()], dtype=np.float64)
        stats |= {
            f"median_{metric}": float(np.median(values)),
            f"std_{metric}": float(np.std(values)),
            f"min_{metric}": float(np.min(values)),
            f"max_{metric}": float(np.max(values)),
        }
    table = pd.DataFrame(rows)
    return Selection(best, stats, dict(sorted(by_config[best].items())), table)


# --------------------------------------------------------------------------------------------
# Finished trials on disk (resume)
# --------------------------------------------------------------------------------------------


class ResultStore:
    """<directory>/<group>/<config>,seed=<k>.json per finished trial: its history and the fingerprint
    of what it depended on (encoder weights, data, settings). A file whose fingerprint differs from
    the current one (changed params, a new pretraining run) is ignored and overwritten."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def path(self, spec: TrialSpec) -> Path:
        return self.directory / spec.group.key / f"{spec.hparams.name},seed={spec.seed}.json"

    def get(self, spec: TrialSpec, fingerprint: str) -> dict | None:
        path = self.path(spec)
        if not path.is_file():
            return None
        try:
            result = read_json(path)
        except (OSError, ValueError):
            return None
        return result if result.get("fingerprint") == fingerprint else None

    def put(self, spec: TrialSpec, result: dict) -> None:
        write_json(self.path(spec), result)


__all__ = ["FINAL", "Group", "HParams", "ResultStore", "Selection", "TrialSpec", "configurations", "packs", "select"]
