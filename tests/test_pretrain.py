"""The pretraining stage as users run it: DVC end to end with MLflow, exact resume after SIGKILL, the NaN
guard, Ray Train with two workers against one, gradient accumulation, the registry (the HF export: test_export.py).

A miniature preset (12 x 16 main model, 32-token blocks, a few steps) keeps each run to seconds."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, mirror_root
from project_helpers import BIN, copy_project, env_for, run, shrink, stage_args

from electralab.config import load_params
from electralab.errors import ConfigError, TrainingDiverged


def mlflow_env(project: Path, db: Path) -> dict:
    env = env_for(project, mirror_root())
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project copy with the shrunk tiny preset and its data stages already built."""
    project = copy_project(tmp_path_factory.mktemp("pretrain-project"))
    shrink(project)
    env = env_for(project, mirror_root())
    for stage in ("corpus", "vocab", "shards"):
        proc = run([sys.executable, *stage_args(stage)], project, env)
        assert proc.returncode == 0, proc.stderr
    return project


def mlflow_client(db: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{db}")


def only_run(client, run_name: str):
    experiment = client.get_experiment_by_name("electralab-tiny")
    runs = client.search_runs([experiment.experiment_id], f"tags.run = '{run_name}' and tags.stage = 'pretrain'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


# ---- DVC end to end, with MLflow as the contracts say -----------------------------------------------


@pytest.mark.slow
def test_dvc_repro_pretrain_with_dependent_runs_and_mlflow(tmp_path):
    project = copy_project(tmp_path / "project")
    shrink(project)
    env = mlflow_env(project, tmp_path / "mlflow.db")
    for cmd in (
        ["git", "init", "-q"],
        [str(BIN / "dvc"), "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "project"],
    ):
        assert run(cmd, project, env).returncode == 0
    sha = run(["git", "rev-parse", "HEAD"], project, env).stdout.strip()
    proc = run([str(BIN / "dvc"), "repro", "pretrain@cocolm_converged_aux", "pretrain@amos_final_mix"], project, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # DVC ran each run's producer first: the converged auxiliary and the final mixture weights exist.
    for stage in (
        "shards",
        "pretrain@cocolm_ablation",
        "pretrain@cocolm_converged_aux",
        "pretrain@amos_ablation",
        "pretrain@amos_final_mix",
    ):
        assert f"Running stage '{stage}'" in proc.stdout
    assert proc.stdout.index("'pretrain@cocolm_ablation'") < proc.stdout.index("'pretrain@cocolm_converged_aux'")

    out = project / "models" / "cocolm_ablation"
    assert {p.name for p in out.iterdir()} == {"encoder", "auxiliary.pt", "fractions", "summary.json"}
    assert {p.name for p in (out / "fractions").iterdir()} == {"050", "100"}
    assert json.loads((out / "fractions" / "050" / "meta.json").read_text())["step"] == 4
    assert (out / "encoder" / "electralab_tokenizer.json").is_file()  # the vocabulary travels with the model
    assert not (project / "checkpoints" / "cocolm_ablation").exists()  # scratch cleared after success
    metrics = json.loads((project / "metrics" / "pretrain" / "cocolm_ablation.json").read_text())
    for key in (
        "loss",
        "copy_acc_replaced",
        "clm_acc_original",
        "scl_pos_cos",
        "tokens_per_s",
        "mfu",
        "wall_hours",
        "device_hours",
        "params_main",
    ):
        assert key in metrics, key
    amos_mix = json.loads((project / "metrics" / "pretrain" / "amos_ablation.json").read_text())
    assert sum(amos_mix[f"mix_weight_exit{d}"] for d in (4, 6, 8)) == pytest.approx(1.0, abs=1e-4)

    client = mlflow_client(tmp_path / "mlflow.db")
    cocolm = only_run(client, "cocolm_ablation")
    tags = cocolm.data.tags
    assert tags["method"] == "cocolm" and tags["preset"] == "tiny" and tags["seed"] == "1"
    assert "coco-lm/table3" in tags["tables"].split(",") and tags["git_sha"] == sha and tags["dvc_exp"] == ""
    assert cocolm.info.status == "FINISHED"
    assert cocolm.data.params["settings.copy_weight"] == "50.0" and cocolm.data.params["pretrain.steps"] == "8"
    history = client.get_metric_history(cocolm.info.run_id, "loss")
    assert [m.step for m in history] == list(range(1, 9))
    for name in ("scl_neg_cos", "copy_acc_original", "clm_acc_replaced", "tokens_per_s", "mfu", "lr"):
        assert client.get_metric_history(cocolm.info.run_id, name), name
    artifacts = {a.path for a in client.list_artifacts(cocolm.info.run_id)}
    assert {"encoder", "auxiliary.pt", "summary.json"} <= artifacts
    amos = only_run(client, "amos_ablation")
    assert client.get_metric_history(amos.info.run_id, "mix_weight_exit6")
    final_mix = only_run(client, "amos_final_mix")
    assert final_mix.data.params["settings.mixture"] == "fixed"

    # A run depends on what it resolves to (resolved/pretrain/<run>.json), not on params.yaml's sections or the schema:
    # an edit of config.py that changes no run retrains none, and a change of one run retrains that run alone.
    config = project / "src" / "electralab" / "config.py"
    config.write_text(config.read_text() + "\n# a comment: the schema edited, no run changed\n")
    proc = run([str(BIN / "dvc"), "repro", "pretrain@cocolm_converged_aux", "pretrain@amos_final_mix"], project, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Running stage 'resolve'" in proc.stdout and "Running stage 'pretrain@" not in proc.stdout, proc.stdout
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["runs"]["cocolm_converged_aux"]["seed"] = 2
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert run([str(BIN / "dvc"), "repro", "resolve"], project, env).returncode == 0
    trained = [f"pretrain@{r}" for r in ("cocolm_ablation", "cocolm_converged_aux", "amos_ablation", "amos_final_mix")]
    status = run([str(BIN / "dvc"), "status", "--json", *trained], project, env)
    assert set(json.loads(status.stdout)) == {"pretrain@cocolm_converged_aux"}, status.stdout


# ---- exact resume ----------------------------------------------------------------------------------


def start(project: Path, run_name: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *stage_args("pretrain", run_name)],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("run_name", ["electra", "cocolm"])  # sampling, dropout, crops: every RNG in play
def test_sigkill_then_rerun_gives_the_weights_of_an_uninterrupted_run(project, tmp_path, run_name):
    env = mlflow_env(project, tmp_path / "mlflow.db")
    encoder = project / "models" / run_name / "encoder" / "weights.pt"
    state = project / "checkpoints" / run_name / "state.pt"

    proc = run([sys.executable, *stage_args("pretrain", run_name)], project, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = weights(encoder)

    for kill_at in ("after the first checkpoint", "after the second checkpoint", "one second in"):
        proc = start(project, run_name, env)
        if kill_at == "after the first checkpoint":
            kill_when(proc, state.exists)
        elif kill_at == "after the second checkpoint":
            first = None

            def second_checkpoint():
                nonlocal first
                if state.exists():
                    first = first or state.stat().st_mtime_ns
                    return state.stat().st_mtime_ns != first
                return False

            kill_when(proc, second_checkpoint)
        else:
            time.sleep(1.0)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        resumed = run([sys.executable, *stage_args("pretrain", run_name)], project, env)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        got = weights(encoder)
        assert got.keys() == reference.keys()
        for name, tensor in reference.items():
            assert torch.equal(got[name], tensor), f"{kill_at}: {name} differs"

    # One MLflow run per run and attempt that finished; the resumed ones continued their run.
    client = mlflow_client(tmp_path / "mlflow.db")
    experiment = client.get_experiment_by_name("electralab-tiny").experiment_id
    finished = client.search_runs([experiment], f"tags.run = '{run_name}' and attributes.status = 'FINISHED'")
    assert len(finished) == 4
    for r in finished:
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "loss")]
        assert max(steps) == 8


# ---- kills at every point of a checkpoint write and of the end of training ---------------------------------


@pytest.fixture(scope="module")
def reference(project, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The encoder of an uninterrupted `mlm` run (8 steps, checkpoints every 2, fractions 0.5 and 1.0)."""
    env = mlflow_env(project, tmp_path_factory.mktemp("reference") / "mlflow.db")
    proc = run([sys.executable, *stage_args("pretrain", "mlm")], project, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return weights(project / "models" / "mlm" / "encoder" / "weights.pt")


def kill_then_rerun(project: Path, env: dict, point: str, nth: int, corrupt=None) -> subprocess.CompletedProcess:
    """A fresh `mlm` run SIGKILLed the nth time it reaches `point` (tests/fault_injection.py), `corrupt`
    applied to its scratch directory, then run again as a user would."""
    shutil.rmtree(project / "models" / "mlm", ignore_errors=True)
    shutil.rmtree(project / "checkpoints", ignore_errors=True)
    (project / "metrics" / "pretrain" / "mlm.json").unlink(missing_ok=True)
    killed = run(
        [sys.executable, str(ROOT / "tests" / "fault_injection.py"), point, str(nth), *stage_args("pretrain", "mlm")],
        project,
        env,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    if corrupt:
        corrupt(project / "checkpoints" / "mlm")
    rerun = run([sys.executable, *stage_args("pretrain", "mlm")], project, env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    return rerun


def assert_resumed_exactly(project: Path, db: Path, reference: dict, redone: int) -> None:
    """The weights of an uninterrupted run, every fraction, one MLflow run FINISHED (any other KILLED, none
    RUNNING) whose loss history repeats at most `redone` steps (the work since the last checkpoint)."""
    got = weights(project / "models" / "mlm" / "encoder" / "weights.pt")
    assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in reference)
    assert sorted(p.name for p in (project / "models" / "mlm" / "fractions").iterdir()) == ["050", "100"]
    metrics = json.loads((project / "metrics" / "pretrain" / "mlm.json").read_text())
    assert metrics["steps"] == 8 and not (project / "checkpoints" / "mlm").exists()
    client = mlflow_client(db)
    experiment = client.get_experiment_by_name("electralab-tiny").experiment_id
    runs = client.search_runs([experiment], "tags.run = 'mlm'")
    assert sorted(r.info.status for r in runs if r.info.status != "KILLED") == ["FINISHED"], [
        (r.info.status, r.data.tags.get("error")) for r in runs
    ]
    finished = next(r for r in runs if r.info.status == "FINISHED")
    assert metrics["mlflow_run_id"] == finished.info.run_id  # the report finds the workspace's run by it
    steps = [m.step for m in client.get_metric_history(finished.info.run_id, "loss")]
    assert sorted(set(steps)) == list(range(1, 9)) and len(steps) - 8 <= redone, steps
    assert finished.data.metrics["final_flops_per_step"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "point, nth, redone",
    [
        ("ckpt-partial", 1, 8),  # inside the first checkpoint write: nothing to resume, the MLflow run is closed
        ("ckpt-partial", 2, 2),  # half of the step-4 checkpoint written
        ("ckpt-synced", 2, 2),  # the step-4 checkpoint complete on disk, not yet trusted
        ("ckpt-rotating", 3, 2),  # state.pt moved to state.prev.pt, the step-6 one not yet in its place
        ("ckpt-saved", 2, 0),  # right after the step-4 checkpoint, before the 50% fraction of the same step
        ("outputs-written", 1, 0),  # the end: models/mlm in place, MLflow not told
        ("finishing", 1, 0),  # artifacts uploaded, the run not yet FINISHED
        ("finished", 1, 0),  # FINISHED, no metrics file yet
        ("metrics-written", 1, 0),  # everything written, the scratch not yet cleared
    ],
)
def test_a_kill_at_any_point_loses_at_most_the_steps_since_the_last_checkpoint(
    project, reference, tmp_path, point, nth, redone
):
    db = tmp_path / "mlflow.db"
    kill_then_rerun(project, mlflow_env(project, db), point, nth)
    assert_resumed_exactly(project, db, reference, redone)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage", [truncate, flip_a_byte])
def test_a_corrupt_latest_checkpoint_is_set_aside_and_the_previous_one_resumed(project, reference, tmp_path, damage):
    db = tmp_path / "mlflow.db"
    rerun = kill_then_rerun(
        project,
        mlflow_env(project, db),
        "ckpt-saved",
        3,  # state.pt: step 6, prev: step 4
        corrupt=lambda scratch: damage(scratch / "state.pt"),
    )
    # named as the stage's command line gives the checkpoints directory (dvc.yaml: checkpoints/<run>)
    assert "warning: checkpoint checkpoints/mlm/state.pt is corrupt" in rerun.stderr
    aside = list((project / "checkpoints").glob("mlm.state.pt.corrupt-*"))
    assert len(aside) == 1 and aside[0].name in rerun.stderr
    assert_resumed_exactly(project, db, reference, redone=2)  # steps 5 and 6 again


@pytest.mark.slow
def test_two_stages_starting_together_on_a_fresh_mlflow_store(project, tmp_path):
    """MLflow's schema creation races when two processes create one SQLite store (`duplicate column name`):
    the store is created once, under a lock, before a stage uses it."""
    env = mlflow_env(project, tmp_path / "fresh" / "mlflow.db")
    (tmp_path / "fresh").mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, *stage_args("pretrain", name)],
            cwd=project,
            env=env,
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for name in ("mlm", "electra")
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for e in errors]
    client = mlflow_client(tmp_path / "fresh" / "mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("electralab-tiny").experiment_id])
    assert sorted(r.data.tags["run"] for r in runs) == ["electra", "mlm"]


@pytest.mark.slow
def test_a_second_direct_run_of_a_running_stage_stops_at_once_naming_the_first(project, tmp_path):
    env = mlflow_env(project, tmp_path / "mlflow.db")
    longer = yaml.safe_load((project / "params.yaml").read_text())
    longer["presets"]["tiny"]["pretrain"]["steps"] = 200
    (tmp_path / "longer.yaml").write_text(yaml.safe_dump(longer))
    shutil.rmtree(project / "checkpoints", ignore_errors=True)
    longer_run = [sys.executable, *stage_args("pretrain", "mlm"), "--params", str(tmp_path / "longer.yaml")]
    first = subprocess.Popen(
        longer_run, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (project / "checkpoints" / "mlm" / "mlflow.json").exists():  # training: inside the lock
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-3000:]
        time.sleep(0.05)
    second = run([sys.executable, *stage_args("pretrain", "mlm")], project, env)
    assert first.poll() is None, "the first run ended before the second started: make it longer"
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"error: stage pretrain@mlm is already running in {project} (pid {first.pid}" in second.stderr
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    assert json.loads((project / "metrics" / "pretrain" / "mlm.json").read_text())["steps"] == 200


@pytest.mark.slow
def test_a_stop_signal_checkpoints_the_step_says_so_in_one_line_and_the_next_run_goes_on_from_it(project, tmp_path):
    """kill/timeout/systemd (SIGTERM) mid-run: the step finishes and is checkpointed, one line and no traceback,
    the shell's status for the signal, the MLflow run KILLED; the same command goes on from there in the same
    MLflow run, no step logged twice. (Ctrl-C's SIGINT takes the same path: tests/test_cli.py.)"""
    signum = signal.SIGTERM
    env = mlflow_env(project, tmp_path / "mlflow.db")
    longer = yaml.safe_load((project / "params.yaml").read_text())
    longer["presets"]["tiny"]["pretrain"].update(steps=40, checkpoint_every=4)
    (tmp_path / "longer.yaml").write_text(yaml.safe_dump(longer))
    for path in ("checkpoints", "models", "metrics"):
        shutil.rmtree(project / path, ignore_errors=True)
    command = [sys.executable, *stage_args("pretrain", "mlm"), "--params", str(tmp_path / "longer.yaml")]
    first = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (project / "checkpoints" / "mlm" / "state.pt").exists():  # steps under way
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-3000:]
        time.sleep(0.02)
    first.send_signal(signum)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 128 + signum and "Traceback" not in stderr, stderr[-3000:]
    name = signal.Signals(signum).name
    stopped = re.search(
        rf"^pretrain@mlm: stopped by {name} at step (\d+) of 40; run the same command again", stderr, re.M
    )
    assert stopped, stderr[-3000:]
    step = int(stopped.group(1))
    assert 0 < step < 40 and f"paused at step {step} of 40" in stdout
    assert torch.load(project / "checkpoints" / "mlm" / "state.pt", weights_only=False)["step"] == step
    assert not (project / "models" / "mlm").exists() and not (project / "metrics" / "pretrain" / "mlm.json").exists()
    killed = only_run(mlflow_client(tmp_path / "mlflow.db"), "mlm")
    assert killed.info.status == "KILLED" and killed.data.tags["paused_at_step"] == str(step)

    again = run(command, project, env)
    assert again.returncode == 0, again.stderr[-3000:]
    finished = only_run(mlflow_client(tmp_path / "mlflow.db"), "mlm")
    assert finished.info.run_id == killed.info.run_id and finished.info.status == "FINISHED"
    steps = [m.step for m in mlflow_client(tmp_path / "mlflow.db").get_metric_history(finished.info.run_id, "loss")]
    assert sorted(steps) == list(range(1, 41))


def test_a_stale_checkpoint_of_another_configuration_is_not_resumed(project, tmp_path, capsys):
    """A checkpoint of other params is ignored; one written before the code gained a key resumes while that key
    stands at its default (what the code did before), and only then."""
    from electralab.runs import resolve_run
    from electralab.train.checkpoint import Checkpointer

    params = load_params(project / "params.yaml")
    run_a = resolve_run(params, "mlm")
    run_b = dataclasses.replace(run_a, pretrain=dataclasses.replace(run_a.pretrain, lr=0.5))
    scratch = tmp_path / "scratch"

    def checkpointer(run, drop: str | None = None) -> Checkpointer:
        config = run.as_params()
        if drop:  # as the code wrote it before `model.<drop>` existed
            config["model"] = {k: v for k, v in config["model"].items() if k != drop}
        return Checkpointer(scratch, (config, "shards-hash", 1), (run.param_defaults(), None, None))

    checkpointer(run_a).save({"step": 3})
    assert checkpointer(run_a).load()["step"] == 3
    assert checkpointer(run_b).load() is None
    checkpointer(run_a, drop="alibi_heads").save({"step": 4})
    assert checkpointer(run_a).load()["step"] == 4
    assert "written before model.alibi_heads existed, now at the default" in capsys.readouterr().err
    steep = dataclasses.replace(run_a, model=dataclasses.replace(run_a.model, relative_init="alibi", alibi_heads=8))
    assert checkpointer(steep).load() is None  # the new key away from its default: another configuration
    assert checkpointer(run_b, drop="alibi_heads").load() is None  # a new key does not excuse a changed one
    checkpointer(run_a).save({"step": 5})
    assert checkpointer(run_a, drop="alibi_heads").load() is None  # a key the code lost: not resumed


def test_only_keys_added_at_their_defaults_are_excused():
    from electralab.train.checkpoint import added_at_defaults

    saved, defaults = {"model": {"a": 1, "exits": [1, 2, 3, 4]}}, {"model": {"a": 0, "b": None, "exits": [4, 6, 8]}}
    assert added_at_defaults(saved, {"model": {"a": 1, "b": None, "exits": [1, 2, 3, 4]}}, defaults) == ["model.b"]
    assert added_at_defaults(saved, {"model": {"a": 1, "b": 2, "exits": [1, 2, 3, 4]}}, defaults) is None
    assert added_at_defaults(saved, {"model": {"a": 1, "exits": [1, 2, 3, 5]}}, defaults) is None  # every item
    assert added_at_defaults([saved, "data"], [saved, "other data"], [defaults, None]) is None


def test_only_the_newest_corrupt_checkpoint_is_kept_aside(tmp_path, capsys):
    """Each restart that finds a corrupt state.pt sets it aside; the one set aside before is removed, so whole
    checkpoints do not pile up beside the scratch directory."""
    from electralab.train.checkpoint import Checkpointer

    scratch, previous = tmp_path / "checkpoints" / "mlm", None
    for attempt in range(3):
        checkpointer = Checkpointer(scratch, ("fp",))
        checkpointer.save({"step": 2 * attempt + 1})
        checkpointer.save({"step": 2 * attempt + 2})
        flip_a_byte(scratch / "state.pt")
        assert Checkpointer(scratch, ("fp",)).load()["step"] == 2 * attempt + 1  # the one before it
        aside = list((tmp_path / "checkpoints").glob("mlm.*.corrupt-*"))
        assert len(aside) == 1, aside
        if previous is not None:
            assert f"(replacing {previous.name})" in capsys.readouterr().err
        previous = aside[0]


@pytest.fixture()
def small_disk(tmp_path):
    """A real file system of 64 KiB (tmpfs): too small for an encoder. Mounting needs root, as CI's machine has."""
    where = tmp_path / "small-disk"
    where.mkdir()
    mounted = os.geteuid() == 0 and (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True).returncode
        == 0
    )
    if not mounted:
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN)")
    yield where
    # lazily: torch's file of the failed write stays open until the error that holds its frames is collected
    subprocess.run(["umount", "--lazy", str(where)], check=True)


def test_a_full_disk_at_the_outputs_fails_the_mlflow_run_keeps_the_checkpoint_and_leaves_nothing_partial(
    project, tmp_path, tracking, small_disk
):
    """The error after the loop: torch.save reports a full disk as a RuntimeError with no errno; it reaches the
    stage as the OSError(ENOSPC) it is, naming the file. With room again the same call finishes the same run."""
    import errno

    from electralab.io import disk_full
    from electralab.train.loop import pretrain

    run_ = resolved(project, "electra")
    shards, scratch = project / "data" / "shards", tmp_path / "scratch"
    with pytest.raises(OSError) as raised:
        pretrain(run_, shards, small_disk / "electra", scratch, show_progress=False)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename.startswith(str(small_disk / ".tmp-electra-"))
    assert disk_full(raised.value).startswith(f"no space left on the device writing {small_disk}/.tmp-electra-")
    assert list(small_disk.iterdir()) == []  # nothing partial
    assert torch.load(scratch / "state.pt", weights_only=False)["step"] == run_.pretrain.steps  # the work is kept
    client = mlflow_client(tracking)
    failed = only_run(client, "electra")
    assert failed.info.status == "FAILED" and "No space left on device" in failed.data.tags["error"]

    summary = pretrain(run_, shards, tmp_path / "out", scratch, show_progress=False)
    finished = only_run(client, "electra")  # the same run, resumed from the final checkpoint, now FINISHED
    assert finished.info.run_id == failed.info.run_id and finished.info.status == "FINISHED"
    assert summary["steps"] == run_.pretrain.steps and (tmp_path / "out" / "encoder").is_dir()


# ---- in-process: NaN guard, accumulation, config errors ---------------------------------------------


@pytest.fixture()
def tracking(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path / "mlflow.db"


def resolved(project: Path, name: str, model: dict | None = None, **pretrain):
    from electralab.runs import resolve_run

    run_ = resolve_run(load_params(project / "params.yaml"), name)
    return dataclasses.replace(
        run_,
        pretrain=dataclasses.replace(run_.pretrain, **pretrain),
        model=dataclasses.replace(run_.model, **(model or {})),
    )


def test_nan_loss_stops_with_the_step_keeps_the_checkpoint_and_fails_the_mlflow_run(
    project, tmp_path, tracking, monkeypatch
):
    import electralab.train.loop as loop

    real_build = loop.build_objective

    def build_with_fault(*args, **kwargs):
        objective = real_build(*args, **kwargs)
        calls = {"n": 0}

        def poison(module, inputs, output):  # the 5th training forward (step 5) returns a NaN loss
            calls["n"] += module.training  # the held-out diagnostics run in eval mode
            if calls["n"] == 5 and module.training:
                output.loss = output.loss * float("nan")
            return output

        objective.register_forward_hook(poison)
        return objective

    monkeypatch.setattr(loop, "build_objective", build_with_fault)
    run_ = resolved(project, "electra", checkpoint_every=2)
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    with pytest.raises(TrainingDiverged, match=r"run electra: loss=nan .* at step 5; the last good checkpoint"):
        loop.pretrain(run_, project / "data" / "shards", out, scratch, show_progress=False)
    assert torch.load(scratch / "state.pt", weights_only=False)["step"] == 4  # the last good one survives
    assert not out.exists()
    client = mlflow_client(tracking)
    failed = client.search_runs([client.get_experiment_by_name("electralab-tiny").experiment_id])[0]
    assert failed.info.status == "FAILED" and "TrainingDiverged" in failed.data.tags["error"]


@pytest.mark.compile
def test_the_static_step_compiled_whole_trains_and_says_so_in_mlflow(project, tmp_path, tracking, monkeypatch):
    """pretrain.step=static: the loop calls the objective's static form under torch.compile(fullgraph=True) (a
    graph break would fail it), counts its FLOPs in one eager step, and tags the run with the step it took. The
    backend is aot_eager (forward and backward traced, no code generated): inductor's C++ build of the same graph
    takes two minutes of this test's CPU and is torch's, not the loop's (bench/train_step.py --static runs it)."""
    import electralab.train.loop as loop
    from electralab.train.loop import pretrain

    compile_ = torch.compile
    monkeypatch.setattr(
        loop.torch, "compile", lambda model, fullgraph, mode: compile_(model, fullgraph=fullgraph, backend="aot_eager")
    )

    run_ = resolved(project, "electra", steps=3, log_every=1, step="static")
    summary = pretrain(run_, project / "data" / "shards", tmp_path / "out", tmp_path / "scratch", show_progress=False)
    assert summary["steps"] == 3 and summary["flops_per_step"] > 0 and math.isfinite(summary["loss"])
    client = mlflow_client(tracking)
    run = client.search_runs([client.get_experiment_by_name("electralab-tiny").experiment_id])[0]
    assert run.data.tags["training_step"] == "static" and run.info.status == "FINISHED"
    assert (tmp_path / "out" / "encoder").is_dir()


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"step": "cuda_graphs"}, "step='cuda_graphs' replays the step on a GPU: it needs use_gpu=true"),
        ({"step": "static", "short_seq_len": 32}, "step='static' with short_seq_len=32: the short rows kept vary"),
        ({"step": "static", "num_workers": 2}, "step='static' with num_workers=2: the compiled step is not measured"),
    ],
)
def test_a_step_the_loop_cannot_take_is_a_config_error_naming_the_keys(settings, message):
    from electralab.config import PretrainConfig, build

    with pytest.raises(ConfigError, match=re.escape(f"presets.tiny.pretrain.{message}")):
        build(PretrainConfig, settings, "presets.tiny.pretrain")


