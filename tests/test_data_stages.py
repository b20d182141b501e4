"""The data stages as users run them: stage scripts (exit codes, messages) and `dvc repro` on the tiny preset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, assert_no_output, mirror_root

BIN = Path(sys.executable).parent


def env_for(project: Path, data: Path | str | None) -> dict:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(project / "src")}
    env.pop("ELECTRALAB_DATA", None)
    if data is not None:
        env["ELECTRALAB_DATA"] = str(data)
    return env


def copy_project(dest: Path) -> Path:
    """What the data stages need from a checkout: dvc.yaml, params.yaml, stages/, src/."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("stages", "src"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def set_param(project: Path, dotted: str, value) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    *path, last = dotted.split(".")
    node = params
    for key in path:
        node = node[key]
    node[last] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


# ---- stage scripts: expected errors exit 2 with the key/value/file and no traceback -----------------

def test_stage_rejects_out_of_range_seq_len(tmp_path):
    project = copy_project(tmp_path)
    set_param(project, "presets.tiny.shards.seq_len", 8)
    proc = run([sys.executable, "stages/shards.py"], project, env_for(project, mirror_root()))
    assert proc.returncode == 2
    assert "error: presets.tiny.shards.seq_len=8 is out of range: allowed [16, 8192]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_no_output(project / "data" / "shards")


@pytest.mark.parametrize("data, message", [
    ("empty-mirror", "empty-mirror/corpus: no such directory"),
    ("no-such-dir", "ELECTRALAB_DATA='{}': no such directory"),
])
def test_corpus_stage_bad_mirror(tmp_path, data, message):
    project = copy_project(tmp_path / "project")
    (tmp_path / "empty-mirror").mkdir()
    mirror = tmp_path / data
    proc = run([sys.executable, "stages/corpus.py"], project, env_for(project, mirror))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message.format(mirror) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_no_output(project / "data" / "corpus")


def test_vocab_stage_without_corpus(tmp_path):
    project = copy_project(tmp_path)
    proc = run([sys.executable, "stages/vocab.py"], project, env_for(project, mirror_root()))
    assert proc.returncode == 2
    assert "error: data/corpus/manifest.json: no such file; run the corpus stage first (dvc repro corpus)" in proc.stderr
    assert_no_output(project / "data" / "vocab")


# ---- dvc repro of the tiny preset --------------------------------------------------------------

@pytest.mark.slow
def test_dvc_repro_tiny(tmp_path):
    project = copy_project(tmp_path)
    env = env_for(project, mirror_root())
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        assert run(cmd, project, env).returncode == 0

    proc = run([str(BIN / "dvc"), "repro", "shards"], project, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stage in ("corpus", "vocab", "shards"):
        assert f"Running stage '{stage}'" in proc.stdout
    assert (project / "data" / "corpus" / "manifest.json").is_file()
    assert (project / "data" / "vocab" / "spm.model").is_file()
    shards = json.loads((project / "data" / "shards" / "manifest.json").read_text())
    metrics = {s: json.loads((project / "metrics" / f"{s}.json").read_text()) for s in ("corpus", "vocab", "shards")}
    assert metrics["corpus"]["documents"] == 62                   # WikiText-2 test: 62 articles
    assert metrics["vocab"]["vocab_size"] == 4096
    assert metrics["shards"]["train_blocks"] == shards["splits"]["train"]["blocks"] > 2000
    assert shards["seq_len"] == 128 and metrics["shards"]["validation_blocks"] > 0

    # Only the stage whose params changed reruns; another preset invalidates all three.
    set_param(project, "presets.tiny.shards.seq_len", 64)
    status = json.loads(run([str(BIN / "dvc"), "status", "--json"], project, env).stdout)
    assert set(status) == {"shards"}
    proc = run([str(BIN / "dvc"), "repro", "shards"], project, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Running stage 'shards'" in proc.stdout and "Running stage 'corpus'" not in proc.stdout
    assert json.loads((project / "data" / "shards" / "manifest.json").read_text())["seq_len"] == 64
    set_param(project, "preset", "small")
    status = json.loads(run([str(BIN / "dvc"), "status", "--json"], project, env).stdout)
    assert {"corpus", "vocab", "shards"} <= set(status)
