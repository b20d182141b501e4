"""Atomic, checksummed training checkpoints in a scratch directory outside DVC's outputs.

checkpoints/<run>/state.pt holds everything a resumed run needs (model, optimizer, schedule, loader
position, step, elapsed time, MLflow run id); state.prev.pt is the one before it, and checksums.json the
sha256 of both. checkpoints/<run>/fractions/<pct>/ keeps the main encoder at fixed fractions of training
with the wall-clock and device hours it took (the efficiency curves of COCO-LM Fig. 3 and AMOS Fig. 4).
Random state needs no saving: every step reseeds from (seed, step, rank), so a resumed run draws exactly
the numbers an uninterrupted one would.

A checkpoint is written to a temporary file, synced to the disk, its checksum recorded, and only then
renamed over the previous one (which becomes state.prev.pt). One that does not match its checksum or
does not load (a write cut short by a crash of the machine, a damaged disk) is set aside beside the
scratch directory as <run>.<name>.corrupt-<time> (only the newest one kept), named on stderr, and the run
resumes from the other.

A checkpoint carries the run's configuration and data hash and their fingerprint; one that does not match
(changed params, new shards) is ignored, so a stale checkpoint never leaks into a new run. One exception: a
key the code gained since the checkpoint was written, at its default (which, by this project's rule, keeps
what the code did before), does not stop it resuming: upgrading electralab mid-run loses nothing.

mlflow.json names the MLflow run this scratch belongs to from the run's first step on, so that a run
killed before its first checkpoint is closed (KILLED) by the next attempt instead of staying RUNNING.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from electralab.io import fingerprint, fsync, read_json, sha256_file, write_json, written

STATE, PREVIOUS, CHECKSUMS, MLFLOW = "state.pt", "state.prev.pt", "checksums.json", "mlflow.json"


def added_at_defaults(saved: Any, current: Any, defaults: Any) -> list[str] | None:
    """The keys `current` has beyond `saved`, each at its value in `defaults` (nested alike), or None when they
    differ otherwise: a changed or removed value, or an added key away from its default."""
    if not (isinstance(saved, dict) and isinstance(current, dict)):
        if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
            if not (isinstance(defaults, list) and len(defaults) == len(saved)):
                defaults = [None] * len(saved)  # a list's items are compared, never added to
            found = [added_at_defaults(a, b, d) for a, b, d in zip(saved, current, defaults)]
            return None if None in found else [k for keys in found for k in keys]
        return [] if saved == current else None
    defaults = defaults if isinstance(defaults, dict) else {}
    if set(saved) - set(current):
        return None
    added = []
    for key, value in current.items():
        if key not in saved:
            if key not in defaults or value != defaults[key]:
                return None
            added.append(key)
            continue
        inner = added_at_defaults(saved[key], value, defaults.get(key))
        if inner is None:
            return None
        added += [f"{key}.{k}" for k in inner]
    return added


class Checkpointer:
    def __init__(self, directory: Path, config: tuple, defaults: tuple | None = None):
        """`config`: what the run's training depends on (JSON-able parts, fingerprinted); `defaults`: the same
        parts at the code's defaults, where a key added since a checkpoint may stand at them."""
        self.directory = Path(directory)
        self.fingerprint = fingerprint(*config)
        self.config = json.loads(json.dumps(list(config), sort_keys=True, default=str))
        self.defaults = json.loads(json.dumps(list(defaults or [None] * len(config)), default=str))

    @property
    def state_path(self) -> Path:
        return self.directory / STATE

    def _trusted(self) -> set[str] | None:
        """The recorded checksums, or None for a scratch written before they existed (then a state that
        loads is trusted, as it was then)."""
        try:
            return set(read_json(self.directory / CHECKSUMS)["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def load(self) -> dict | None:
        """The newest intact saved state if it belongs to this run's configuration, else None."""
        trusted = self._trusted()
        for path in (self.directory / STATE, self.directory / PREVIOUS):
            try:
                if trusted is not None and sha256_file(path) not in trusted:
                    self._set_aside(path, "its sha256 is not the one recorded when it was written")
                    continue
                state = torch.load(path, map_location="cpu", weights_only=False)
            except FileNotFoundError:
                continue
            except Exception as e:  # unreadable: truncated, not a torch file
                self._set_aside(path, f"it does not load ({type(e).__name__}: {str(e)[:200]})")
                continue
            return state if self._matches(state, path) else None
        return None

    def _matches(self, state: dict, path: Path) -> bool:
        if state.get("fingerprint") == self.fingerprint:
            return True
        added = added_at_defaults(state["config"], self.config, self.defaults) if "config" in state else None
        if added is None:
            return False
        print(f"resuming {path}: written before {', '.join(added)} existed, now at the default", file=sys.stderr)
        return True

    def _set_aside(self, path: Path, why: str) -> None:
        """Move a corrupt checkpoint beside the scratch directory for a look, keeping only the newest one a run
        set aside (each is a whole checkpoint: they would pile up over many restarts)."""
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.time_ns() % 10**9:09d}"
        aside = self.directory.parent / f"{self.directory.name}.{path.name}.corrupt-{stamp}"
        try:
            os.replace(path, aside)
        except FileNotFoundError:  # another rank of the same run set it aside first
            return
        older = [p for p in self.directory.parent.glob(f"{self.directory.name}.*.corrupt-*") if p != aside]
        for p in older:
            p.unlink(missing_ok=True)
        replacing = f" (replacing {', '.join(p.name for p in older)})" if older else ""
        print(
            f"warning: checkpoint {path} is corrupt: {why}; set aside as {aside}{replacing}, resuming from the one "
            f"before it if there is one",
            file=sys.stderr,
        )

    def save(self, state: dict) -> None:
        """Write, sync and checksum the new state, then rotate: state.pt -> state.prev.pt, new -> state.pt.
        A kill at any point leaves at least one intact, trusted checkpoint (the newest that was complete)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(f".tmp-{STATE}-*"):
            stale.unlink(missing_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".tmp-{STATE}-", dir=self.directory)
        os.close(fd)
        with written(Path(name)), open(name, "wb") as f:
            torch.save({**state, "fingerprint": self.fingerprint, "config": self.config}, f)
            f.flush()
            os.fsync(f.fileno())
        new, latest = sha256_file(name), self.directory / STATE
        old = sha256_file(latest) if latest.exists() else None
        kept = [d for d in (old, *sorted(self._trusted() or ())) if d]
        self._record([new, *kept])  # trusted before it has a name a resume would read
        if latest.exists():
            os.replace(latest, self.directory / PREVIOUS)
        os.replace(name, latest)
        fsync(self.directory)
        self._record([new, old] if old else [new])

    def _record(self, digests: list[str]) -> None:
        write_json(self.directory / CHECKSUMS, {"sha256": list(dict.fromkeys(digests))})
        fsync(self.directory / CHECKSUMS)

    def fraction_dir(self, fraction: float) -> Path:
        return self.directory / "fractions" / fraction_name(fraction)

    def fractions(self) -> list[Path]:
        root = self.directory / "fractions"
        return sorted(p for p in root.iterdir() if (p / "meta.json").exists()) if root.exists() else []

    def missing_fractions(self, fractions: tuple[float, ...]) -> list[str]:
        present = {p.name for p in self.fractions()}
        return [fraction_name(f) for f in fractions if fraction_name(f) not in present]

    def recorded_mlflow_run(self) -> str | None:
        """The MLflow run of the attempt that last trained here (read before `clear`)."""
        try:
            return read_json(self.directory / MLFLOW)["run_id"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record_mlflow_run(self, run_id: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_json(self.directory / MLFLOW, {"run_id": run_id})

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def fraction_name(fraction: float) -> str:
    return f"{round(fraction * 100):03d}"


def write_meta(directory: Path, meta: dict) -> None:
    write_json(directory / "meta.json", meta)
