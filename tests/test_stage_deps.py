"""dvc.yaml's deps cover the code each stage runs. DVC re-runs a stage only when one of its deps changed: a
module the stage imports but does not list would let `dvc repro` keep outputs that changed code no longer
makes.

Each stage's modules are found two ways, and each file must be a listed dep or inside a listed folder:
- loaded: the stage script imported in a subprocess (not run), then every file under src/electralab that
  sys.modules holds: package __init__ files and whatever the imports pull in at import time;
- imported anywhere: the script's `import electralab...` lines, followed through the library's files, those
  inside functions included: a stage imports its heavy modules (torch, Ray, MLflow) only once it runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

SRC = ROOT / "src"


def stages() -> dict[str, dict]:
    """dvc.yaml's stages; a per-run stage (foreach) by its `do` template."""
    return {
        name: stage.get("do", stage)
        for name, stage in yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"].items()
    }


def script_of(stage: dict) -> str:
    found = re.match(r"python (stages/\S+\.py)(\s|$)", stage["cmd"])
    assert found, f"cmd {stage['cmd']!r} does not run a stage script"
    return found.group(1)


def module_file(name: str) -> Path | None:
    """The file of module `name` (electralab.x.y) under src/, or None when the name is not a module (an
    attribute imported from one: `from electralab.data import read_manifest`)."""
    base = SRC.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def runnable_nodes(node: ast.AST):
    """Every node under `node` but those of an `if TYPE_CHECKING:` block: imports there never run (they name
    types for annotations only), so they are no dependency."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for orelse in child.orelse:
                yield orelse
                yield from runnable_nodes(orelse)
            continue
        yield child
        yield from runnable_nodes(child)


def electralab_imports(path: Path) -> set[str]:
    """The electralab modules (and attributes of them) `path` imports, anywhere in the file it can run."""
    names = set()
    for node in runnable_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: a relative import; this test follows absolute ones only")
    return {n for n in names if n == "electralab" or n.startswith("electralab.")}


def imported_anywhere(script: Path) -> set[Path]:
    """Every library file the script can import, following imports inside functions too."""
    found: set[Path] = set()
    todo = sorted(electralab_imports(script))
    while todo:
        name = todo.pop()
        parts = name.split(".")
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
        for i in range(1, len(parts) + 1):
            path = module_file(".".join(parts[:i]))
            if path is not None and path not in found:
                found.add(path)
                todo += sorted(electralab_imports(path))
    return found


def loaded_on_import(script: Path) -> set[Path]:
    """The library files sys.modules holds once the script is imported, in a fresh interpreter."""
    code = (
        "import json, runpy, sys\n"
        "runpy.run_path(sys.argv[1], run_name='stage_under_test')\n"  # not __main__: nothing runs
        "print(json.dumps([getattr(m, '__file__', None) or '' for m in list(sys.modules.values())]))"
    )
    # This checkout's src first: the venv may hold an editable install of another checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = {Path(f).resolve() for f in json.loads(proc.stdout.splitlines()[-1]) if f}
    assert any(f.is_relative_to(SRC / "electralab") for f in files), "the stage loaded no library module"
    return {f for f in files if f.is_relative_to(SRC / "electralab")}


# Imported but deliberately not a dependency, and why.
NOT_DEPS = {
    # A run's tables only label it (an MLflow tag); its training does not read them, and a dependency would
    # retrain every run whenever a row is added to any table (dvc.yaml says so above the stage). The schema
    # (config.py) only resolves the run, and the stage depends on what it resolved (resolved/pretrain/<run>.json).
    "pretrain": {"src/electralab/tables.py", "src/electralab/config.py"},
    # What the fine-tuning takes from both (its grid, its extras, its row) is in resolved/finetune/<run>.json; a
    # run's tables otherwise only label its MLflow parents.
    "finetune": {"src/electralab/tables.py", "src/electralab/config.py"},
}


def covered(path: str, deps: list[str]) -> bool:
    return any(path == d.rstrip("/") or path.startswith(d.rstrip("/") + "/") for d in deps)


@pytest.mark.parametrize("name", list(stages()))
def test_the_deps_of_a_stage_cover_every_module_it_runs(name):
    stage = stages()[name]
    deps = [d for d in stage["deps"] if isinstance(d, str)]
    script = script_of(stage)
    assert script in deps, f"stage {name}: its script {script} is not in its deps"
    code = {p.relative_to(ROOT).as_posix() for p in loaded_on_import(ROOT / script) | imported_anywhere(ROOT / script)}
    missing = sorted(p for p in code if not covered(p, deps) and p not in NOT_DEPS.get(name, ()))
    assert not missing, f"stage {name} runs code its deps in dvc.yaml do not cover: {missing}"
    # A dep naming no file (a module renamed or removed) fails `dvc repro` only when DVC gets to the stage.
    absent = [d for d in deps if d.startswith(("src/", "stages/")) and not (ROOT / d).exists()]
    assert not absent, f"stage {name}: deps that do not exist: {absent}"


def test_imports_for_type_annotations_only_are_no_dependency_but_every_other_import_is(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import typing\n"
        "from typing import TYPE_CHECKING\n"
        "import electralab.errors\n"
        "if TYPE_CHECKING:\n"
        "    from electralab.finetune.tasks import Task\n"
        "else:\n"
        "    import electralab.env\n"
        "if typing.TYPE_CHECKING:\n"
        "    import electralab.tables\n"
        "def f():\n"
        "    from electralab.data import vocab\n",
        encoding="utf-8",
    )
    assert electralab_imports(module) == {
        "electralab.errors",
        "electralab.env",
        "electralab.data",
        "electralab.data.vocab",
    }
