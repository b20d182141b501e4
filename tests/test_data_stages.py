"""The data stages as users run them: stage scripts (exit codes, messages) and `dvc repro` on the tiny preset."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import assert_no_output, mirror_root
from project_helpers import BIN, copy_project, env_for, run, set_param, stage_args

# ---- stage scripts: expected errors exit 2 with the key/value/file and no traceback -----------------


def test_stage_rejects_out_of_range_seq_len(tmp_path):
    project = copy_project(tmp_path)
    set_param(project, "presets.tiny.shards.seq_len", 8)
    proc = run([sys.executable, *stage_args("shards")], project, env_for(project, mirror_root()))
    assert proc.returncode == 2
    assert "error: presets.tiny.shards.seq_len=8 is out of range: allowed [16, 8192]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_no_output(project / "data" / "shards")


@pytest.mark.parametrize(
    "data, message",
    [
        ("empty-mirror", "empty-mirror/corpus: no such directory"),
        ("no-such-dir", "ELECTRALAB_DATA='{}': no such directory"),
    ],
)
def test_corpus_stage_bad_mirror(tmp_path, data, message):
    project = copy_project(tmp_path / "project")
    (tmp_path / "empty-mirror").mkdir()
    mirror = tmp_path / data
    proc = run([sys.executable, *stage_args("corpus")], project, env_for(project, mirror))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message.format(mirror) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_no_output(project / "data" / "corpus")


def test_vocab_stage_without_corpus(tmp_path):
    project = copy_project(tmp_path)
    proc = run([sys.executable, *stage_args("vocab")], project, env_for(project, mirror_root()))
    assert proc.returncode == 2
    assert (
        "error: data/corpus/manifest.json: no such file; run the corpus stage first (dvc repro corpus)" in proc.stderr
    )
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
    assert metrics["corpus"]["documents"] == 5997  # the mirror's 4,012 + 1,985 Wikipedia articles
    assert metrics["vocab"]["vocab_size"] == 8192
    assert metrics["shards"]["train_blocks"] == shards["splits"]["train"]["blocks"] > 2000
    assert shards["seq_len"] == 128 and metrics["shards"]["validation_blocks"] > 0

    # Only the stage whose params changed reruns; another preset invalidates all three.
    set_param(project, "presets.tiny.shards.seq_len", 64)
    status = json.loads(run([str(BIN / "dvc"), "status", "--json", "--with-deps", "shards"], project, env).stdout)
    assert set(status) == {"shards"}
    proc = run([str(BIN / "dvc"), "repro", "shards"], project, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Running stage 'shards'" in proc.stdout and "Running stage 'corpus'" not in proc.stdout
    assert json.loads((project / "data" / "shards" / "manifest.json").read_text())["seq_len"] == 64
    # A key the preset leaves to the code default (`-S ++presets.tiny.vocab.threads=1`) invalidates its stage.
    set_param(project, "presets.tiny.vocab.threads", 1)
    status = json.loads(run([str(BIN / "dvc"), "status", "--json", "--with-deps", "shards"], project, env).stdout)
    assert set(status) == {"vocab"}
    set_param(project, "preset", "small")
    status = json.loads(run([str(BIN / "dvc"), "status", "--json", "--with-deps", "shards"], project, env).stdout)
    assert {"corpus", "vocab", "shards"} <= set(status)
