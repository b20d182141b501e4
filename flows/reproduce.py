"""Prefect flow `reproduce`: the pipeline through DVC, one Prefect task per DVC stage.

    python flows/reproduce.py                                     # every run of params.yaml's preset
    python flows/reproduce.py --tables coco-lm/table1             # one table: its runs, then the report
    python flows/reproduce.py --preset small --runs cocolm        # another preset, in its own workspace
    python flows/reproduce.py --tables teams/table4 --targets     # print the DVC targets, run nothing
    python flows/reproduce.py --tables coco-lm/table1 --no-prefect  # the same stages without Prefect (make repro)

What it does, in order (docs/operations.md explains each choice):

1. Checks the preset, tables and runs against params.yaml (electralab.config / electralab.runs) and fails
   before any work (from the command line, before Prefect starts), naming the bad value and the allowed ones.
2. Picks the workspace: the project itself for params.yaml's preset; for another preset a workspace under
   .electralab/workspaces/<preset>/ (a copy of the sources with that preset selected, sharing the project's
   DVC cache and MLflow store), so the user's params.yaml is never rewritten.
3. Runs `dvc repro <stage>` per stage: corpus (retried: hub downloads fail transiently), shards, then per
   run pretrain@<run>, finetune@<run> and export@<run> in dependency order, then the report. DVC's lock file
   and cache decide what actually runs. A failed stage fails the flow. Prefect never serves a stage from its
   own input cache.
4. Publishes a summary and the report's tables as Prefect Markdown artifacts, linking the MLflow experiment.

One flow works in a workspace at a time (a lock under .electralab/locks/; a second flow waits for the first to
end, then finds its stages up to date), and it runs one stage at a time. Parallelism comes from inside a stage
(torch threads; Ray Train workers over GPUs with presets.<preset>.pretrain.num_workers and RAY_ADDRESS) and
from flows of different presets, whose workspaces are separate. docs/operations.md explains why.

The plan, the workspaces, their locks and the DVC subprocess are flows/workspace.py's (no Prefect there):
`--targets` prints before Prefect is imported, the README's first look needs no Prefect.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import time
from typing import NoReturn

from workspace import (
    PROJECTS_ENV,
    Plan,
    StageFailed,
    allowed_project,
    dvc_repro,
    make_plan,
    mlflow_experiment,
    outcome,
    prepare_workspace,
    reproduce_locally,
    stage_env,
    targets,
    workspace_lock,
)

from electralab.errors import EXIT_BAD_INPUT, ConfigError
from electralab.runs import TABLES


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="a preset of params.yaml (default: its `preset`)")
    parser.add_argument("--tables", nargs="+", metavar="TABLE", help=f"tables/figures: {', '.join(TABLES)}")
    parser.add_argument("--runs", nargs="+", metavar="RUN", help="runs of params.yaml `runs:`")
    parser.add_argument(
        "--project",
        help=f"the project root (default: the checkout holding flows/; another one must be listed in ${PROJECTS_ENV})",
    )
    parser.add_argument("--targets", action="store_true", help="print the DVC targets and run nothing")
    parser.add_argument(
        "--no-prefect",
        action="store_true",
        help="run the same stages without Prefect, a report after each run and the time left (`make repro`)",
    )
    return parser.parse_args(argv)


# make passes a SIGTERM it receives on to its child, so `kill -TERM -- -<pgid>` of `make repro` (as systemd and docker
# stop a service) reaches this process twice, the two within a millisecond of each other: one stop, not a second one.
SAME_STOP_S = 1.0


class Stops:
    """The stop signals this command has received: the first (`signum`) ends it after the current stage; another
    one more than SAME_STOP_S later ends it at once (`received` answers True)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0

    def received(self, signum: int, now: float) -> bool:
        if self.signum is None:
            self.signum, self.at = signum, now
            return False
        return now - self.at > SAME_STOP_S


def run_without_prefect(plan: Plan) -> None:
    """`make repro`. Ctrl-C reaches the stage too (the terminal signals the whole process group): the stage stops
    itself in one line, as DVC lets it, and this command ends after it with one line of its own. A signal to this
    process alone (kill <pid>) ends it after the current stage; a second signal ends it at once."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    log = logging.getLogger("reproduce")
    stops = Stops()

    def received(signum: int, frame) -> None:
        if stops.received(signum, time.monotonic()):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, received)
    try:
        failed = reproduce_locally(plan, log, stop=lambda: stops.signum is not None)
    except (ConfigError, StageFailed) as e:
        if stops.signum is None:
            fail(e)
    if stops.signum is not None:
        name = signal.Signals(stops.signum).name
        print(f"reproduce: stopped by {name}; the same command goes on from there (`make repro`)", file=sys.stderr)
        sys.exit(128 + stops.signum)
    if failed:
        print(f"error: failed: {', '.join(failed)} (the report names them; their logs are above)", file=sys.stderr)
        sys.exit(1)


def print_targets(plan: Plan) -> None:
    """The plan's DVC targets but the report, for `dvc repro $(...)`; the report then runs alone, as the flow
    runs it: `dvc repro --single-item report` (it depends on every run's metrics)."""
    print(" ".join(t for t in targets(plan.runs) if t != "report"))


def fail(e: Exception) -> NoReturn:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT if isinstance(e, ConfigError) else 1)