@pytest.mark.parametrize("minutes, saved", [(0.0, [6]), (1e-9, [1, 2, 3, 4, 5, 6])])
def test_checkpoint_minutes_adds_a_checkpoint_once_that_much_time_has_passed(
    project, tmp_path, tracking, monkeypatch, minutes, saved
):
    """checkpoint_every alone (0 minutes) saves at the end of these 6 steps; a wall-clock limit that every step
    exceeds saves after each one."""
    from electralab.train import loop
    from electralab.train.checkpoint import Checkpointer

    steps = []
    real_save = Checkpointer.save
    monkeypatch.setattr(Checkpointer, "save", lambda self, state: (steps.append(state["step"]), real_save(self, state)))
    run_ = resolved(project, "mlm", steps=6, checkpoint_every=1000, checkpoint_minutes=minutes)
    loop.pretrain(run_, project / "data" / "shards", tmp_path / "out", tmp_path / "scratch", show_progress=False)
    assert steps == saved


def test_the_bar_shows_the_loss_and_pace_from_the_first_step(project, tmp_path, tracking, monkeypatch, capsys):
    """Off a terminal the bar prints plain lines; before the first logged window (log_every) they already carry
    the step's loss and tokens/s, so a long run shows signs of life at once."""
    from electralab.data.progress import PROGRESS_EVERY_ENV
    from electralab.train.loop import pretrain

    monkeypatch.setenv(PROGRESS_EVERY_ENV, "0")
    run_ = resolved(project, "mlm", steps=6, log_every=1000)
    pretrain(run_, project / "data" / "shards", tmp_path / "out", tmp_path / "scratch", show_progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if "pretrain mlm" in line and "/6" in line]
    early = [line for line in lines if re.search(r"\b[1-5]/6\b", line)]
    assert early and all(re.search(r"loss=\d+\.\d{3}, tok_s=\d+", line) for line in early), lines


