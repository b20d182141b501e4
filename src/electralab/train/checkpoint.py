"""Atomic training checkpoints in a scratch directory outside DVC's outputs.

checkpoints/<run>/state.pt holds everything a resumed run needs (model, optimizer, schedule, loader
position, step, elapsed time, MLflow run id); checkpoints/<run>/fractions/<pct>/ keeps the main
encoder at fixed fractions of training with the wall-clock and device hours it took (the efficiency
curves of COCO-LM Fig. 3 and AMOS Fig. 4). Random state needs no saving: every step reseeds from
(seed, step, rank), so a resumed run draws exactly the numbers an uninterrupted one would.

A checkpoint carries the fingerprint of the run's configuration and data; one that does not match
(changed params, new shards) is ignored, so a stale checkpoint never leaks into a new run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from electralab.io import atomic_file, read_json, write_json

STATE = "state.pt"


def fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Checkpointer:
    def __init__(self, directory: Path, fingerprint: str):
        self.directory = Path(directory)
        self.fingerprint = fingerprint

    @property
    def state_path(self) -> Path:
        return self.directory / STATE

    def load(self) -> dict | None:
        """The saved state if it belongs to this run's configuration, else None."""
        if not self.state_path.exists():
            return None
        state = torch.load(self.state_path, map_location="cpu", weights_only=False)
        if state.get("fingerprint") != self.fingerprint:
            return None
        return state

    def save(self, state: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with atomic_file(self.state_path) as tmp:
            torch.save({**state, "fingerprint": self.fingerprint}, tmp)

    def fraction_dir(self, fraction: float) -> Path:
        return self.directory / "fractions" / f"{round(fraction * 100):03d}"

    def fractions(self) -> list[Path]:
        root = self.directory / "fractions"
        return sorted(p for p in root.iterdir() if (p / "meta.json").exists()) if root.exists() else []

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def write_meta(directory: Path, meta: dict) -> None:
    write_json(directory / "meta.json", meta)


def read_meta(directory: Path) -> dict:
    return read_json(directory / "meta.json")
