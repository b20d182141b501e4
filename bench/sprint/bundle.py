"""The data the GPU machine needs, built here and carried there (it cannot reach ../shared/data).

CPU side (`prep`): the preset's own data stages (electralab.data: corpus -> vocab -> shards, exactly as
`dvc repro shards` would build them) into .sprint/prep/, then one xz archive in .sprint/carry/ with the
shards, the vocabulary and the train/dev TSV files of the sprint's GLUE tasks. Token ids compress to
about 60% (the small preset's 56 MB of shards + 1 MB of vocabulary + 8.5 MB of GLUE: a 35.9 MiB archive),
about as small as the raw text would be (138 MB -> 38 MB at xz's best), and the GPU machine only unpacks
them (seconds) where it would otherwise rebuild corpus, vocabulary and shards (about a minute of the GPU's
time on every fresh machine).

GPU side (`ensure_data`): unpacked into .sprint/work/data/ unless the same archive is there already.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from electralab.config import Params, to_dict
from electralab.errors import ConfigError, DataError
from electralab.finetune.tasks import TASKS
from electralab.io import atomic_dir, atomic_file, read_json, sha256_file, write_json
from sprint import carry_dir, extract, prep_dir, work_dir

ARCHIVE, MANIFEST = "data.tar.xz", "bundle.json"
# xz level 1: measured on shards + GLUE text, 3.3x the speed of level 6 for 19% more bytes (the small
# preset's carry: 35.9 MiB measured, packed in 17 s of CPU).
XZ_PRESET = 1
TREE_LIMIT = 64 << 20  # what travels to the machine in all: tracked files + carried folders
STATE_ALLOWANCE = 4 << 20  # kept free for .sprint/state, which travels too


def data_config(params: Params, preset: str, tasks: tuple[str, ...]) -> dict:
    """Everything the carried data depends on: a different value means `prep` again."""
    p = params.presets[preset]
    return {
        "preset": preset,
        "corpus": to_dict(p.corpus),
        "vocab": to_dict(p.vocab),
        "shards": to_dict(p.shards),
        "tasks": list(tasks),
    }


def glue_files(tasks: tuple[str, ...]) -> list[str]:
    """glue/<TASK>/<split>.tsv for the train and evaluation splits of each task."""
    return [
        f"glue/{TASKS[t].directory}/{split}.tsv"
        for t in tasks
        for split in ("train", *(s.name for s in TASKS[t].eval_splits))
    ]


def build_data(params: Params, preset: str, mirror: Path, root: Path) -> Path:
    """corpus -> vocab -> shards of `preset` in .sprint/prep/ (reused when built from the same settings)."""
    from electralab.data.corpus import build_corpus
    from electralab.data.shards import build_shards
    from electralab.data.vocab import train_vocab

    p, out = params.presets[preset], prep_dir(root)
    key = {
        **data_config(params, preset, ()),
        "mirror": {
            f.file: (mirror / "corpus" / f.file).stat().st_size
            for f in p.corpus.mirror
            if (mirror / "corpus" / f.file).exists()
        },
    }
    done = out / "built.json"
    if done.is_file() and read_json(done) == key and (out / "shards" / "manifest.json").is_file():
        print(f"prep: the {preset} preset's shards in {out} are up to date")
        return out
    shutil.rmtree(out, ignore_errors=True)
    build_corpus(p.corpus, out / "corpus", mirror, where=f"presets.{preset}.corpus")
    train_vocab(out / "corpus", out / "vocab", p.vocab, where=f"presets.{preset}.vocab")
    build_shards(out / "corpus", out / "vocab", out / "shards", p.shards)
    write_json(done, key)
    return out


def pack(params: Params, preset: str, tasks: tuple[str, ...], mirror: Path, root: Path) -> dict:
    """Build (or reuse) the data and write the carry: data.tar.xz and bundle.json. Returns the manifest."""
    missing = [f for f in glue_files(tasks) if not (mirror / f).is_file()]
    if missing:
        raise DataError(
            f"{mirror / missing[0]}: not in the mirror; the sprint's tasks need train and dev splits "
            f"(choose tasks with --tasks)"
        )
    built = build_data(params, preset, mirror, root)
    carry = carry_dir(root)
    carry.mkdir(parents=True, exist_ok=True)
    if (carry / MANIFEST).is_file() and (carry / ARCHIVE).is_file():  # only the sprint's settings changed
        manifest = read_json(carry / MANIFEST)
        if (
            manifest["config"] == data_config(params, preset, tasks)
            and manifest["sha256"] == sha256_file(carry / ARCHIVE)
            and (carry / ARCHIVE).stat().st_mtime >= (built / "built.json").stat().st_mtime
        ):
            print(f"prep: {carry / ARCHIVE} is up to date")
            return manifest
    started = time.perf_counter()
    with atomic_file(carry / ARCHIVE) as tmp:
        with tarfile.open(tmp, "w:xz", preset=XZ_PRESET) as tar:
            for name in ("shards", "vocab"):
                tar.add(built / name, arcname=name)
            for rel in glue_files(tasks):
                tar.add(mirror / rel, arcname=rel)
    shards = read_json(built / "shards" / "manifest.json")
    manifest = {
        "sha256": sha256_file(carry / ARCHIVE),
        "bytes": (carry / ARCHIVE).stat().st_size,
        "config": data_config(params, preset, tasks),
        "vocab_size": shards["vocab_size"],
        "seq_len": shards["seq_len"],
        "splits": {k: {"blocks": v["blocks"], "tokens": v["tokens"]} for k, v in shards["splits"].items()},
        "glue": glue_files(tasks),
    }
    write_json(carry / MANIFEST, manifest)
    print(f"prep: {carry / ARCHIVE}: {manifest['bytes'] / 2**20:.1f} MiB (xz, {time.perf_counter() - started:.0f} s)")
    return manifest


def tracked_bytes(root: Path) -> int:
    """The size of what git tracks (it travels with every command), or 0 outside a git checkout."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum((root / n).stat().st_size for n in names.decode().split("\0") if n and (root / n).is_file())


