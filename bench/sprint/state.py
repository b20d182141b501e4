"""The sprint's state: small JSON files under .sprint/state that go to the GPU machine with every command
(carried) and come back as $OUT/sprint-state.tar.gz (a few hundred kB: the run log, trial results, plan).

    sprint.json   the settings (prep)             probe.json   step times per method (the first command)
    source.json   the commit that runs (prep, restore)   plan.json   steps per method (after the control)
    units.json    per run: status, pretraining summary, encoder sha256, fine-tuning seconds
    pieces.json   one line per command: when, how long, what it did, why it stopped
    finetune/<run>/   trial results, tracking parents, summary.json     runlog/   the tracked runs
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from electralab.env import source_commit
from electralab.errors import ConfigError, DataError
from electralab.io import atomic_dir, atomic_file, read_json, write_json
from sprint import extract, state_dir

TARBALL = "sprint-state.tar.gz"
FILES = ("sprint", "source", "probe", "plan", "units", "pieces")


class State:
    def __init__(self, root: Path):
        self.dir = state_dir(root)
        if not (self.dir / "sprint.json").is_file():
            raise ConfigError(
                f"{self.dir / 'sprint.json'}: no sprint here; run `python bench/gpu_sprint.py prep` on "
                f"the CPU machine first and name .sprint/state in the command's carry"
            )
        for name in FILES:
            path = self.dir / f"{name}.json"
            setattr(self, name, read_json(path) if path.is_file() else ([] if name == "pieces" else {}))

    def save(self) -> None:
        for name in FILES:
            write_json(self.dir / f"{name}.json", getattr(self, name))

    def finetune_summary(self, run: str) -> dict | None:
        path = self.dir / "finetune" / run / "summary.json"
        return read_json(path) if path.is_file() else None

    def as_dict(self) -> dict:
        """What the results table reads."""
        runs = ["control", *self.sprint["methods"]]
        return {
            "config": self.sprint,
            "probe": self.probe,
            "plan": self.plan,
            "units": self.units,
            "finetune": {
                r: s
                for r in runs
                if (s := self.finetune_summary(r)) is not None and self.units.get(r, {}).get("status") == "done"
            },
        }


def pack(directory: Path, out: Path) -> Path:
    """directory -> out/sprint-state.tar.gz (atomically: a command killed while packing leaves the last one)."""
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / TARBALL) as tmp:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(directory, arcname="state")
    return out / TARBALL


def restore(source: Path, root: Path) -> Path:
    """A command's returned state (its $OUT folder, or the tarball itself) -> .sprint/state, replaced."""
    tarball = source / TARBALL if source.is_dir() else source
    if not tarball.is_file():
        raise DataError(f"{tarball}: no returned sprint state here (the command writes $OUT/{TARBALL})")
    target = state_dir(root)
    with atomic_dir(target) as tmp:
        extract(tarball, "r:gz", tmp)
        for path in (tmp / "state").iterdir():
            path.rename(tmp / path.name)
        (tmp / "state").rmdir()
    write_source(root)
    return target


def write_source(root: Path) -> None:
    """The commit of this checkout (the GPU machine's copy has no .git): tracked runs carry it as git_sha."""
    write_json(state_dir(root) / "source.json", {"git_sha": source_commit(root, full=True)})
