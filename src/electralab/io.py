"""Atomic outputs: write beside the final path, rename at the end.

A stage that fails (bad input, a crash, SIGKILL) leaves no output that looks complete: either the
previous output stays untouched or there is none; half-written data only ever lives under a
`.tmp-*` name that the next run removes. Also the hashes that tell a kept result from a stale one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from electralab.errors import chain


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _clear_stale(final: Path) -> None:
    """Remove temporaries that an earlier, killed run left beside `final`."""
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        _remove(stale)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
FULL_BELOW = 1 << 20  # bytes left on a file system under which a failed write is taken for a full disk


@contextmanager
def written(tmp: Path) -> Iterator[None]:
    """A write into the temporary `tmp`: on any error `tmp` is removed, and a write that failed on a full disk
    is raised as the OSError(ENOSPC) it is, naming `tmp`. torch.save reports a full disk as a RuntimeError
    ("unexpected pos ...") with no errno; whether the disk is full is read before `tmp` frees its space."""
    try:
        yield
    except BaseException as error:
        full = None
        if isinstance(error, Exception) and not (isinstance(error, OSError) and error.errno in DISK_FULL):
            try:
                stat = os.statvfs(tmp.parent)
                if stat.f_bavail * stat.f_frsize < FULL_BELOW:
                    full = OSError(errno.ENOSPC, f"No space left on device ({type(error).__name__}: {error})", str(tmp))
            except OSError:
                pass
        _remove(tmp)
        if full is not None:
            raise full from error
        raise


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces `final`, on error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    with written(tmp):
        yield tmp
    _remove(final)
    os.replace(tmp, final)


@contextmanager
def atomic_file(final: str | Path) -> Iterator[Path]:
    """Yield a temporary file path beside `final`; on success it is renamed to `final`."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(final)
    fd, name = tempfile.mkstemp(prefix=f".tmp-{final.name}-", dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    with written(tmp):
        yield tmp
    os.replace(tmp, final)


def disk_full(error: BaseException) -> str | None:
    """What a full disk (or quota) that caused `error` says, found anywhere in its chain (torch, MLflow and
    SQLAlchemy wrap it), or None. The caller names the stage; this names the path where there is one."""
    for cause in chain(error):
        if isinstance(cause, OSError) and cause.errno in DISK_FULL:
            return f"no space left on the device writing {cause.filename}" if cause.filename else str(cause)
        if "database or disk is full" in str(cause):  # SQLite: the MLflow store's disk
            return "no space left for the tracking store (SQLite: database or disk is full)"
    return None


def fsync(path: str | Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk: a rename is durable only once both the
    renamed file and its directory are synced; until then a crash of the machine can leave it empty."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_digest(package: Path = Path(__file__).parent) -> str:
    """A short hash of the library's Python sources (every module under `package`, with its path): the code
    a kept result was made with. Any edit changes it, comments included."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def fingerprint(*parts: Any) -> str:
    """A short hash of JSON-able values (settings, data hashes): a kept checkpoint or trial result whose
    fingerprint differs from the current one was made from other inputs and is stale."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