def check_size(root: Path) -> int:
    """The carry + the tracked tree must leave room for the state under the 64 MiB that travels."""
    carry = sum(p.stat().st_size for p in carry_dir(root).rglob("*") if p.is_file())
    total = carry + tracked_bytes(root)
    if total + STATE_ALLOWANCE > TREE_LIMIT:
        raise ConfigError(
            f"{carry_dir(root)} ({carry / 2**20:.1f} MiB) + the tracked files ({(total - carry) / 2**20:.1f} "
            f"MiB) leave less than {STATE_ALLOWANCE >> 20} MiB of the {TREE_LIMIT >> 20} MiB that travels "
            f"to the GPU machine; choose fewer tasks or a smaller corpus"
        )
    return total


def ensure_data(root: Path, expected: dict) -> tuple[Path, bool]:
    """.sprint/work/data unpacked from the carry (reused when it holds the same archive); returns it and
    whether it was unpacked now (a fresh machine). `expected`: data_config of the current params.yaml."""
    carry, data = carry_dir(root), work_dir(root) / "data"
    if not (carry / MANIFEST).is_file():
        raise DataError(
            f"{carry / MANIFEST}: no carried data; run `python bench/gpu_sprint.py prep` on the CPU "
            f"machine and name .sprint/carry in the command's carry"
        )
    manifest = read_json(carry / MANIFEST)
    if manifest["config"] != expected:
        changed = sorted(k for k in expected if manifest["config"].get(k) != expected[k])
        raise ConfigError(
            f"{carry / MANIFEST}: built from other settings of presets.{expected['preset']}."
            f"{{{','.join(changed)}}} than params.yaml has now; run prep again"
        )
    if (data / MANIFEST).is_file() and read_json(data / MANIFEST)["sha256"] == manifest["sha256"]:
        return data, False
    if sha256_file(carry / ARCHIVE) != manifest["sha256"]:
        raise DataError(f"{carry / ARCHIVE}: its sha256 is not the one {MANIFEST} names (a partial copy?); prep again")
    with atomic_dir(data) as tmp:
        extract(carry / ARCHIVE, "r:xz", tmp)
        shutil.copyfile(carry / MANIFEST, tmp / MANIFEST)
    return data, True
