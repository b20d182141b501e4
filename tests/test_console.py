"""What a user watches while `dvc repro` runs, in a log that is not a terminal (CI, a Prefect worker, `nohup`): each
stage's own lines, with plain progress lines every ELECTRALAB_PROGRESS_EVERY seconds between its start and its
summary, within a line budget and without the libraries' INFO lines (ELECTRALAB_VERBOSE=1 brings them back); and
the threads each stage (ELECTRALAB_THREADS, else the CPUs it may use) and each Ray trial (its CPUs) trains with.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from conftest import mirror_root
from ops_helpers import make_project
from project_helpers import BIN, env_for

# The budget: the lines of a pretrain + finetune run (MINI sizes) that are not progress lines. Measured: 21 (DVC's
# "Running stage" / command / lock-file lines, each stage's summary, DVC's closing hints).
BUDGET = 30
LIBRARY_NOISE = re.compile(r"\b(INFO|DEBUG)\b|Token authentication|system metrics")


def stage_lines(output: str, stage: str) -> list[str]:
    """The lines between DVC's "Running stage '<stage>'" and the next stage (or the end)."""
    block = output.split(f"Running stage '{stage}':")[1]
    return block.split("Running stage")[0].strip().splitlines()


def mlflow_client(db):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    return client, client.get_experiment_by_name("electralab-tiny").experiment_id


@pytest.mark.slow
def test_a_stage_log_off_a_terminal_shows_progress_within_a_noise_budget_and_the_threads_are_set(tmp_path):
    project = make_project(tmp_path / "project")
    db = tmp_path / "mlflow.db"
    env = {
        **env_for(project, mirror_root()),
        "MLFLOW_TRACKING_URI": f"sqlite:///{db}",
        "ELECTRALAB_PROGRESS_EVERY": "0.1",
        "ELECTRALAB_THREADS": "2",
    }  # MINI pretraining takes ~1 s
    env.pop("ELECTRALAB_VERBOSE", None)
    subprocess.run([str(BIN / "dvc"), "repro", "shards"], cwd=project, env=env, capture_output=True, check=True)
    proc = subprocess.run(
        [str(BIN / "dvc"), "repro", "pretrain@mlm", "finetune@mlm"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )  # not a TTY
    output = proc.stdout
    assert proc.returncode == 0, output[-3000:]

    assert "\r" not in output  # no bar redrawn with carriage returns in a log
    noise = [line for line in output.splitlines() if LIBRARY_NOISE.search(line)]
    assert not noise, noise
    progress = re.compile(r"^(pretrain|finetune) mlm: +\d+% \d+/\d+ \[")
    for stage, what in (("pretrain@mlm", "pretrain mlm"), ("finetune@mlm", "finetune mlm")):
        lines = stage_lines(output, stage)
        summary = next(i for i, line in enumerate(lines) if line.startswith(f"{what}: ") and not progress.match(line))
        assert any(progress.match(line) for line in lines[:summary]), lines  # something between start and summary
    # The fine-tuning count is right from its first line: the extras (MNLI on the checkpoints, few-shot) included.
    totals = {m.group(1) for m in re.finditer(r"^finetune mlm: +\d+% \d+/(\d+) \[", output, re.M)}
    assert len(totals) == 1, totals
    kept = [line for line in output.splitlines() if line.strip() and not progress.match(line)]
    assert len(kept) <= BUDGET, "\n".join(kept)

    # Threads: the stage's from ELECTRALAB_THREADS, each Ray trial's from its CPUs (resources.cpus: 1), although the
    # stage exported OMP_NUM_THREADS=2 to the processes it starts.
    client, experiment = mlflow_client(db)
    (pretrain,) = client.search_runs([experiment], "tags.stage = 'pretrain'")
    assert pretrain.data.tags["threads"] == "2"
    trials = client.search_runs([experiment], "tags.stage = 'finetune-trial'")
    assert trials and {r.data.metrics["threads"] for r in trials} == {1.0}

    # Verbose: the libraries' INFO lines come back. On one CPU (affinity) and no override: one thread.
    quiet_env = {k: v for k, v in env.items() if k not in ("ELECTRALAB_THREADS", "OMP_NUM_THREADS")}
    cpu = min(os.sched_getaffinity(0))
    verbose = subprocess.run(
        [str(BIN / "dvc"), "repro", "-f", "--single-item", "pretrain@mlm"],
        cwd=project,
        env={**quiet_env, "ELECTRALAB_VERBOSE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    assert verbose.returncode == 0, verbose.stdout[-3000:]
    assert re.search(r"INFO mlflow\.system_metrics", verbose.stdout), verbose.stdout[-3000:]
    latest = client.search_runs([experiment], "tags.stage = 'pretrain'", order_by=["attributes.start_time DESC"])[0]
    assert latest.data.tags["threads"] == "1"
