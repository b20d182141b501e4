"""Where and how the reproduce flow runs DVC: the plan (checked before any work), the workspace (the project,
or a copy for another preset), its locks, and `dvc repro` as a subprocess whose output streams into a log.

Nothing here imports Prefect: flows/reproduce.py wraps these in Prefect tasks, its `--targets` answers from
make_plan and targets alone, and its `--no-prefect` (`make repro`) runs them through reproduce_locally. The
library (src/electralab) knows nothing about DVC; here the flow meets it. docs/operations.md explains the
choices.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from logging import Logger, LoggerAdapter
from pathlib import Path
from typing import Callable

import yaml

from electralab.config import PRESETS, load_params, parse_params
from electralab.errors import ConfigError
from electralab.runs import TABLES, cheapest_first, check_run, resolve_all, runs_for_tables

PROJECT = Path(__file__).resolve().parents[1]
PROBE_SECONDS = 5  # of timed pretraining steps behind the first ETA (probe_pace), after a warm-up
WORKSPACES = Path(".electralab") / "workspaces"  # under the project; ignored by git and DVC
SOURCES = ("dvc.yaml", ".dvcignore", "stages", "src")  # what a preset workspace copies from the project
PROGRESS = re.compile(r"\d+%\|")  # a tqdm progress line
PROGRESS_EVERY_S = 15.0
PROJECTS_ENV = "ELECTRALAB_PROJECTS"  # other project roots a flow run may work in (os.pathsep-separated)

Log = Logger | LoggerAdapter  # Prefect's run logger is a LoggerAdapter


# ------------------------------------------------------------------------------------------------
# The plan: validated before anything runs
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    project: Path
    preset: str
    runs: tuple[str, ...]  # cheapest first, dependencies before the runs that read them
    in_place: bool  # params.yaml's own preset: run in the project itself
    costs: tuple[float, ...] = ()  # each run's electralab.runs.training_cost (relative), for the ETA

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
    listed = os.environ.get(PROJECTS_ENV, "").split(os.pathsep)
    allowed = [PROJECT, *(Path(p).expanduser().resolve() for p in listed if p)]
    if chosen not in allowed:
        raise ConfigError(
            f"project {str(project)!r} is not this flow's project ({PROJECT}) nor listed in "
            f"${PROJECTS_ENV} of the process serving the flow; allowed: "
            f"{', '.join(map(str, allowed))}"
        )
    return chosen


def make_plan(
    project: Path, preset: str | None = None, tables: list[str] | None = None, runs: list[str] | None = None
) -> Plan:
    """Check preset, tables and runs against the project's params.yaml; ConfigError names a bad value."""
    project = Path(project).resolve()
    params = load_params(project / "params.yaml")
    active = params.preset
    chosen_preset = active if preset is None else preset
    if chosen_preset not in params.presets:
        allowed = [p for p in PRESETS if p in params.presets]
        raise ConfigError(
            f"preset {chosen_preset!r} is not a preset of {project / 'params.yaml'}; choose one of {allowed}"
        )
    if isinstance(tables, str) or isinstance(runs, str):
        raise ConfigError("tables and runs are lists of names, e.g. tables=['coco-lm/table1']")
    params = parse_params({**params.raw, "preset": chosen_preset}, str(project / "params.yaml"))
    resolved = resolve_all(params)  # a mistake anywhere in the registry stops here, by key path

    for table in tables or []:
        if table not in TABLES:
            raise ConfigError(f"table {table!r} is not a table; choose from: {', '.join(TABLES)}")
    for run in runs or []:
        check_run(run, params.runs)
    if not tables and not runs:
        wanted = list(params.runs)
    else:
        wanted = runs_for_tables(params, list(tables or [])) + list(runs or [])
    ordered = cheapest_first(params, resolved, wanted)  # the control's and the small runs' rows come early
    return Plan(project, chosen_preset, tuple(ordered), chosen_preset == active, tuple(ordered.values()))


def targets(runs: tuple[str, ...]) -> list[str]:
    """The DVC targets of the plan's runs, in order: the data, each run's stages, the report. Every one is a
    stage of dvc.yaml (its per-run stages are `foreach: ${runs}`, and the plan's runs are params.yaml's);
    tests/test_flows.py checks that against dvc.yaml."""
    out = ["corpus", "shards"]
    for run in runs:
        out += [f"pretrain@{run}", f"finetune@{run}", f"export@{run}"]
    return out + ["report"]