if __name__ == "__main__":
    ARGS = arguments()
    try:  # a bad preset, table, run or project fails here in seconds, before Prefect and its temporary server
        PLAN = make_plan(allowed_project(ARGS.project), ARGS.preset, ARGS.tables, ARGS.runs)
    except ConfigError as e:
        fail(e)
    if ARGS.targets:  # answered before Prefect's import below: no Prefect needed
        print_targets(PLAN)
        sys.exit(0)
    if ARGS.no_prefect:
        run_without_prefect(PLAN)
        sys.exit(0)

from prefect import flow, get_run_logger, task  # noqa: E402  (after `--targets`, above)
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402

# ------------------------------------------------------------------------------------------------
# One task per DVC stage
# ------------------------------------------------------------------------------------------------


@task(name="dvc-repro", task_run_name="{target}", cache_policy=NONE)
def repro(plan: Plan, target: str, single: bool = False) -> dict:
    """One DVC stage. Never cached by Prefect: DVC's lock file decides whether the stage runs."""
    started = time.monotonic()
    output = dvc_repro(plan.workspace, target, stage_env(plan), get_run_logger(), single=single)
    seconds = round(time.monotonic() - started, 1)
    return {"stage": target, "result": outcome(target, output), "seconds": seconds}


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


def publish(plan: Plan, results: list[dict], experiment_id: str) -> None:
    link = mlflow_link(experiment_id, plan.preset)
    rows = "\n".join(f"| `{r['stage']}` | {r['result']} | {r['seconds']} |" for r in results)
    note = ""
    missing = missing_tasks(plan)
    if missing:
        note += "\n\nCould not run (recorded as missing):\n\n" + "\n".join(f"- {m}" for m in missing)
    create_markdown_artifact(
        key=artifact_key("reproduce", plan.preset),
        markdown=f"# reproduce: preset {plan.preset}, {len(plan.runs)} runs\n\n{link} · workspace "
        f"`{plan.workspace}`\n\n| stage | result | seconds |\n|---|---|---|\n{rows}{note}\n",
        description=f"DVC stages of the reproduce flow (preset {plan.preset})",
    )
    tables = plan.workspace / "reports" / "tables"
    for md in sorted(tables.glob("*.md")) if tables.is_dir() else []:
        create_markdown_artifact(
            key=artifact_key(plan.preset, md.stem),
            markdown=f"{md.read_text(encoding='utf-8')}\n\n{link}\n",
            description=f"{md.stem} ({plan.preset} preset), from reports/tables/{md.name}",
        )


# ------------------------------------------------------------------------------------------------
# The flow
# ------------------------------------------------------------------------------------------------


def run_name() -> str:
    p = flow_run.parameters
    names = p.get("tables") or p.get("runs") or ["all runs"]
    return f"{p.get('preset') or 'params.yaml'}: {', '.join(names)}"


@flow(name="reproduce", flow_run_name=run_name)
def reproduce(
    preset: str | None = None,
    tables: list[str] | None = None,
    runs: list[str] | None = None,
    project: str | None = None,
) -> list[dict]:
    """The pipeline of `preset` (default: params.yaml's) for `tables` and/or `runs` (default: every run)."""
    logger = get_run_logger()
    plan = make_plan(allowed_project(project), preset, tables, runs)  # before any work
    env = stage_env(plan)
    lock = workspace_lock(plan, logger)
    try:
        prepare_workspace(plan, env, logger)
        experiment_id = mlflow_experiment(plan, env, logger)
        planned = targets(plan.runs)
        logger.info("preset %s, %d runs, in %s: %s", plan.preset, len(plan.runs), plan.workspace, " -> ".join(planned))
        results = []
        for target in planned:
            if target == "corpus":
                results.append(repro_corpus(plan, target))
            else:
                # The report depends on every run's metrics: --single-item keeps DVC from training the runs
                # this flow did not choose; the ones it chose are already up to date.
                results.append(repro(plan, target, single=target == "report"))
    finally:
        lock.close()
    publish(plan, results, experiment_id)
    return results


def main(args: argparse.Namespace) -> None:
    try:
        reproduce(preset=args.preset, tables=args.tables, runs=args.runs, project=args.project)
    except (ConfigError, StageFailed) as e:
        fail(e)


if __name__ == "__main__":
    main(ARGS)
