"""Running the project as users do, in a throwaway copy: stage scripts and `dvc repro` in tmp dirs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import ROOT

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