# ------------------------------------------------------------------------------------------------
# Running DVC
# ------------------------------------------------------------------------------------------------


class StageFailed(RuntimeError):
    """`dvc repro <target>` exited non-zero; `status` is the stage command's own exit status if DVC said."""

    def __init__(self, target: str, workspace: Path, dvc_status: int, status: int | None, tail: list[str]):
        self.target, self.status = target, status
        said = f", the stage exited with {status}" if status is not None else ""
        super().__init__(
            f"dvc repro {target} failed in {workspace} (dvc exit {dvc_status}{said}); last lines:\n" + "\n".join(tail)
        )


def tool(name: str) -> str:
    """A console script of the Python running the flow (its venv), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def stage_env(plan: Plan) -> dict[str, str]:
    """The environment of every DVC call: this Python first on PATH (dvc.yaml runs `python stages/...`),
    ELECTRALAB_DATA made absolute, and MLflow pointed at the project's store from a preset workspace."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    if env.get("ELECTRALAB_DATA"):
        env["ELECTRALAB_DATA"] = str(Path(env["ELECTRALAB_DATA"]).expanduser().resolve())
    if not plan.in_place:
        env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{plan.project / 'mlflow.db'}")
    return env


def dvc_repro(workspace: Path, target: str, env: dict[str, str], log: Log, *, single: bool = False) -> str:
    """Run `dvc --wait-for-lock repro <target>`, streaming its output to `log`; return the output.

    Raises StageFailed on a non-zero exit (so the Prefect task, and with it the flow, fails)."""
    cmd = [tool("dvc"), "--wait-for-lock", "repro", *(["--single-item"] if single else []), target]
    log.info("$ dvc %s   (in %s)", " ".join(cmd[1:]), workspace)
    output, tail, last_progress = [], deque(maxlen=30), 0.0
    proc = subprocess.Popen(
        cmd, cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )  # text mode: tqdm's \r updates arrive as lines
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if not line:
            continue
        if PROGRESS.search(line):  # progress bars: one line every PROGRESS_EVERY_S seconds is enough
            if time.monotonic() - last_progress < PROGRESS_EVERY_S:
                continue
            last_progress = time.monotonic()
        else:
            output.append(line)
        tail.append(line)
        log.info(line)
    status = proc.wait()
    if status != 0:
        said = re.findall(r"exited with (-?\d+)", "\n".join(output))
        raise StageFailed(target, workspace, status, int(said[-1]) if said else None, list(tail))
    return "\n".join(output)


# ------------------------------------------------------------------------------------------------
# Locks and the workspace
# ------------------------------------------------------------------------------------------------


def file_lock(path: Path, what: str, log: Log):
    """Wait for an exclusive lock on `path` (zc.lockfile, the mechanism DVC's own repository lock uses)."""
    import zc.lockfile

    path.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        try:
            return zc.lockfile.LockFile(str(path))
        except zc.lockfile.LockError:
            if not waited:
                log.info("waiting for %s (%s)", what, path)
                waited = True
            time.sleep(1.0)


def workspace_lock(plan: Plan, log: Log):
    """One reproduce flow per workspace at a time; another one waits here until it ends.

    DVC's repository lock does not serialise two `dvc repro` in one workspace: DVC releases it while a stage's
    command runs and guards only that stage's paths, so a second flow would fail with "is busy" as soon as it
    reached a stage the first one is producing, and could rewrite a preset workspace's sources under it."""
    name = "project" if plan.in_place else plan.preset
    return file_lock(
        plan.project / ".electralab" / "locks" / f"{name}.lock",
        f"another reproduce flow in {plan.workspace} to end",
        log,
    )


