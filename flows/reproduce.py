"""Prefect flow `reproduce`: the pipeline through DVC, one Prefect task per DVC stage.

    python flows/reproduce.py                                     # every run of params.yaml's preset
    python flows/reproduce.py --tables coco-lm/table1             # one table: its runs, then the report
    python flows/reproduce.py --preset small --runs cocolm        # another preset, in its own workspace
    python flows/reproduce.py --tables teams/table4 --targets     # print the DVC targets, run nothing

What it does, in order (docs/operations.md explains each choice):

1. Checks the preset, tables and runs against params.yaml (electralab.config / electralab.runs) and fails
   before any work, naming the bad value and the allowed ones.
2. Picks the workspace: the project itself for params.yaml's preset; for another preset a workspace under
   .electralab/workspaces/<preset>/ (a copy of the sources with that preset selected, sharing the project's
   DVC cache and MLflow store), so the user's params.yaml is never rewritten.
3. Runs `dvc repro <stage>` per stage: corpus (retried: hub downloads fail transiently), shards, then per
   run pretrain@<run>, finetune@<run> and export@<run> in dependency order, then the report. DVC's lock file and cache
   decide what actually runs; stages missing from dvc.yaml (finetune, report before they land) are skipped
   and named. A failed stage fails the flow. Prefect never serves a stage from its own input cache.
4. Publishes a summary and the report's tables as Prefect Markdown artifacts, linking the MLflow experiment.

One flow works in a workspace at a time (a lock under .electralab/locks/; a second flow waits for the first to
end, then finds its stages up to date), and it runs one stage at a time. Parallelism comes from inside a stage
(torch threads; Ray Train workers over GPUs with presets.<preset>.pretrain.num_workers and RAY_ADDRESS) and from
flows of different presets, whose workspaces are separate. docs/operations.md explains why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE
from prefect.runtime import flow_run

from electralab.config import PRESETS, load_params, parse_params
from electralab.errors import EXIT_BAD_INPUT, ConfigError
from electralab.runs import TABLES, check_run, resolve_all, run_specs, runs_for_tables, with_producers

PROJECT = Path(__file__).resolve().parents[1]
WORKSPACES = Path(".electralab") / "workspaces"   # under the project; ignored by git and DVC
SOURCES = ("dvc.yaml", ".dvcignore", "stages", "src")   # what a preset workspace copies from the project
PROGRESS = re.compile(r"\d+%\|")                        # a tqdm progress line
PROGRESS_EVERY_S = 15.0
PROJECTS_ENV = "ELECTRALAB_PROJECTS"   # other project roots a flow run may work in (os.pathsep-separated)


# ------------------------------------------------------------------------------------------------
# The plan: validated before anything runs
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    project: Path
    preset: str
    runs: tuple[str, ...]         # dependencies first
    in_place: bool                # params.yaml's own preset: run in the project itself

    @property
    def workspace(self) -> Path:
        return self.project if self.in_place else self.project / WORKSPACES / self.preset


def allowed_project(project: str | Path | None) -> Path:
    """The project a flow run may work in: this checkout, or one the serving process lists in
    $ELECTRALAB_PROJECTS. Anyone who can reach the Prefect API can start a deployment with any parameters,
    and a free `project` would run `dvc repro` (any stage command of any dvc.yaml) in any directory."""
    if project is None:
        return PROJECT
    chosen = Path(project).expanduser().resolve()
    allowed = [PROJECT, *(Path(p).expanduser().resolve() for p in os.environ.get(PROJECTS_ENV, "").split(os.pathsep) if p)]
    if chosen not in allowed:
        raise ConfigError(f"project {str(project)!r} is not this flow's project ({PROJECT}) nor listed in "
                          f"${PROJECTS_ENV} of the process serving the flow; allowed: {', '.join(map(str, allowed))}")
    return chosen


def make_plan(project: Path, preset: str | None = None, tables: list[str] | None = None,
              runs: list[str] | None = None) -> Plan:
    """Check preset, tables and runs against the project's params.yaml; ConfigError names a bad value."""
    project = Path(project).resolve()
    params = load_params(project / "params.yaml")
    active = params.preset
    chosen_preset = active if preset is None else preset
    if chosen_preset not in params.presets:
        allowed = [p for p in PRESETS if p in params.presets]
        raise ConfigError(f"preset {chosen_preset!r} is not a preset of {project / 'params.yaml'}; "
                          f"choose one of {allowed}")
    if isinstance(tables, str) or isinstance(runs, str):
        raise ConfigError("tables and runs are lists of names, e.g. tables=['coco-lm/table1']")
    params = parse_params({**params.raw, "preset": chosen_preset}, str(project / "params.yaml"))
    resolve_all(params)   # a mistake anywhere in the registry stops here, by key path

    for table in tables or []:
        if table not in TABLES:
            raise ConfigError(f"table {table!r} is not a table; choose from: {', '.join(TABLES)}")
    for run in runs or []:
        check_run(run, params.runs)
    if not tables and not runs:
        wanted = list(params.runs)
    else:
        wanted = runs_for_tables(params, list(tables or [])) + list(runs or [])
    return Plan(project, chosen_preset, tuple(with_producers(run_specs(params), wanted)), chosen_preset == active)