def loss_curve(db: Path, run_name: str) -> list[float]:
    client = mlflow_client(db)
    r = client.search_runs(
        [client.get_experiment_by_name("electralab-tiny").experiment_id],
        f"tags.run = '{run_name}'",
        order_by=["attributes.start_time DESC"],
    )[0]
    return [m.value for m in sorted(client.get_metric_history(r.info.run_id, "loss"), key=lambda m: m.step)]


def test_gradient_accumulation_matches_one_big_micro_batch(project, tmp_path, tracking):
    from electralab.train.loop import pretrain

    no_dropout = {"dropout": 0.0, "attention_dropout": 0.0}
    curves = []
    for micro in (8, 4, 2):  # fp32: bf16 rounds the two summation orders differently
        run_ = resolved(
            project, "mlm", model=no_dropout, batch_size=8, micro_batch_size=micro, steps=5, precision="fp32"
        )
        pretrain(
            run_, project / "data" / "shards", tmp_path / f"out{micro}", tmp_path / f"s{micro}", show_progress=False
        )
        curves.append(loss_curve(tracking, "mlm"))
    for curve in curves[1:]:
        assert curve == pytest.approx(curves[0], rel=1e-5)


def test_batch_not_divisible_and_gpu_without_cuda_are_config_errors(project, tmp_path, tracking):
    from electralab.train.loop import pretrain

    with pytest.raises(ConfigError, match="batch_size=6 is not a multiple of micro_batch_size=4"):
        pretrain(resolved(project, "mlm", batch_size=6), project / "data" / "shards", tmp_path / "o", tmp_path / "s")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="use_gpu=true but no CUDA device"):
            pretrain(
                resolved(project, "mlm", use_gpu=True), project / "data" / "shards", tmp_path / "o", tmp_path / "s"
            )


