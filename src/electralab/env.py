"""Where things are: the project root, the offline data mirror, the MLflow tracking store's directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from electralab.errors import ConfigError

DATA_ENV = "ELECTRALAB_DATA"
ALLOW_MISSING_ENV = "ELECTRALAB_ALLOW_MISSING"  # 1: a fine-tuning task without its data is recorded, not fatal


def repo_root() -> Path:
    """The project root (stage locks, the MLflow store's default place; a stage's own paths come from its
    command line, relative to the working directory): when DVC runs the stage (DVC_STAGE is set), the nearest
    parent of the working directory holding dvc.yaml, which is the experiment's own copy under `dvc exp run
    --temp` or `--queue` (DVC then points DVC_ROOT at the parent repository: trusting it wrote the
    experiment's outputs over the workspace's); else DVC_ROOT when set; else the nearest such parent."""
    if os.environ.get("DVC_ROOT") and not os.environ.get("DVC_STAGE"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "dvc.yaml").exists() or (d / ".git").exists():
            return d
    return here


def store_root() -> Path:
    """Where the default MLflow store lives: DVC_ROOT when set, the parent repository also for a temporary or
    queued experiment, whose own copy is deleted when it ends (its runs belong with the project's)."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    return repo_root()


def data_root() -> Path | None:
    """The local mirror named by $ELECTRALAB_DATA (absolute), or None to read from the hub.

    A relative value is taken relative to the project the command ran in: DVC_ROOT when DVC runs a stage
    (the parent repository also under `dvc exp run --temp` or `--queue`, whose stages run in a copy elsewhere),
    else the current directory (the project root for `make`), so `ELECTRALAB_DATA=../shared/data` works from a
    checkout beside ../shared.
    """
    value = os.environ.get(DATA_ENV)
    if not value:
        return None
    base = Path(os.environ["DVC_ROOT"]) if os.environ.get("DVC_ROOT") else Path.cwd()
    path = (base / Path(value).expanduser()).resolve()  # an absolute value ignores the base
    if not path.is_dir():
        raise ConfigError(
            f"{DATA_ENV}={value!r}: no such directory ({path}); unset it to read "
            f"from the Hugging Face hub, or point it at a mirror laid out as "
            f"docs/data.md describes"
        )
    return path


def git_output(*args: str, root: Path | None = None) -> str:
    """What `git <args>` prints in `root` (else repo_root()), stripped; "" where git, the repository or the command
    fails (a copy of the tree on another machine)."""
    try:
        done = subprocess.run(["git", *args], cwd=root or repo_root(), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def source_commit(root: Path | None = None, *, full: bool = False) -> str:
    """The checkout's commit (short, or all 40 digits), "+changes" when its tracked files differ from it; "unknown"
    where git or the repository is missing: a result's provenance."""
    sha = git_output("rev-parse", *([] if full else ["--short"]), "HEAD", root=root) or "unknown"
    return sha + ("+changes" if git_output("status", "--porcelain", "--untracked-files=no", root=root) else "")