def prepare_workspace(plan: Plan, env: dict[str, str], log: Log) -> None:
    """For a preset other than params.yaml's: bring .electralab/workspaces/<preset>/ up to date with the
    project's sources, with `preset: <preset>` in its params.yaml and the project's DVC cache.
    Runs under workspace_lock: no other flow uses the workspace meanwhile."""
    if plan.in_place:
        return
    ws = plan.workspace
    if not (ws / ".dvc" / "config").exists():
        log.info("creating the workspace of preset %s: %s", plan.preset, ws)
        ws.mkdir(parents=True, exist_ok=True)
        cache = subprocess.run(
            [tool("dvc"), "cache", "dir"], cwd=plan.project, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
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


def mlflow_experiment(plan: Plan, env: dict[str, str], log: Log) -> str:
    """The preset's MLflow experiment id, created on first use by the library (so its artifacts live under
    the project's mlartifacts/, also for runs made in a preset workspace)."""
    code = "import sys; from electralab.tracking import ensure_experiment; print(ensure_experiment(sys.argv[1]))"
    # Two flows creating a new SQLite store at once race in MLflow's schema migrations: one at a time.
    lock = file_lock(plan.project / ".electralab" / "mlflow.lock", "another flow opening the MLflow store", log)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, plan.preset], cwd=plan.project, env=env, capture_output=True, text=True
        )
    finally:
        lock.close()
    if proc.returncode != 0:
        raise RuntimeError(f"could not open the MLflow experiment of preset {plan.preset}:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------
# Without Prefect (`make repro`): the same stages in the same order, a report after each row, the time left
# ------------------------------------------------------------------------------------------------


def outcome(target: str, output: str) -> str:
    """What `dvc repro <target>` did, from its output."""
    if f"Running stage '{target}'" in output:
        return "ran"
    if f"Stage '{target}' is cached" in output:
        return "restored from the run cache"
    return "up to date"


class Pace:
    """The time the rest of a plan will take at this machine's pace so far: pretraining's seconds per unit of
    training_cost (a run's tokens x weights), and the mean seconds of each other kind of stage that ran. Before
    any pretraining has run here, a probe's seconds per cost stand in (`probed`)."""

    def __init__(self, plan: Plan):
        self.cost = dict(zip(plan.runs, plan.costs))
        self.pretrain_seconds = self.pretrain_cost = 0.0  # of the pretraining stages that ran
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.probed: float | None = None  # seconds per unit of cost, from probe_pace
        # The pretraining and fine-tuning stages time themselves over all their commands (a stopped `make repro`
        # run again): their metrics files hold pretraining's wall hours and fine-tuning's seconds.
        self.metrics = plan.workspace / "metrics"
        for run, cost in self.cost.items():
            if cost and (seconds := self.stage_seconds("pretrain", run)):
                self.pretrain_seconds += seconds
                self.pretrain_cost += cost
            if seconds := self.stage_seconds("finetune", run):
                self.seconds["finetune"].append(seconds)

    def stage_seconds(self, kind: str, run: str) -> float | None:
        """A pretraining or fine-tuning stage's own time, from its metrics file (None where not there)."""
        if kind == "pretrain":
            hours = read_number(self.metrics / "pretrain" / f"{run}.json", "wall_hours")
            return hours * 3600 if hours else None
        return read_number(self.metrics / "finetune" / f"{run}.json", "seconds")

    def record(self, target: str, result: str, seconds: float) -> None:
        """A stage this command ran took `seconds`; a stage resumed from an earlier command's checkpoint took
        longer, which its own metrics file counts."""
        kind, _, run = target.partition("@")
        if result != "ran":
            return
        if kind in ("pretrain", "finetune"):
            seconds = self.stage_seconds(kind, run) or seconds
        if kind == "pretrain" and self.cost.get(run):
            self.pretrain_seconds += seconds
            self.pretrain_cost += self.cost[run]
        elif kind != "pretrain":
            self.seconds[kind].append(seconds)

    def left(self, stages: list[str]) -> float | None:
        """Seconds for `stages`, or None until pretraining's pace (measured or probed) and fine-tuning's are known."""
        total = 0.0
        for target in stages:
            kind, _, run = target.partition("@")
            if kind == "pretrain":
                if self.cost.get(run):
                    rate = self.pretrain_seconds / self.pretrain_cost if self.pretrain_cost else self.probed
                    if rate is None:
                        return None
                    total += self.cost[run] * rate
            elif kind in ("finetune", "export", "report"):
                if not self.seconds[kind]:
                    if kind == "finetune":
                        return None
                    continue  # seconds until measured: the hours are pretraining's and fine-tuning's
                total += sum(self.seconds[kind]) / len(self.seconds[kind])
        return total


def read_number(path: Path, key: str) -> float | None:
    """`key` of a stage's metrics file, or None where the file or the number is not there (or not readable)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def probe_pace(plan: Plan, env: dict[str, str], log: Log) -> float | None:
    """Pretraining's seconds per unit of training_cost on this machine, from a few seconds of the cheapest trained
    run's step (electralab.train.probe) on the shards stage's output: the first ETA, before any run has trained
    here. None (and one line saying so) when the plan trains nothing or the probe fails."""
    trained = sorted((cost, run) for run, cost in zip(plan.runs, plan.costs) if cost)
    if not trained:
        return None
    cost, run = trained[0]
    stages = yaml.safe_load((plan.workspace / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    shards = stages["shards"]["outs"][0]  # the shards stage's output, as dvc.yaml names it
    cmd = [sys.executable, "-m", "electralab.train.probe", run, shards, "--seconds", str(PROBE_SECONDS)]
    proc = subprocess.run(cmd, cwd=plan.workspace, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        log.info("reproduce: the pace probe failed (%s); the time left shows once a pretraining has run here", said)
        return None
    probed = json.loads(proc.stdout.strip().splitlines()[-1])
    log.info(
        "reproduce: one %s step takes %.0f ms here (%s, %s), %d steps: pretraining it about %s",
        run,
        probed["step_s"] * 1000,
        probed["device"],
        probed["precision"],
        probed["steps"],
        duration(probed["step_s"] * probed["steps"]),
    )
    return probed["step_s"] * probed["steps"] / cost


def duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def reproduce_locally(plan: Plan, log: Log, stop: Callable[[], bool] = lambda: False) -> list[str]:
    """The plan's stages through DVC in the flow's order, without Prefect (`make repro`): the report rebuilt
    after each run whose stages ran, so the first rows (cheapest first: the control's) can be read early; one
    line after each stage with what is left and the time it will take at the pace so far. A failed stage of a
    run skips that run's later stages and the others go on, as `dvc repro --keep-going` would; a failed data
    stage stops everything. `stop`, asked after each stage, ends the command there (a stage that failed while
    it said so was stopped, not broken: its StageFailed goes to the caller). Returns the failed stages."""
    env = stage_env(plan)
    lock = workspace_lock(plan, log)
    failed: list[str] = []
    pace = Pace(plan)
    planned = [t for t in targets(plan.runs) if t != "report"]

    def repro(target: str) -> str:
        started = time.monotonic()
        try:
            result = outcome(target, dvc_repro(plan.workspace, target, env, log, single=target == "report"))
        except StageFailed as e:
            if stop() or ("@" not in target and target != "report"):
                raise  # stopped, or corpus or shards failed: nothing after them can run
            log.error("error: %s", str(e).splitlines()[0])
            failed.append(target)
            result = "failed"
        pace.record(target, result, time.monotonic() - started)
        return result

    try:
        prepare_workspace(plan, env, log)
        log.info("reproduce %s: %d runs, cheapest first: %s", plan.preset, len(plan.runs), ", ".join(plan.runs))
        reported, changed = False, False
        for i, target in enumerate(planned):
            if stop():
                return failed
            run = target.partition("@")[2]
            if any(f.endswith(f"@{run}") for f in failed):
                result = "skipped (an earlier stage of the run failed)"
            else:
                result = repro(target)
                changed |= result == "ran"
            if target.startswith("export@") and changed:  # a row is done: the report shows it
                repro("report")
                reported, changed = True, False
            if target == "shards" and result != "failed" and not pace.pretrain_cost:  # a first pretraining pace
                pace.probed = probe_pace(plan, env, log)
            rest = planned[i + 1 :]
            runs_left = list(dict.fromkeys(t.partition("@")[2] for t in rest if "@" in t))
            seconds = pace.left(rest + ["report"] * (len(runs_left) + 1))
            if seconds is not None:
                eta = f"about {duration(seconds)} more at this machine's pace so far"
            elif pace.probed is not None or pace.pretrain_cost:
                eta = "the time left shows once a fine-tuning has run here"
            else:
                eta = "the time left shows once a pretraining and a fine-tuning have run here"
            stages = f"{len(rest)} stage{'s' * (len(rest) != 1)}"
            left = f"{stages} left ({', '.join(runs_left)}), {eta}" if rest else "every stage done"
            log.info("reproduce: [%d/%d] %s: %s; %s", i + 1, len(planned), target, result, left)
        if (not reported or changed) and not stop():
            repro("report")
    finally:
        lock.close()
    return failed
