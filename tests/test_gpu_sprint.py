"""The GPU sprint (bench/gpu_sprint.py) on the CPU with MINI sizes: the commands the GPU machine runs, in a
project copy, where mlflow, Ray, DVC, Prefect and datasets cannot be imported (that machine has none of
them). `prep` packs the data; `run` commands of a few seconds each continue from the state that the previous
one handed back through its $OUT (restored here as a session does), one of them on a "fresh machine"
(unpacked data, models and checkpoints removed), until the results table; then the run log goes into MLflow
and the small preset's report is built from it. Also: the loop's deadline (pause, exact resume), a method
longer than a command (paused, resumed from its checkpoint), the trial pool against in-process trials, the
run log's reading rules, the plan's packing."""

from __future__ import annotations

import csv
import io
import json
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, mirror_root
from project_helpers import MINI, copy_project, env_for, shrink

sys.path.insert(0, str(ROOT / "bench"))

from sprint.plan import fits, make_plan, pretrain_seconds  # noqa: E402

from electralab.errors import ConfigError, DataError  # noqa: E402
from electralab.runlog import FileClient, Metric, Param, import_runlog, read_run, read_runs  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # the in-process tests: tiny tensors, one thread
# What the GPU machine lacks of the project's dependencies (docs/scaling.md; /work/.library/device/KINDS.md).
ABSENT = ("mlflow", "ray", "dvc", "prefect", "datasets", "fastapi", "psycopg2")
PIECE, GRACE = 15, 5  # CPU seconds: the dry run's "10-minute" commands
EXIT_SLACK = 3  # interpreter exit and the last state packing, after the budget's end


def make_sprint_project(tmp: Path) -> Path:
    project = copy_project(tmp)
    shutil.copytree(ROOT / "bench", project / "bench", ignore=shutil.ignore_patterns("out", "__pycache__"))
    shrink(project, "small")  # the small preset at MINI sizes, on the CPU (use_gpu false)
    return project


def without_servers(env: dict, tmp: Path) -> dict:
    """`env` where importing any of ABSENT fails, as on the GPU machine (a sitecustomize run at start-up),
    and the sprint keeps its budgets in CPU seconds: on this shared CPU the wall clock measures the load of
    the neighbours (a command starved of CPU would spend its seconds importing torch)."""
    block = tmp / "absent"
    block.mkdir(exist_ok=True)
    (block / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in ABSENT))
    return {
        **env,
        "PYTHONPATH": f"{block}:{env['PYTHONPATH']}",
        "ELECTRALAB_SPRINT_CLOCK": "cpu",
        "OMP_NUM_THREADS": "1",
    }


def sprint_cmd(*args: str) -> list[str]:
    return [sys.executable, "bench/gpu_sprint.py", *args]


def run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """project_helpers.run with a longer safety net: the budgets here are CPU seconds, and a command starved
    of CPU on a shared machine can take many times that in wall-clock time."""
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def commands(project: Path, env: dict, tmp: Path, fresh_after: int | None, limit: int = 6) -> list[SimpleNamespace]:
    """`run` commands until the sprint is done: each one's state comes back through its $OUT only. Each
    command's CPU seconds are measured: the budgets are CPU seconds here (ELECTRALAB_SPRINT_CLOCK=cpu)."""
    calls = []
    for i in range(1, limit + 1):
        out = tmp / f"out{i}"
        began = child_cpu()
        proc = run(sprint_cmd("run", "--out", str(out)), project, env)
        calls.append(SimpleNamespace(proc=proc, cpu=child_cpu() - began, out=out))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        shutil.rmtree(project / ".sprint" / "state")
        restored = run(sprint_cmd("restore", str(out)), project, env)
        assert restored.returncode == 0, restored.stderr
        if i == fresh_after:
            shutil.rmtree(project / ".sprint" / "work")
        if "sprint: all done" in proc.stdout:
            return calls
    raise AssertionError(f"not done after {limit} commands:\n{calls[-1].proc.stdout[-3000:]}")