def test_short_rows_for_the_first_share_of_the_steps_then_full_rows(project, tmp_path, tracking, monkeypatch):
    import electralab.train.loop as loop

    real_build, widths = loop.build_objective, []

    def recording(*args, **kwargs):
        objective = real_build(*args, **kwargs)
        objective.register_forward_pre_hook(
            lambda module, inputs: widths.append(inputs[0].input_ids.shape[1]) if module.training else None
        )
        return objective

    monkeypatch.setattr(loop, "build_objective", recording)
    seq_len = int(json.loads((project / "data" / "shards" / "manifest.json").read_text())["seq_len"])
    run_ = resolved(project, "electra", steps=4, short_seq_len=seq_len // 4, short_seq_until=0.5)
    loop.pretrain(run_, project / "data" / "shards", tmp_path / "out", tmp_path / "s", show_progress=False)
    assert widths == [seq_len // 4] * 2 + [seq_len] * 2
    with pytest.raises(ConfigError, match=f"short_seq_len=7 must divide the shards' seq_len {seq_len}"):
        loop.pretrain(
            resolved(project, "electra", short_seq_len=7, short_seq_until=0.5),
            project / "data" / "shards",
            tmp_path / "o",
            tmp_path / "s2",
        )


def test_stage_with_an_unknown_run_exits_2_naming_it(project):
    proc = run([sys.executable, *stage_args("pretrain", "no_such_run")], project, env_for(project, mirror_root()))
    assert proc.returncode == 2
    assert "error: run 'no_such_run' is not in params.yaml runs" in proc.stderr and "Traceback" not in proc.stderr


# ---- Ray Train: two workers against one -------------------------------------------------------------


@pytest.mark.slow
def test_two_ray_workers_follow_the_loss_curve_of_one(project, tmp_path, tracking):
    import ray

    from electralab.train.distributed import pretrain_on_ray
    from electralab.train.loop import pretrain

    no_dropout = {"dropout": 0.0, "attention_dropout": 0.0}
    one = resolved(project, "mlm", model=no_dropout, batch_size=8, micro_batch_size=8, steps=6, precision="fp32")
    pretrain(one, project / "data" / "shards", tmp_path / "one", tmp_path / "s1", show_progress=False)
    single = loss_curve(tracking, "mlm")

    two = resolved(
        project, "mlm", model=no_dropout, batch_size=8, micro_batch_size=4, steps=6, num_workers=2, precision="fp32"
    )
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"]}},
        )
        summary = pretrain_on_ray(
            two, project / "data" / "shards", tmp_path / "two", tmp_path / "s2", num_workers=2, use_gpu=False
        )
    finally:
        ray.shutdown()
    double = loss_curve(tracking, "mlm")
    assert summary["devices"] == 2 and summary["steps"] == 6
    # Each rank reads its half of every global batch (same samples, same masks): same curve.
    assert double == pytest.approx(single, rel=1e-4)
    a, b = weights(tmp_path / "one" / "encoder" / "weights.pt"), weights(tmp_path / "two" / "encoder" / "weights.pt")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


# ---- the registry ---------------------------------------------------------------------


# Runs stage commands in one interpreter, as DVC would run them one by one: the stage script's own entry point
# (run_stage with the command's arguments), so that 59 runs do not pay 59 interpreter starts and imports.
STAGE_RUNNER = """
import importlib.util, json, sys
from electralab.cli import run_stage
spec = importlib.util.spec_from_file_location("pretrain_stage", "stages/pretrain.py")
stage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stage)
for argv in json.loads(sys.argv[1]):
    print(f"Running stage 'pretrain@{argv[0]}'", flush=True)
    run_stage("pretrain", stage.main, argv=argv, arguments=stage.arguments)
"""


@pytest.mark.slow
def test_every_run_of_the_registry_trains_in_dvcs_order(tmp_path):
    """Every pretrain@<run> stage of the tiny registry (every table and figure row and the controls) is in DVC's
    graph with an edge from the run it reads, and its command trains on MINI sizes in that order, each with finite
    losses. DVC runs the data stages; the 59 stage commands run in one process (DVC's own run of dependent stages,
    with MLflow: test_dvc_repro_pretrain_with_dependent_runs_and_mlflow)."""
    import graphlib

    project = copy_project(tmp_path / "project")
    shrink(project, steps=4, checkpoint_every=2)
    env = mlflow_env(project, tmp_path / "mlflow.db")
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"], [str(BIN / "dvc"), "repro", "-q", "shards"]):
        proc = run(cmd, project, env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    registry = yaml.safe_load((project / "params.yaml").read_text())["runs"]
    runs = list(registry)
    assert len(runs) >= 50
    dag = run([str(BIN / "dvc"), "dag", "--dot"], project, env)
    assert dag.returncode == 0, dag.stderr
    edges = re.findall(r'"pretrain@([^"]+)" -> "pretrain@([^"]+)"', dag.stdout)
    assert sorted(set(re.findall(r'"pretrain@([^"]+)";', dag.stdout))) == sorted(runs)
    readers = {name: Path(r["reads"]).stem for name, r in registry.items() if r["reads"] != "data/shards"}
    assert readers == {"cocolm_converged_aux": "cocolm_ablation", "amos_final_mix": "amos_ablation"}
    assert sorted(edges) == sorted((producer, reader) for reader, producer in readers.items())
    # DVC's order: each run after the runs its graph says it reads
    order = list(graphlib.TopologicalSorter({name: {p for p, r in edges if r == name} for name in runs}).static_order())
    commands = [stage_args("pretrain", name)[1:] for name in order]
    proc = subprocess.run(
        [sys.executable, "-c", STAGE_RUNNER, json.dumps(commands)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.findall(r"Running stage 'pretrain@([^']+)'", proc.stdout) == order
    for name in runs:
        metrics = json.loads((project / "metrics" / "pretrain" / f"{name}.json").read_text())
        if registry[name]["method"] == "none":  # the controls: the initial encoder, no step taken
            assert metrics["steps"] == 0 and "loss" not in metrics, metrics
        else:
            assert math.isfinite(metrics["loss"]) and metrics["steps"] == 4, (name, metrics)
        assert (project / "models" / name / "encoder" / "weights.pt").is_file(), name


@pytest.mark.parametrize("preset", ["tiny", "small", "base", "base_pp", "large_pp"])
def test_every_run_of_the_registry_resolves_and_builds(preset):
    from electralab.config import parse_params
    from electralab.objectives import build_objective
    from electralab.runs import resolve_all

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["preset"] = preset
    runs = resolve_all(parse_params(raw))
    assert len(runs) == len(raw["runs"]) >= 50
    for name, r in runs.items():
        if r.spec.reads != "data/shards":  # built on another run's output: that file exists only later
            continue
        with torch.device("meta"):  # shapes only: base-size models cost no memory here
            objective = build_objective(r.method, r.settings, r.model, r.generators, 32768)
        assert objective.main_encoder().cfg.layers >= r.model.layers, name


def test_the_control_exports_the_encoder_every_method_starts_from_and_takes_no_step(project, tmp_path, tracking):
    """runs.control (method none): the main encoder exactly as initialised, no training, a finished MLflow run."""
    from electralab.export import load_encoder
    from electralab.model.encoder import Encoder, make_token_embedding
    from electralab.train.loop import pretrain

    control = resolved(project, "control")
    summary = pretrain(
        control, project / "data" / "shards", tmp_path / "out", tmp_path / "scratch", show_progress=False
    )
    assert summary["steps"] == 0 and summary["tokens"] == 0 and "loss" not in summary
    exported = load_encoder(tmp_path / "out" / "encoder")
    torch.manual_seed(control.seed)  # what every objective's main encoder is at step 0
    vocab = exported.embeddings.tokens.num_embeddings
    fresh = Encoder(
        control.model, make_token_embedding(vocab, control.model.embedding, control.model.initializer_range)
    )
    assert exported.cfg == control.model
    assert all(torch.equal(a, b) for a, b in zip(exported.state_dict().values(), fresh.state_dict().values()))
    mlm = resolved(project, "mlm")
    torch.manual_seed(mlm.seed)
    from electralab.objectives import build_objective

    start = build_objective("mlm", mlm.settings, mlm.model, mlm.generators, vocab).main_encoder()
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(), fresh.state_dict().values()))
    run_ = only_run(mlflow_client(tracking), "control")
    assert run_.info.status == "FINISHED" and run_.data.tags["method"] == "none"


def test_mlflows_metric_writer_is_buffered_unless_the_user_set_it_and_a_flush_writes_every_metric(
    tmp_path, monkeypatch
):
    """MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1 (docs/operations.md): the writer wakes when a run ends instead of
    waiting out its queue poll; metrics logged asynchronously are all in the store after the flush."""
    import mlflow

    from electralab import tracking

    before = mlflow.get_tracking_uri()
    try:
        monkeypatch.setenv("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "5")
        tracking.mlflow_module(f"sqlite:///{tmp_path / 'user.db'}")
        assert os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] == "5"  # the user's own setting wins
        monkeypatch.delenv("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS")
        tracking.mlflow_module(f"sqlite:///{tmp_path / 'mlflow.db'}")
        assert os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] == "1"
        with mlflow.start_run() as active:
            for step in range(1, 21):
                mlflow.log_metrics({"loss": 1.0 / step}, step=step, synchronous=False)
            mlflow.flush_async_logging()
        history = mlflow.MlflowClient().get_metric_history(active.info.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(1, 21))
    finally:
        mlflow.set_tracking_uri(before)
