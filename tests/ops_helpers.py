"""Servers and flows for the operations tests (test_flows.py, test_ui.py): a real Prefect server per test
session (SQLite under a tmp PREFECT_HOME), flows run as users run them (`python flows/reproduce.py ...`) in
tmp project copies shrunk to MINI, and one finished ablation (TEAMS Table 4) shared by the flow and UI tests.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, mirror_root
from project_helpers import BIN, copy_project, env_for, run, shrink

ABLATION = "teams/table4"  # its 4 runs and its control, at the ablation budget
# cheapest first at MINI sizes, as the flow runs them (electralab.runs.cheapest_first)
ABLATION_RUNS = ["control_ablation", "teams_full_tie", "electra_ablation", "teams_ablation", "teams_no_tie"]
# A hang's guard, not a speed test: the ablation flow (18 DVC stages, each a fresh interpreter) took 6.3 min alone on a
# 2-core EPYC without AVX512 (27 Nov 2026), and more beside the suite's other worker, where 600 s timed out.
FLOW_TIMEOUT = 1500


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def api(base: str, path: str, body: dict | None = None, method: str | None = None):
    """A JSON call to a server's REST API (POST when there is a body, GET otherwise, unless `method` says).
    A 503 is retried, as Prefect's own client does: its server answers so when SQLite is busy (its scheduler
    writing runs at the same moment)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{base}/{path.lstrip('/')}", data=data, headers={"content-type": "application/json"}, method=method
    )
    for attempt in range(6):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or "null")
        except urllib.error.HTTPError as error:
            if error.code != 503 or attempt == 5:
                raise
            time.sleep(2**attempt)


@dataclass(frozen=True)
class PrefectServer:
    api: str  # http://127.0.0.1:<port>/api
    log: Path  # the server's stdout and stderr: its services (the scheduler among them) log there


@pytest.fixture(scope="session")
def prefect_api(prefect_server) -> str:
    return prefect_server.api


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> PrefectServer:
    """A Prefect server on a free local port with its SQLite default under a tmp PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/api/health", proc, log)
        yield PrefectServer(f"http://127.0.0.1:{port}/api", log)
    finally:
        stop(proc)


def make_project(dest: Path, preset: str = "tiny", **pretrain) -> Path:
    """A project copy (git + DVC initialised, committed) with `preset` shrunk to MINI."""
    project = copy_project(dest)
    shrink(project, preset, **pretrain)
    env = env_for(project, None)
    for cmd in (
        ["git", "init", "-q"],
        [str(BIN / "dvc"), "init", "-q"],
        [str(BIN / "dvc"), "config", "plots.html_template", "plots.html"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "project"],
    ):
        if cmd[-1] == "plots.html":  # the project's page for `dvc plots show` (.dvc/plots.html)
            shutil.copy(ROOT / ".dvc" / "plots.html", project / ".dvc" / "plots.html")
        proc = run(cmd, project, env)
        assert proc.returncode == 0, proc.stderr
    return project


def flow_env(project: Path, prefect: str, db: Path) -> dict:
    env = env_for(project, mirror_root())
    env.update(
        PREFECT_API_URL=prefect,
        PREFECT_HOME=str(project.parent / "prefect-client"),
        MLFLOW_TRACKING_URI=f"sqlite:///{db}",
        PREFECT_LOGGING_COLOR="false",
    )
    return env


def reproduce_cmd(*args: str) -> list[str]:
    return [sys.executable, "flows/reproduce.py", *args]


def flow_runs(prefect: str) -> list[dict]:
    return api(prefect, "flow_runs/filter", {"sort": "EXPECTED_START_TIME_DESC"})


def flow_run_named(prefect: str, name: str) -> dict:
    found = [r for r in flow_runs(prefect) if r["name"] == name]
    assert len(found) == 1, [r["name"] for r in flow_runs(prefect)]
    return found[0]


def task_runs(prefect: str, flow_run_id: str) -> list[dict]:
    return api(prefect, "task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})


@pytest.fixture(scope="session")
def ablation(tmp_path_factory, prefect_api):
    """TEAMS Table 4 (an ablation: weight sharing) run through the reproduce flow on MINI sizes, once per
    session: (project, mlflow db, the flow's CompletedProcess)."""
    root = tmp_path_factory.mktemp("ablation")
    project = make_project(root / "project")
    db = root / "mlflow.db"
    proc = subprocess.run(
        reproduce_cmd("--tables", ABLATION),
        cwd=project,
        env=flow_env(project, prefect_api, db),
        capture_output=True,
        text=True,
        timeout=FLOW_TIMEOUT,
    )
    return project, db, proc