@pytest.fixture(scope="module")
def sprint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sprint")
    project = make_sprint_project(tmp / "project")
    env = env_for(project, mirror_root())
    prep = run(
        sprint_cmd(
            "prep",
            "--pieces",
            "3",
            "--piece-seconds",
            str(PIECE),
            "--grace-seconds",
            str(GRACE),
            "--probe-seconds",
            "0.2",
            "--workers",
            "1",
        ),
        project,
        env,
    )
    assert prep.returncode == 0, prep.stdout[-2000:] + prep.stderr[-2000:]
    calls = commands(project, without_servers(env, tmp), tmp, fresh_after=1)
    return SimpleNamespace(
        project=project, env=env, calls=calls, prep=prep, state=project / ".sprint" / "state", tmp=tmp
    )


@pytest.mark.slow
def test_dry_run_goes_in_commands_inside_their_limits(sprint):
    # No bound on the total: how many commands the work takes follows the CPU seconds a step costs, which a loaded
    # machine inflates (3 commands, 40 s, on one CPU; 4, 58-62 s, on a slower one); each command's own budget is the
    # contract, and `commands` fails a sprint that is not done after its limit of them.
    calls = sprint.calls
    assert len(calls) >= 2, "everything fitted one command: nothing was resumed"
    for i, call in enumerate(calls, 1):
        assert call.cpu < PIECE + GRACE + EXIT_SLACK, f"command {i} took {call.cpu:.1f} s"
        assert "tracking: file" in call.proc.stdout  # mlflow absent: the run log
    print(
        f"dry run: {len(calls)} commands, {sum(c.cpu for c in calls):.1f} s of CPU in all "
        f"({', '.join(f'{c.cpu:.1f}' for c in calls)})"
    )  # the figure docs/scaling.md quotes (pytest -rP)
    first = calls[0].proc.stdout
    # Throughput first, then the control, then the plan, and only then any method's pretraining.
    assert first.index("throughput") < first.index("control: the encoder as initialised") < first.index("plan:")
    assert "pretraining (" not in first[: first.index("plan:")]
    assert "unpacked the carried data (a fresh machine)" in calls[1].proc.stdout
    for call in calls[1:]:
        assert "control: the encoder as initialised" not in call.proc.stdout  # done once, never again
    pieces = json.loads((sprint.state / "pieces.json").read_text())
    assert [p["piece"] for p in pieces] == list(range(1, len(calls) + 1)) and pieces[-1]["stopped"] == "done"
    assert "prep: what travels:" in sprint.prep.stdout
    # Every command writes the table of what is fine-tuned so far: the first one's has the control at least.
    assert "results so far" in first and (calls[0].out / "results.csv").is_file()


@pytest.mark.slow
def test_results_table_has_every_run_the_control_and_the_published_numbers(sprint):
    out = sprint.calls[-1].out
    lines = list(csv.DictReader((out / "results.csv").open()))
    ours = {x["run"]: x for x in lines if x["source"] == "ours"}
    assert list(ours) == ["control", "electra", "mlm", "cocolm"]  # the defaults: ELECTRA first
    plan = json.loads((sprint.state / "plan.json").read_text())
    for name, line in ours.items():
        assert line["status"] == "done"
        for task in ("stsb", "mrpc", "avg"):  # the default tasks
            float(line[task]), float(line[f"{task}_min"]), float(line[f"{task}_max"])
        assert float(line["avg_min"]) <= float(line["avg_max"])
        if name != "control":  # the planned steps ran, each method the same planned seconds to a step
            assert int(line["steps"]) == plan["runs"][name]["steps"]
            assert abs(float(line["planned_seconds"]) - plan["pretrain_seconds"]) <= plan["runs"][name]["step_s"]
    assert int(ours["control"]["steps"]) == 0
    published = {x["row"]: float(x["avg"]) for x in lines if x["source"] == "published"}
    assert sorted(published.values()) == [74.1, 75.1, 78.52, 80.36, 80.7]
    md = (out / "results.md").read_text()
    assert "74.10" in md and "75.10" in md and "electra − mlm" in md and "cocolm − control" in md