def stage_targets(stage_names: set[str], runs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The DVC targets to run, in order, and those the plan wants but dvc.yaml does not have (yet)."""
    wanted = ["corpus", "shards"]
    for run in runs:
        wanted += [f"pretrain@{run}", f"finetune@{run}", f"export@{run}"]
    wanted.append("report")
    present = [t for t in wanted if t in stage_names]
    return present, [t for t in wanted if t not in stage_names]


# ------------------------------------------------------------------------------------------------
# Workspaces and running DVC
# ------------------------------------------------------------------------------------------------

class StageFailed(RuntimeError):
    """`dvc repro <target>` exited non-zero; `status` is the stage command's own exit status if DVC said."""

    def __init__(self, target: str, workspace: Path, dvc_status: int, status: int | None, tail: list[str]):
        self.target, self.status = target, status
        said = f", the stage exited with {status}" if status is not None else ""
        super().__init__(f"dvc repro {target} failed in {workspace} (dvc exit {dvc_status}{said}); last lines:\n"
                         + "\n".join(tail))


def tool(name: str) -> str:
    """A console script of the Python running the flow (its venv), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def stage_env(plan: Plan) -> dict[str, str]:
    """The environment of every DVC call: this Python first on PATH (dvc.yaml runs `python stages/...`),
    ELECTRALAB_DATA made absolute, and MLflow pointed at the project's store from a preset workspace."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if env.get("ELECTRALAB_DATA"):
        env["ELECTRALAB_DATA"] = str(Path(env["ELECTRALAB_DATA"]).expanduser().resolve())
    if not plan.in_place:
        env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{plan.project / 'mlflow.db'}")
    return env


def dvc_repro(workspace: Path, target: str, env: dict[str, str], *, single: bool = False) -> str:
    """Run `dvc --wait-for-lock repro <target>`, streaming its output to the task's log; return the output.

    Raises StageFailed on a non-zero exit so the Prefect task, and with it the flow, fails."""
    logger = get_run_logger()
    cmd = [tool("dvc"), "--wait-for-lock", "repro", *(["--single-item"] if single else []), target]
    logger.info("$ dvc %s   (in %s)", " ".join(cmd[1:]), workspace)
    output, tail, last_progress = [], deque(maxlen=30), 0.0
    proc = subprocess.Popen(cmd, cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)   # text mode: tqdm's \r updates arrive as lines
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if not line:
            continue
        if PROGRESS.search(line):   # progress bars: one line every PROGRESS_EVERY_S seconds is enough
            if time.monotonic() - last_progress < PROGRESS_EVERY_S:
                continue
            last_progress = time.monotonic()
        else:
            output.append(line)
        tail.append(line)
        logger.info(line)
    status = proc.wait()
    if status != 0:
        said = re.findall(r"exited with (-?\d+)", "\n".join(output))
        raise StageFailed(target, workspace, status, int(said[-1]) if said else None, list(tail))
    return "\n".join(output)


def outcome(target: str, output: str) -> str:
    if f"Running stage '{target}'" in output:
        return "ran"
    if f"Stage '{target}' is cached" in output:
        return "restored from the run cache"
    return "up to date"


@task(name="dvc-repro", task_run_name="{target}", cache_policy=NONE)
def repro(plan: Plan, target: str, single: bool = False) -> dict:
    """One DVC stage. Never cached by Prefect: DVC's lock file decides whether the stage runs."""
    started = time.monotonic()
    output = dvc_repro(plan.workspace, target, stage_env(plan), single=single)
    return {"stage": target, "result": outcome(target, output), "seconds": round(time.monotonic() - started, 1)}


def retry_unless_bad_input(task, task_run, state) -> bool:
    """Retry a failed stage unless it reported bad configuration or data (exit 2): a retry cannot fix that."""
    try:
        state.result()
    except StageFailed as e:
        return e.status != EXIT_BAD_INPUT
    except Exception:
        return True
    return False


# The corpus stage downloads from the Hugging Face hub when ELECTRALAB_DATA is not set: retries help there.
# Training stages get none: their failures (bad settings, divergence, out of memory) repeat on a retry, and a
# run that was killed resumes from its checkpoint when the flow is started again.
repro_corpus = repro.with_options(retries=2, retry_delay_seconds=60, retry_condition_fn=retry_unless_bad_input)


def file_lock(path: Path, what: str):
    """Wait for an exclusive lock on `path` (zc.lockfile, the mechanism DVC's own repository lock uses)."""
    import zc.lockfile

    path.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        try:
            return zc.lockfile.LockFile(str(path))
        except zc.lockfile.LockError:
            if not waited:
                get_run_logger().info("waiting for %s (%s)", what, path)
                waited = True
            time.sleep(1.0)


def workspace_lock(plan: Plan):
    """One reproduce flow per workspace at a time; another one waits here until it ends.

    DVC's repository lock does not serialise two `dvc repro` in one workspace: DVC releases it while a stage's
    command runs and guards only that stage's paths, so a second flow would fail with "is busy" as soon as it
    reached a stage the first one is producing, and could rewrite a preset workspace's sources under it."""
    name = "project" if plan.in_place else plan.preset
    return file_lock(plan.project / ".electralab" / "locks" / f"{name}.lock",
                     f"another reproduce flow in {plan.workspace} to end")


def prepare_workspace(plan: Plan, env: dict[str, str]) -> None:
    """For a preset other than params.yaml's: bring .electralab/workspaces/<preset>/ up to date with the
    project's sources, with `preset: <preset>` in its params.yaml and the project's DVC cache.
    Runs under workspace_lock: no other flow uses the workspace meanwhile."""
    if plan.in_place:
        return
    ws = plan.workspace
    if not (ws / ".dvc" / "config").exists():
        get_run_logger().info("creating the workspace of preset %s: %s", plan.preset, ws)
        ws.mkdir(parents=True, exist_ok=True)
        cache = subprocess.run([tool("dvc"), "cache", "dir"], cwd=plan.project, env=env, capture_output=True,
                               text=True, check=True).stdout.strip()
        subprocess.run([tool("dvc"), "init", "--no-scm", "-q"], cwd=ws, env=env, check=True)
        subprocess.run([tool("dvc"), "config", "cache.dir", cache], cwd=ws, env=env, check=True)

    params = (plan.project / "params.yaml").read_text(encoding="utf-8")
    params, n = re.subn(r"^preset:[ \t]*[^\s#]+", f"preset: {plan.preset}", params, count=1, flags=re.M)
    if n != 1:
        raise ConfigError(f"{plan.project / 'params.yaml'}: no top-level `preset:` line to set to {plan.preset!r}")
    for name in SOURCES:
        src, dst = plan.project / name, ws / name
        if dst.is_dir():
            shutil.rmtree(dst)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif src.exists():
            shutil.copy2(src, dst)
    (ws / "params.yaml").write_text(params, encoding="utf-8")
    assert load_params(ws / "params.yaml").preset == plan.preset


def dvc_stage_names(plan: Plan, env: dict[str, str]) -> set[str]:
    proc = subprocess.run([tool("dvc"), "stage", "list", "--name-only"], cwd=plan.workspace, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"`dvc stage list` failed in {plan.workspace}: {proc.stderr.strip()}")
    return set(proc.stdout.split())


def mlflow_experiment(plan: Plan, env: dict[str, str]) -> str:
    """The preset's MLflow experiment id, created on first use by the library (so its artifacts live under
    the project's mlartifacts/, also for runs made in a preset workspace)."""
    code = "import sys; from electralab.tracking import ensure_experiment; print(ensure_experiment(sys.argv[1]))"
    # Two flows creating a new SQLite store at once race in MLflow's schema migrations: one at a time.
    lock = file_lock(plan.project / ".electralab" / "mlflow.lock", "another flow opening the MLflow store")
    try:
        proc = subprocess.run([sys.executable, "-c", code, plan.preset], cwd=plan.project, env=env,
                              capture_output=True, text=True)
    finally:
        lock.close()
    if proc.returncode != 0:
        raise RuntimeError(f"could not open the MLflow experiment of preset {plan.preset}:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------
# Artifacts
# ------------------------------------------------------------------------------------------------

def mlflow_link(experiment_id: str, preset: str) -> str:
    ui = os.environ.get("MLFLOW_UI_URL", "http://127.0.0.1:5000").rstrip("/")
    return f"[MLflow experiment electralab-{preset}]({ui}/#/experiments/{experiment_id})"


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def missing_tasks(plan: Plan) -> list[str]:
    """The fine-tuning tasks the plan's runs recorded as missing (the offline mirror's known gaps, or allowed
    with ELECTRALAB_ALLOW_MISSING=1; any other missing task fails its stage and the flow)."""
    out = []
    for run in plan.runs:
        path = plan.workspace / "metrics" / "finetune" / f"{run}.json"
        missing = json.loads(path.read_text(encoding="utf-8")).get("missing", {}) if path.is_file() else {}
        out += [f"`{run}` {task}: {why}" for task, why in missing.items()]
    return out


def publish(plan: Plan, results: list[dict], skipped: list[str], experiment_id: str) -> None:
    link = mlflow_link(experiment_id, plan.preset)
    rows = "\n".join(f"| `{r['stage']}` | {r['result']} | {r['seconds']} |" for r in results)
    note = ""
    if skipped:
        note = ("\n\nNot in dvc.yaml (yet), skipped: " + ", ".join(f"`{s}`" for s in skipped[:12])
                + (f" and {len(skipped) - 12} more" if len(skipped) > 12 else ""))
    missing = missing_tasks(plan)
    if missing:
        note += "\n\nCould not run (recorded as missing):\n\n" + "\n".join(f"- {m}" for m in missing)
    create_markdown_artifact(
        key=artifact_key("reproduce", plan.preset),
        markdown=f"# reproduce: preset {plan.preset}, {len(plan.runs)} runs\n\n{link} · workspace "
                 f"`{plan.workspace}`\n\n| stage | result | seconds |\n|---|---|---|\n{rows}{note}\n",
        description=f"DVC stages of the reproduce flow (preset {plan.preset})")
    tables = plan.workspace / "reports" / "tables"
    for md in sorted(tables.glob("*.md")) if tables.is_dir() else []:
        create_markdown_artifact(key=artifact_key(plan.preset, md.stem),
                                 markdown=f"{md.read_text(encoding='utf-8')}\n\n{link}\n",
                                 description=f"{md.stem} ({plan.preset} preset), from reports/tables/{md.name}")


# ------------------------------------------------------------------------------------------------
# The flow
# ------------------------------------------------------------------------------------------------

def run_name() -> str:
    p = flow_run.parameters
    return f"{p.get('preset') or 'params.yaml'}: {', '.join(p.get('tables') or p.get('runs') or ['all runs'])}"


@flow(name="reproduce", flow_run_name=run_name)
def reproduce(preset: str | None = None, tables: list[str] | None = None, runs: list[str] | None = None,
              project: str | None = None) -> list[dict]:
    """The pipeline of `preset` (default: params.yaml's) for `tables` and/or `runs` (default: every run)."""
    logger = get_run_logger()
    plan = make_plan(allowed_project(project), preset, tables, runs)   # before any work
    env = stage_env(plan)
    lock = workspace_lock(plan)
    try:
        prepare_workspace(plan, env)
        experiment_id = mlflow_experiment(plan, env)
        targets, skipped = stage_targets(dvc_stage_names(plan, env), plan.runs)
        if skipped:
            logger.warning("dvc.yaml has no stage %s: skipped", ", ".join(skipped))
        logger.info("preset %s, %d runs, in %s: %s", plan.preset, len(plan.runs), plan.workspace,
                    " -> ".join(targets))
        results = []
        for target in targets:
            if target == "corpus":
                results.append(repro_corpus(plan, target))
            else:
                # The report depends on every run's metrics: --single-item keeps DVC from training the runs this
                # flow did not choose; the ones it chose are already up to date.
                results.append(repro(plan, target, single=target == "report"))
    finally:
        lock.close()
    publish(plan, results, skipped, experiment_id)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="a preset of params.yaml (default: its `preset`)")
    parser.add_argument("--tables", nargs="+", metavar="TABLE", help=f"tables/figures: {', '.join(TABLES)}")
    parser.add_argument("--runs", nargs="+", metavar="RUN", help="runs of params.yaml `runs:`")
    parser.add_argument("--project", help=f"the project root (default: the checkout holding flows/; another one "
                                          f"must be listed in ${PROJECTS_ENV})")
    parser.add_argument("--targets", action="store_true", help="print the DVC targets and run nothing")
    args = parser.parse_args()
    try:
        if args.targets:   # for `dvc repro $(...)`; the report then runs alone: `dvc repro --single-item report`
            plan = make_plan(allowed_project(args.project), args.preset, args.tables, args.runs)
            groups = set(yaml.safe_load((plan.project / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
            _, wanted = stage_targets(set(), plan.runs)
            print(" ".join(t for t in wanted if t.split("@")[0] in groups and t != "report"))
            return
        reproduce(preset=args.preset, tables=args.tables, runs=args.runs, project=args.project)
    except (ConfigError, StageFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT if isinstance(e, ConfigError) else 1)


if __name__ == "__main__":
    main()
