"""The stage entry point (electralab.cli.run_stage) on stop signals, in-process: one line, the shell's exit
status, no traceback; a stage that polls finishes its step first; the process's own handlers come back."""

from __future__ import annotations

import os
import signal

import pytest
from conftest import ROOT

from electralab.cli import STOP, run_stage


def stage_that(action):
    def body(params, args):
        action()

    return body


def run(body, tmp_path, monkeypatch) -> SystemExit | None:
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # the stage lock goes under tmp_path/.electralab
    monkeypatch.delenv("DVC_STAGE", raising=False)
    (tmp_path / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    try:
        run_stage("demo", body, argv=["--params", str(tmp_path / "params.yaml")])
    except SystemExit as e:
        return e
    return None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_stage_where_it_is_with_one_line_and_128_plus_its_number(
    signum, tmp_path, monkeypatch, capsys
):
    reached = []

    def work():
        os.kill(os.getpid(), signum)
        reached.append("after the signal")  # never: the stage does not poll, so it stops where it is

    exited = run(stage_that(work), tmp_path, monkeypatch)
    assert exited is not None and exited.code == 128 + signum and not reached
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    assert err == f"demo: stopped by {name}; run the same command again (`dvc repro`, `make repro`) to go on\n"


def test_a_stage_that_polls_finishes_its_step_and_a_second_signal_stops_it_at_once(tmp_path, monkeypatch):
    steps = []

    def work():
        assert not STOP.requested()  # polling from here on
        os.kill(os.getpid(), signal.SIGTERM)
        steps.append(1)  # the step goes on
        assert STOP.requested() and STOP.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: at once
        steps.append(2)

    exited = run(stage_that(work), tmp_path, monkeypatch)
    assert exited is not None and exited.code == 128 + signal.SIGTERM and steps == [1]


def test_the_processs_own_handlers_come_back_after_a_stage(tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert run(stage_that(lambda: None), tmp_path, monkeypatch) is None
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


FORK_STAGE = """
import multiprocessing, os, signal, sys, time
from electralab.cli import run_stage

def body(params, args):
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    time.sleep(0.5)  # the child runs Python, with the stage's handlers inherited
    os.kill(child.pid, signal.SIGTERM)  # what a process pool's terminate() sends its workers
    child.join(30)
    print(f"child exit {child.exitcode}")

run_stage("demo", body, argv=["--params", sys.argv[1]])
"""


def test_a_forked_child_ends_on_sigterm_as_without_the_stages_handlers(tmp_path):
    """A forked child (a process pool's worker) inherits the stage's handlers; a SIGTERM must end it as it would
    without them, not raise Stopped inside it (the shards stage's pool then hung at its exit)."""
    import subprocess
    import sys

    (tmp_path / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    (tmp_path / "stage.py").write_text(FORK_STAGE, encoding="utf-8")
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    env.pop("DVC_STAGE", None)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "stage.py"), str(tmp_path / "params.yaml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "Stopped" not in proc.stderr, proc.stderr
    assert proc.stdout == f"child exit {-signal.SIGTERM}\n", proc.stdout


SLOW_IMPORT_STAGE = """
import os, signal, sys
from electralab.cli import run_stage  # first, as every stage script imports it
os.kill(os.getpid(), int(sys.argv[1]))  # a stop signal while the stage script is still importing
import torch  # noqa: E402  (the heavy imports after it: seconds in a real stage)

def main(params, args):
    print("the stage ran")

if __name__ == "__main__":
    run_stage("slow", main, argv=["--params", sys.argv[2]])
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_stage_script_imports_stops_it_in_its_line_before_it_runs(signum, tmp_path):
    """Ctrl-C in a stage's first seconds (torch, Ray, MLflow importing) is held until run_stage can end the stage in
    its one line: no KeyboardInterrupt traceback from inside an import, and the stage's body never runs."""
    import subprocess
    import sys

    (tmp_path / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "slow.py").write_text(SLOW_IMPORT_STAGE, encoding="utf-8")
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    env.pop("DVC_STAGE", None)
    proc = subprocess.run(
        [sys.executable, "stages/slow.py", str(int(signum)), str(tmp_path / "params.yaml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr == f"slow: stopped by {name}; run the same command again (`dvc repro`, `make repro`) to go on\n"


def test_a_full_disk_anywhere_in_the_errors_chain_ends_a_stage_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    """torch, MLflow and SQLAlchemy wrap a full disk in their own errors: the stage still says what it is."""
    import errno
    import sqlite3

    def store_full():
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full [SQL: INSERT ...]") from e

    def file_full():
        raise OSError(errno.ENOSPC, "No space left on device", "models/electra/encoder/weights.pt")

    for action, says in (
        (store_full, "no space left for the tracking store (SQLite: database or disk is full)"),
        (file_full, "no space left on the device writing models/electra/encoder/weights.pt"),
    ):
        exited = run(stage_that(action), tmp_path, monkeypatch)
        assert exited is not None and exited.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: demo: {says}; free some space and run the same command again") and (
            err.count("\n") == 1
        ), err

    def bug():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):  # anything else keeps its traceback
        run(stage_that(bug), tmp_path, monkeypatch)


def test_a_stop_that_a_library_wrapped_still_ends_the_stage_in_one_line(tmp_path, monkeypatch, capsys):
    """Ray's ray.wait checks signals in C: the Stopped our handler raises comes out as a SystemError ("returned a
    result with an exception set") caused by the Stopped (seen by Ctrl-C of make repro at a fine-tuning's start)."""
    from electralab.errors import Stopped, failed_or_killed

    def wrapped():
        try:
            raise Stopped("stopped by SIGINT", signal.SIGINT)
        except Stopped as e:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from e

    exited = run(stage_that(wrapped), tmp_path, monkeypatch)
    assert exited is not None and exited.code == 128 + signal.SIGINT
    assert capsys.readouterr().err == (
        "demo: stopped by SIGINT; run the same command again (`dvc repro`, `make repro`) to go on\n"
    )
    try:
        wrapped()
    except SystemError as e:
        assert failed_or_killed(e) == "KILLED"  # the MLflow runs it ends are KILLED, not FAILED
    assert failed_or_killed(RuntimeError("a bug")) == "FAILED"