@pytest.mark.slow
def test_the_run_log_holds_every_run_with_mlflow_absent(sprint):
    runs = read_runs(sprint.state / "runlog")
    pretrain = {r.name: r for r in runs if r.tags["stage"] == "pretrain"}
    assert set(pretrain) == {"control", "mlm", "electra", "cocolm"}
    assert all(r.status == "FINISHED" and r.experiment == "electralab-small" for r in pretrain.values())
    assert {m[0] for m in pretrain["electra"].metrics} >= {"loss", "rtd_acc_replaced", "tokens_per_s", "final_steps"}
    parents = [r for r in runs if r.tags["stage"] == "finetune"]
    assert len(parents) == 4 * 2 and all(r.status == "FINISHED" for r in parents)
    # a median per parent, unless the task's metrics were never numbers (a MINI model predicting one STS-B
    # score has no correlation): then the parent names them
    assert all(any(m[0].startswith("median_") for m in r.metrics) or r.tags.get("failed_metrics") for r in parents)
    children = [r for r in runs if r.tags["stage"] == "finetune-trial"]
    assert len(children) == 4 * 2 * 2  # runs x tasks x (1 configuration x 2 seeds)
    ids = {r.run_id for r in parents}
    assert all(r.tags["mlflow.parentRunId"] in ids for r in children)


