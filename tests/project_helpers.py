"""Running the project as users do, in a throwaway copy: stage scripts, `dvc repro` and flows in tmp dirs.

MINI shrinks a preset so that a pretraining run takes seconds (12 x 16 main model, 32-token blocks, 8 steps)
and its fine-tuning a few seconds more (three tasks, 16 examples, one configuration x two seeds).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import ROOT

BIN = Path(sys.executable).parent


def env_for(project: Path, data: Path | str | None) -> dict:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(project / "src")}
    env.pop("ELECTRALAB_DATA", None)
    # A stage run in the test process (run_stage) sets this for the process; a project's stages decide for themselves.
    env.pop("MLFLOW_LOGGING_LEVEL", None)
    if data is not None:
        env["ELECTRALAB_DATA"] = str(data)
    return env


def copy_project(dest: Path) -> Path:
    """What the pipeline needs from a checkout: dvc.yaml, params.yaml, stages/, src/, flows/."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("stages", "src", "flows"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def stage_args(name: str, run: str | None = None) -> list[str]:
    """What dvc.yaml runs for stage `name` (of run `run`), after `python`: the script and its paths, to run a
    stage by hand as DVC does: `[sys.executable, *stage_args("pretrain", "mlm")]` from the project root."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"][name]
    python, *args = shlex.split(stage.get("do", stage)["cmd"].replace("${key}", run or "${key}"))
    assert python == "python" and not any("${" in a for a in args), (name, run, args)
    return args


def load_stage(name: str):
    """stages/<name>.py as a module, to call its `main` through run_stage in the test's process."""
    spec = importlib.util.spec_from_file_location(f"{name}_stage", ROOT / "stages" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """`args` in a process group of its own: past 300 s the whole group is killed, not only `dvc` (whose
    stage, and that stage's Ray, would otherwise go on as orphans and slow every test after it)."""
    proc = subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def set_param(project: Path, dotted: str, value) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    *path, last = dotted.split(".")
    node = params
    for key in path:
        node = node.setdefault(key, {})  # like `-S ++key=value`: a key the preset leaves to the code default
    node[last] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


MINI_GRID = {"lr": [1.0e-3], "epochs": [1], "batch_size": [8], "warmup": [0.1]}
MINI = {
    "corpus": {"mirror": [{"file": "wikitext-2-raw_test_nonblank.txt", "format": "wikitext"}], "max_documents": 2000},
    "model": {"hidden": 16, "layers": 12, "heads": 1, "ffn": 32, "embedding": 16},  # the papers' depth
    "generators": {
        "electra": {"hidden": 8, "heads": 1, "ffn": 16},
        "cocolm": {"layers": 4},
        "amos": {"layers": 8},
        "teams": {"layers": 6},
    },
    "shards": {"seq_len": 32},
    "vocab": {"size": 1000},
    "pretrain": {
        "steps": 8,
        "batch_size": 4,
        "micro_batch_size": 4,
        "warmup_steps": 2,
        "log_every": 1,
        "checkpoint_every": 2,
        "checkpoint_fractions": [0.5, 1.0],
        # 8 steps cannot be judged; tests/test_guard.py collapses a run on purpose instead.
        "guard": {"enabled": False},
    },
    # Three tasks of each kind (classification, regression, SQuAD), one configuration x two seeds, 16 examples:
    # every table cell those tasks feed gets a median; the other tasks' cells stay missing.
    "finetune": {
        "tasks": ["rte", "stsb", "squad2"],
        "seeds": [1, 2],
        "efficiency_tasks": ["rte"],
        "few_shot_tasks": ["rte"],
        "few_shot_fractions": [0.5],
        "grids": {"glue_small": MINI_GRID, "glue_large": MINI_GRID, "squad2": MINI_GRID},
        "max_seq_len": 64,
        "max_train_examples": 16,
        "train_caps": {},
        "task_epochs": {},
        "max_eval_examples": 16,
        "eval_batch_size": 32,
        "squad": {"doc_stride": 32, "max_query_len": 16, "max_train_questions": 8, "max_eval_questions": 8},
        "resources": {"cpus": 1, "gpus": 0, "max_concurrent": None, "local_cpus": 2},
    },
}


def shrink(project: Path, preset: str = "tiny", **pretrain) -> None:
    """`preset` of `project`'s params.yaml shrunk to MINI (plus pretrain overrides). Another preset than tiny
    becomes a copy of tiny first (its corpus, CPU settings), so it is as cheap and still a preset of its own."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    if preset != "tiny":
        params["presets"][preset] = copy.deepcopy(params["presets"]["tiny"])
    target = params["presets"][preset]
    for section, values in MINI.items():
        target[section].update(values)
    target["budgets"] = {"ablation": {}}  # the ablation budget as short as the main one
    target["pretrain"].update(pretrain)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