@pytest.mark.slow
def test_import_into_mlflow_then_the_report_shows_the_sprint(sprint, tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = sprint_cmd("import", "--tracking-uri", uri, "--report", str(tmp_path / "report"))
    proc = run(args, sprint.project, sprint.env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("electralab-small").experiment_id
    logged = read_runs(sprint.state / "runlog")
    imported = client.search_runs([experiment], max_results=1000)
    assert len(imported) == len(logged)
    electra = client.search_runs([experiment], "tags.stage = 'pretrain' and tags.run = 'electra'")[0]
    original = next(r for r in logged if r.name == "electra" and r.tags["stage"] == "pretrain")
    assert electra.info.status == "FINISHED" and electra.data.params == original.params
    history = client.get_metric_history(electra.info.run_id, "loss")
    assert [m.step for m in history] == [m[3] for m in original.metrics if m[0] == "loss"]
    child = client.search_runs([experiment], "tags.stage = 'finetune-trial' and tags.run = 'mlm'")[0]
    parent = client.get_run(child.data.tags["mlflow.parentRunId"])  # mapped to the imported parent
    assert parent.data.tags["stage"] == "finetune" and parent.data.tags["run"] == "mlm"
    mlm = client.search_runs([experiment], "tags.stage = 'pretrain' and tags.run = 'mlm'")[0]
    assert parent.data.tags["pretrain_run_id"] == mlm.info.run_id  # the log's id mapped to the imported run
    # The report reads the imported runs like any others: the sprint's tasks filled, the others empty.
    table = list(csv.DictReader((tmp_path / "report" / "tables" / "coco-lm_table1.csv").open()))
    cell = {(x["run"], x["column"]): x["ours"] for x in table}
    sprint_results = {x["run"]: x for x in csv.DictReader((sprint.calls[-1].out / "results.csv").open())}
    for run_name in ("mlm", "electra", "cocolm", "control"):
        assert float(cell[(run_name, "MRPC")]) == pytest.approx(float(sprint_results[run_name]["mrpc"]))
        assert cell[(run_name, "MNLI-m")] == ""
    again = run(sprint_cmd("import", "--tracking-uri", uri), sprint.project, sprint.env)
    assert f"0 run(s) imported, 0 replaced (they had grown), {len(logged)} unchanged" in again.stdout


@pytest.mark.slow
def test_a_method_longer_than_a_command_pauses_and_resumes_from_its_checkpoint(tmp_path):
    project = make_sprint_project(tmp_path / "project")
    env = env_for(project, mirror_root())
    prep = run(
        sprint_cmd(
            "prep",
            "--methods",
            "mlm",
            "--tasks",
            "rte,stsb",
            "--pieces",
            "2",
            "--piece-seconds",
            "20",
            "--grace-seconds",
            "2",
            "--probe-seconds",
            "0.2",
            "--workers",
            "1",
            "--pretrain-seconds",
            "24",
        ),
        project,
        env,
    )
    assert prep.returncode == 0, prep.stderr[-2000:]
    calls = commands(project, without_servers(env, tmp_path), tmp_path, fresh_after=None, limit=8)
    text = "".join(c.proc.stdout for c in calls)
    assert "mlm paused at step" in text and "mlm: resuming from its checkpoint" in text
    plan = json.loads((project / ".sprint" / "state" / "plan.json").read_text())
    mlm = [r for r in read_runs(project / ".sprint" / "state" / "runlog") if r.name == "mlm"]
    assert len(mlm) == 1 and mlm[0].status == "FINISHED"  # one run, paused and continued
    steps = [m[3] for m in mlm[0].metrics if m[0] == "loss"]
    assert steps == sorted(set(steps)) and steps[-1] == plan["runs"]["mlm"]["steps"]


# --- the loop's stop: pause with a checkpoint, resume exactly --------------------------------------------


def test_pretrain_stop_pauses_with_a_checkpoint_and_resumes_exactly(shards_dir, vocab_dir, tmp_path, monkeypatch):
    from sprint.config import SprintConfig, sprint_params

    from electralab.config import load_params, parse_params
    from electralab.runs import resolve_run
    from electralab.train.loop import pretrain

    monkeypatch.setenv("ELECTRALAB_TRACKING", "file")
    monkeypatch.setenv("ELECTRALAB_RUNLOG", str(tmp_path / "runlog"))
    params = load_params(ROOT / "params.yaml")
    mini = {
        "steps": 6,
        "batch_size": 4,
        "micro_batch_size": 4,
        "warmup_steps": 1,
        "log_every": 1,
        "checkpoint_every": 100,
        "guard": {"enabled": False},
    }
    raw = sprint_params(params, SprintConfig(preset="tiny"), mini).raw
    raw["presets"]["tiny"]["model"].update(MINI["model"])
    run_ = resolve_run(parse_params(raw), "electra")
    reference = pretrain(run_, shards_dir, tmp_path / "a", tmp_path / "sa", vocab_dir=vocab_dir, show_progress=False)
    paused = pretrain(
        run_, shards_dir, tmp_path / "b", tmp_path / "sb", vocab_dir=vocab_dir, show_progress=False, stop=lambda _: True
    )
    assert paused["paused"] and paused["steps"] == 1
    assert (tmp_path / "sb" / "state.pt").is_file() and not (tmp_path / "b").exists()
    (logged,) = [r for r in read_runs(tmp_path / "runlog") if r.status != "FINISHED"]
    assert logged.status == "KILLED" and logged.tags["paused_at_step"] == "1"
    resumed = pretrain(run_, shards_dir, tmp_path / "b", tmp_path / "sb", vocab_dir=vocab_dir, show_progress=False)
    assert resumed["steps"] == reference["steps"] == 6
    a = torch.load(tmp_path / "a" / "encoder" / "weights.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "encoder" / "weights.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run differs from the uninterrupted one"
    again = read_run(tmp_path / "runlog" / f"{logged.run_id}.jsonl")  # the same run, continued to the end
    assert again.status == "FINISHED" and [m[3] for m in again.metrics if m[0] == "loss"] == [1, 2, 3, 4, 5, 6]


# --- the trial pool (the GPU's executor) gives what in-process trials give ------------------------------


def test_trial_pool_matches_in_process_trials(shards_dir, vocab_dir, tmp_path, monkeypatch):
    from sprint.config import SprintConfig, sprint_params
    from sprint.trials import Finetuner

    from electralab.config import load_params, parse_params
    from electralab.runs import resolve_run
    from electralab.train.loop import pretrain

    monkeypatch.setenv("ELECTRALAB_TRACKING", "file")
    monkeypatch.setenv("ELECTRALAB_RUNLOG", str(tmp_path / "runlog"))
    cfg = SprintConfig(preset="tiny", tasks=("rte", "stsb"), seeds=2)
    raw = sprint_params(load_params(ROOT / "params.yaml"), cfg).raw
    tiny = raw["presets"]["tiny"]
    tiny["model"].update(MINI["model"])
    tiny["finetune"].update({**MINI["finetune"], "tasks": list(cfg.tasks), "seeds": [1, 2]})
    params = parse_params(raw)
    control = resolve_run(params, "control")
    pretrain(control, shards_dir, tmp_path / "control", tmp_path / "scratch", vocab_dir=vocab_dir, show_progress=False)
    results = {}
    for workers in (1, 2):
        tuner = Finetuner(params.active.finetune, mirror_root(), vocab_dir, torch.device("cpu"), workers)
        try:
            far = time.monotonic() + 3600
            assert tuner.run(control, tmp_path / "control" / "encoder", tmp_path / f"w{workers}", far, far)
        finally:
            tuner.close()
        results[workers] = json.loads((tmp_path / f"w{workers}" / "summary.json").read_text())["tasks"]
    assert results[1] == results[2]
    # Past the soft deadline nothing starts: the run is not done and no trial is stored.
    tuner = Finetuner(params.active.finetune, mirror_root(), vocab_dir, torch.device("cpu"), 2)
    assert not tuner.run(control, tmp_path / "control" / "encoder", tmp_path / "late", 0.0, time.monotonic() + 60)
    tuner.close()
    assert not (tmp_path / "late" / "results").exists()


# --- the run log ------------------------------------------------------------------------------------------


def test_run_log_records_fold_into_a_run_and_a_torn_last_line_is_skipped(tmp_path):
    client = FileClient(tmp_path)
    run_id = client.create_run("electralab-tiny", run_name="mlm", tags={"stage": "pretrain"}).info.run_id
    client.log_batch(
        run_id,
        metrics=[Metric("loss", 2.5, 1000, 1), Metric("loss", 2.0, 2000, 2)],
        params=[Param("pretrain.steps", "2")],
    )
    client.set_tags(run_id, {"precision": "bf16"})
    client.log_text(run_id, "a,b\n1,2\n", "medians.csv")
    small, large = tmp_path / "small.json", tmp_path / "large.bin"
    small.write_text("{}")
    large.write_bytes(b"\0" * (300 << 10))
    client.log_artifact(run_id, small)
    client.log_artifact(run_id, large, "encoder")
    client.set_terminated(run_id, "FINISHED")
    path = tmp_path / f"{run_id}.jsonl"
    with open(path, "a") as f:
        f.write('{"op": "status", "sta')  # a process killed while writing its last line
    run_ = read_run(path)
    assert (run_.name, run_.status, run_.params, run_.tags["precision"]) == (
        "mlm",
        "FINISHED",
        {"pretrain.steps": "2"},
        "bf16",
    )
    assert [(m[0], m[1], m[3]) for m in run_.metrics] == [("loss", 2.5, 1), ("loss", 2.0, 2)]
    copied = {a["path"]: a for a in run_.artifacts}
    assert copied["medians.csv"]["text"] == "a,b\n1,2\n"
    assert (tmp_path / copied["small.json"]["copy"]).read_text() == "{}"  # small: copied into the log
    assert "copy" not in copied["encoder/large.bin"] and copied["encoder/large.bin"]["bytes"] == 300 << 10  # named
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    with pytest.raises(DataError, match=rf"{run_id}.jsonl:2: not a JSON record"):
        read_run(path)


def test_import_maps_parents_marks_unclosed_runs_killed_and_names_missing_artifacts(tmp_path):
    from mlflow import MlflowClient

    log = tmp_path / "runlog"
    client = FileClient(log)
    parent = client.create_run("electralab-tiny", run_name="p", tags={"stage": "finetune"}).info.run_id
    child = client.create_run("electralab-tiny", run_name="c", tags={"mlflow.parentRunId": parent}).info.run_id
    client.set_terminated(parent)
    client.set_terminated(child)
    gone = tmp_path / "weights.pt"
    gone.write_bytes(b"\0" * (300 << 10))
    open_run = client.create_run("electralab-tiny", run_name="open").info.run_id
    client.log_artifact(open_run, gone, "encoder")
    gone.unlink()  # named in the log, not on this machine
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    counts = import_runlog(log, uri)
    assert counts == {"imported": 3, "unchanged": 0, "replaced": 0, "artifacts_not_found": 1}
    mlflow = MlflowClient(uri)
    experiment = mlflow.get_experiment_by_name("electralab-tiny").experiment_id
    by_name = {r.info.run_name: r for r in mlflow.search_runs([experiment])}
    assert by_name["c"].data.tags["mlflow.parentRunId"] == by_name["p"].info.run_id
    assert (
        by_name["open"].info.status == "KILLED" and "artifact_not_found.encoder/weights.pt" in by_name["open"].data.tags
    )
    client.set_terminated(open_run, "FINISHED")  # the run grew after the import: replaced, not duplicated
    assert import_runlog(log, uri) == {"imported": 0, "unchanged": 2, "replaced": 1, "artifacts_not_found": 1}
    assert len(mlflow.search_runs([experiment])) == 3


# --- the plan ---------------------------------------------------------------------------------------------


def test_the_default_sprint_plans_within_a_sessions_15_device_minutes_and_a_longer_one_is_refused():
    from sprint.config import SprintConfig, load_config
    from sprint.plan import device_seconds

    cfg = SprintConfig()
    assert device_seconds(cfg.pieces, cfg.piece_seconds, cfg.grace_seconds) <= 15 * 60
    assert cfg.methods[0] == "electra" and set(cfg.tasks) == {"stsb", "mrpc"}  # the first command's result
    with pytest.raises(
        ConfigError, match=r"pieces=3 of piece_seconds=420 \+ grace_seconds=60 plan 26\.5 device-minutes"
    ):
        load_config({"pieces": 3, "piece_seconds": 420, "grace_seconds": 60})


def test_plan_packs_whole_units_and_gives_equal_seconds():
    assert fits([100, 100], 2, 100) and not fits([100, 99], 2, 100)
    # Three units of P + 50 s into what is left now (80 s) and two commands of 300 s: one unit cannot go
    # into 80 s unless P <= 30; two per command need P <= 100; so the best is P = 100 (0 + 2 + 2 units >= 3).
    assert pretrain_seconds([80, 300, 300], 3, 50) == pytest.approx(100, abs=0.1)
    assert pretrain_seconds([80, 300], 3, 50) == pytest.approx(50, abs=0.1)  # 0 + 3 units of 100 s
    assert pretrain_seconds([40, 40], 3, 50) == 0.0  # nothing fits
    probes = {
        "mlm": {"step_s": 0.02, "tokens_per_step": 100, "tokens_per_s": 5000, "flops_per_step": 1e9},
        "electra": {"step_s": 0.05, "tokens_per_step": 100, "tokens_per_s": 2000, "flops_per_step": 2e9},
    }
    plan = make_plan(probes, ("mlm", "electra"), 40.0, 10.0, 200.0, 1, 400.0, None, piece_now=1)
    assert plan["pretrain_seconds"] == pytest.approx(150, abs=0.1)  # one unit of P + 50 s in 200 s, one in 400 s
    assert plan["runs"]["mlm"]["steps"] == int(plan["pretrain_seconds"] / 0.02)
    assert plan["runs"]["electra"]["steps"] == int(plan["pretrain_seconds"] / 0.05)
    assert [s["piece"] for s in plan["schedule"]] == [1, 2] and not plan["notes"]
    forced = make_plan(probes, ("mlm", "electra"), 40.0, 10.0, 200.0, 1, 400.0, 500.0)
    assert forced["pretrain_seconds"] == 500.0 and "resumes from its checkpoint" in forced["notes"][0]


@pytest.mark.parametrize("member", ["../outside.txt", "/abs.txt", "link"])
def test_a_tarball_member_outside_the_target_or_not_a_plain_file_is_refused(tmp_path, member):
    """The carry and the returned state are unpacked by `sprint.extract`, on every Python 3.11 (Debian's 3.11.2
    has no tarfile data filter): a member that would land outside the target, or a link, stops it by name."""
    from sprint import extract

    archive = tmp_path / "state.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(DataError, match=f"member {member!r}"):
        extract(archive, "r:gz", target)
    assert list(target.iterdir()) == [] and not (tmp_path / "outside.txt").exists()


def test_extract_unpacks_plain_files_and_folders(tmp_path):
    from sprint import extract

    source = tmp_path / "state"
    (source / "runlog").mkdir(parents=True)
    (source / "runlog" / "a.jsonl").write_text("{}\n")
    with tarfile.open(tmp_path / "s.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="state")
    extract(tmp_path / "s.tar.gz", "r:gz", tmp_path / "out")
    assert (tmp_path / "out" / "state" / "runlog" / "a.jsonl").read_text() == "{}\n"
