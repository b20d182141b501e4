"""finetune@<run> end to end on a tiny checkpoint: real GLUE/SQuAD files, the run's sentencepiece
vocabulary, Ray Tune trials and an MLflow SQLite store; then retries, an interrupted grid and its resume,
and the trial loop itself (it learns; dynamic padding changes nothing but speed)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, mirror_root
from project_helpers import load_stage, stage_args
from report_helpers import tiny_encoder

from electralab.config import SquadSettings, TrialResources, load_params
from electralab.errors import TrialsFailed
from electralab.export import save_encoder
from electralab.io import write_json
from electralab.runs import resolve_run
from electralab.tables import REGISTRY

TASK_METRICS = {
    "mnli": ("accuracy", "accuracy_mm"),
    "qnli": ("accuracy",),
    "sst2": ("accuracy",),
    "cola": ("mcc",),
    "rte": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearman"),
    "squad2": ("exact", "f1", "has_ans_exact", "has_ans_f1", "no_ans_exact", "no_ans_f1"),
}
TINY_GRID = {"lr": [1.0e-3, 3.0e-4], "epochs": [2], "batch_size": [8], "warmup": [0.1]}
# The tiny preset's finetune section, shrunk: 16 examples per split, 64-token sequences, every task.
FINETUNE = {
    "tasks": ["mnli", "qqp", *(t for t in TASK_METRICS if t != "mnli")],  # QQP: no dev split offline
    "grids": {"glue_small": TINY_GRID, "glue_large": TINY_GRID, "squad2": {**TINY_GRID, "epochs": [1]}},
    "max_seq_len": 64,
    "max_train_examples": 16,
    "task_epochs": {},
    "max_eval_examples": 16,
    "eval_batch_size": 32,
    "squad": {"doc_stride": 32, "max_query_len": 16, "max_train_questions": 8, "max_eval_questions": 8},
    "efficiency_tasks": ["mnli"],  # MNLI on the checkpoints, as the papers' figures (tiny adds STS-B)
    "few_shot_fractions": [0.1],
    "resources": {"cpus": 1, "gpus": 0, "local_cpus": 2},
    "max_failures": 1,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory, vocab_dir) -> Path:
    """models/<run>/ as pretrain@<run> writes it: encoder/ (with the vocabulary), summary.json and the
    fraction checkpoints 050 and 100 with their hours."""
    from electralab.data.vocab import Tokenizer

    root = tmp_path_factory.mktemp("models") / "run"
    vocab = Tokenizer(vocab_dir).vocab_size
    save_encoder(tiny_encoder(vocab, 0), root / "encoder", vocab_dir)
    write_json(
        root / "summary.json",
        {"wall_hours": 0.5, "device_hours": 0.5, "steps": 100, "mlflow_run_id": "the-pretraining-run"},
    )
    for pct, seed in (("050", 1), ("100", 0)):
        save_encoder(tiny_encoder(vocab, seed), root / "fractions" / pct / "encoder")
        write_json(
            root / "fractions" / pct / "meta.json",
            {
                "fraction": int(pct) / 100,
                "step": int(pct),
                "wall_hours": int(pct) / 200,
                "device_hours": int(pct) / 100,
            },
        )
    return root


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs ~2 s of migrations)."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("electralab-tiny", artifact_location=(root / "artifacts").as_uri())
    return uri


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from electralab.finetune.tuning import init_ray

    init_ray(TrialResources(local_cpus=2))
    yield
    ray.shutdown()


def make_project(tmp_path: Path, models: Path, run: str, **finetune) -> Path:
    """A project root: params.yaml (tiny preset, FINETUNE + overrides) and models/<run> -> the fixture."""
    root = tmp_path / "project"
    (root / "models").mkdir(parents=True)
    (root / "models" / run).symlink_to(models, target_is_directory=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["preset"] = "tiny"
    tiny = params["presets"]["tiny"]["finetune"]
    for key, value in {**FINETUNE, **finetune}.items():
        tiny[key] = {**tiny.get(key, {}), **value} if key in ("squad", "resources") else value
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    return root


@pytest.fixture
def env(monkeypatch, mlflow_uri):
    def use(root: Path) -> None:
        monkeypatch.setenv("DVC_ROOT", str(root))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        monkeypatch.setenv("ELECTRALAB_DATA", str(mirror_root()))  # absolute, before the chdir
        monkeypatch.chdir(root)  # dvc.yaml's paths are relative to the project root

    return use


def argv(root: Path, run: str) -> list[str]:
    """The stage's arguments as dvc.yaml gives them (its paths: relative to root, the working directory)."""
    return ["--params", str(root / "params.yaml"), *stage_args("finetune", run)[1:]]


def search(uri: str, run: str, stage: str):
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(
        experiment_names=["electralab-tiny"], filter_string=f"tags.stage = '{stage}' and tags.run = '{run}'"
    )


# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_stage_fine_tunes_every_task_and_tracks_parents_and_children(
    tmp_path, models, env, mlflow_uri, local_ray, monkeypatch, capsys
):
    from mlflow import MlflowClient

    from electralab.report.build import fetch_results

    root = make_project(tmp_path, models, "cocolm")
    # cocolm is in coco-lm/fig3 (MNLI on checkpoints); put it in coco-lm/fig7 too (label fractions, which the
    # registry asks of cocolm_ablation): both extras in one stage
    fig7 = REGISTRY["coco-lm/fig7"]
    with_cocolm = {**fig7.series, "test": {"cocolm": "cocolm"}}
    monkeypatch.setitem(REGISTRY, fig7.key, dataclasses.replace(fig7, series=with_cocolm))
    env(root)
    stage = load_stage("finetune")
    stage.run_stage("finetune", stage.main, argv(root, "cocolm"), stage.arguments)

    # metrics/finetune/<run>.json: medians per task, missing QQP (no dev split in the mirror) with its reason
    out = json.loads((root / "metrics" / "finetune" / "cocolm.json").read_text())
    for task, metrics in TASK_METRICS.items():
        assert set(out[task]) == set(metrics), task
    assert "no dev split" in out["missing"]["qqp"] and "qqp" not in out and "glue_avg" not in out
    assert set(out["checkpoints"]) == {"050"} and set(out["checkpoints"]["050"]["mnli"]) == {"accuracy", "accuracy_mm"}
    assert set(out["label_fractions"]) == {"0.1"}
    assert out["trials"] == 8 * 2 * 5 + 5 + 5
    assert not (root / "checkpoints" / "finetune" / "cocolm").exists()  # scratch cleared on success
    # The timing line gives the trials' own time, which bench/finetune_overhead.py subtracts from the wall
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("finetune cocolm: 90 trials"))
    assert float(re.search(r"the trials' own time ([\d.]+) s\)", line).group(1)) > 0

    parents = search(mlflow_uri, "cocolm", "finetune")
    children = search(mlflow_uri, "cocolm", "finetune-trial")
    client = MlflowClient(mlflow_uri)
    assert (parents["status"] == "FINISHED").all() and (children["status"] == "FINISHED").all()
    key = parents["tags.task"] + "@" + parents["tags.checkpoint"] + "@" + parents["tags.label_fraction"]
    assert sorted(key) == sorted(
        [f"{t}@final@1.0" for t in [*TASK_METRICS, "qqp"]] + ["mnli@050@1.0", "mnli@final@0.1"]
    )
    for _, parent in parents.iterrows():
        tags = {k.removeprefix("tags."): v for k, v in parent.items() if k.startswith("tags.")}
        assert {tags["run"], tags["method"], tags["preset"], tags["seed"]} == {"cocolm", "tiny", "1,2,3,4,5"}
        assert "coco-lm/fig7" in tags["tables"] and tags["git_sha"]
        if tags["task"] == "qqp":
            assert "no dev split" in tags["missing"] and np.isnan(parent.get("metrics.median_accuracy", np.nan))
            continue
        task, mine = tags["task"], children[children["tags.mlflow.parentRunId"] == parent["run_id"]]
        extra = tags["checkpoint"] != "final" or tags["label_fraction"] != "1.0"
        assert len(mine) == (5 if extra else 10), key
        assert tags["main_metric"] == {"cola": "mcc", "stsb": "spearman", "squad2": "f1"}.get(task, "accuracy")
        for metric in TASK_METRICS[task]:
            for stat in ("median", "std", "min", "max"):
                # a constant prediction has no correlation: not logged (NaN), never a number
                assert np.isfinite(parent.get(f"metrics.{stat}_{metric}", np.nan)) or metric in (
                    "pearson",
                    "spearman",
                ), (key, metric)
        assert parent["metrics.num_train_examples"] > 0 and parent["metrics.num_eval_examples"] > 0
        # the median is the median of the selected configuration's children, at their last evaluation
        selected = mine[mine["tags.config"] == parent["params.selected.config"]]
        main = tags["main_metric"]
        assert len(selected) == 5
        column = f"metrics.{main}"
        seeds = selected[column] if column in selected else np.full(len(selected), np.nan)
        assert parent.get(f"metrics.median_{main}", np.nan) == pytest.approx(np.median(seeds), nan_ok=True)
        medians = client.download_artifacts(parent["run_id"], "medians.csv", str(tmp_path / parent["run_id"]))
        assert len(Path(medians).read_text().strip().splitlines()) == 1 + (1 if extra else 2)
    fraction = parents[parents["tags.checkpoint"] == "050"].iloc[0]
    assert (fraction["metrics.wall_hours"], fraction["metrics.device_hours"]) == (0.25, 0.5)  # from its meta.json
    few = parents[parents["tags.label_fraction"] == "0.1"].iloc[0]
    assert few["metrics.num_train_examples"] == 16 and few["metrics.num_train_available"] == 480  # 10% of 480, capped

    child = children.iloc[0]
    assert {"params.lr", "params.epochs", "params.batch_size", "params.warmup", "params.seed"} <= set(children.columns)
    epochs = int(child["params.epochs"])
    assert [m.step for m in client.get_metric_history(child["run_id"], "train_loss")] == list(range(1, epochs + 1))
    metric = TASK_METRICS[child["tags.task"]][0]  # tiny: eval_every_epoch false
    assert [m.step for m in client.get_metric_history(child["run_id"], metric)] == [epochs]

    # the report reads these parents as they are
    cells = fetch_results("tiny", mlflow_uri).cells
    cells = cells[cells["run"] == "cocolm"]
    assert set(cells[cells["task"] == "mnli"]["checkpoint"]) == {"final", "050"}
    assert set(cells[cells["task"] == "mnli"]["label_fraction"]) == {1.0, 0.1}
    assert set(cells[(cells["task"] == "squad2")]["metric"]) >= {"exact", "f1"}


@pytest.mark.slow
def test_the_first_look_fine_tunes_its_runs_on_its_tasks_and_reports_their_claim_alone(
    tmp_path, models, env, local_ray, monkeypatch
):
    """The first_look stage: the control and ELECTRA fine-tuned with `presets.tiny.first_look` (here MRPC, whose
    accuracy a random encoder has; STS-B's correlation of its constant predictions is none), a report built from
    those fine-tunings and the pretraining runs metrics/pretrain names, the claim in README.md."""
    from mlflow import MlflowClient
    from report_helpers import PROVENANCE_TAGS, _run

    from electralab.report.build import fetch_results

    root = make_project(tmp_path, models, "control")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["presets"]["tiny"]["first_look"] = {"tasks": ["mrpc"], "seeds": [1, 2, 3]}
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    # a store of its own: the module's store counts the electra trials of other tests
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(mlflow_uri)
    experiment = client.create_experiment("electralab-tiny", artifact_location=(tmp_path / "artifacts").as_uri())
    for run, method in (("control", "none"), ("electra", "electra")):
        tags = {"run": run, "method": method, "tables": "", "preset": "tiny", "stage": "pretrain", "seed": "1"}
        rid = _run(client, experiment, run, tags | PROVENANCE_TAGS, params={"pretrain.steps": 100})
        write_json(root / "metrics" / "pretrain" / f"{run}.json", {"mlflow_run_id": rid})
        model = root / "models" / run  # as pretrain@<run> leaves it: its summary names the same MLflow run
        model.unlink(missing_ok=True)
        shutil.copytree(models, model)
        write_json(model / "summary.json", {**json.loads((models / "summary.json").read_text()), "mlflow_run_id": rid})
    env(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    stage = load_stage("first_look")
    argv = ["--params", str(root / "params.yaml"), *stage_args("first_look")[1:]]
    stage.run_stage("first_look", stage.main, argv, stage.arguments)

    out = root / "first_look"
    for run in ("control", "electra"):
        result = json.loads((out / "finetune" / f"{run}.json").read_text())
        assert set(result) & set(TASK_METRICS) == {"mrpc"} and "checkpoints" not in result  # no figures' extras
        parents = search(mlflow_uri, run, "finetune")
        assert list(parents["tags.task"]) == ["mrpc"] and set(parents["tags.seed"]) == {"1,2,3"}
        assert set(parents["tags.purpose"]) == {"first_look"}
    assert fetch_results("tiny", mlflow_uri).cells.empty  # a report of the latest runs skips the first look's
    readme = (out / "README.md").read_text()
    claim = next(line for line in readme.splitlines() if line.startswith("| ELECTRA"))
    assert "> No pretraining (control) | MRPC |" in claim and claim.endswith(" within noise |"), claim  # one encoder
    assert (out / "report" / "index.html").is_file() and "What it cannot" in readme
    assert not (root / "metrics" / "finetune").exists()  # the finetune@ stages' files: not the first look's


def test_stage_errors_are_one_line_and_leave_no_metrics(tmp_path, env, capsys):
    root = tmp_path / "project"
    root.mkdir()
    (root / "params.yaml").write_text((ROOT / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    env(root)
    stage = load_stage("finetune")
    for run, message in (("nope", "run 'nope' is not in"), ("mlm", "no exported encoder; run the pretraining first")):
        with pytest.raises(SystemExit) as exit_info:
            stage.run_stage("finetune", stage.main, argv(root, run), stage.arguments)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (root / "metrics").exists()


def test_a_binary_glue_dev_file_is_a_named_error(tmp_path, models, env, capsys, monkeypatch):
    root = make_project(tmp_path, models, "mlm", tasks=["rte"], efficiency_tasks=["rte"], few_shot_tasks=["rte"])
    env(root)
    rte = tmp_path / "mirror" / "glue" / "RTE"
    rte.mkdir(parents=True)
    shutil.copy(mirror_root() / "glue" / "RTE" / "train.tsv", rte)
    (rte / "dev.tsv").write_bytes(bytes(range(256)) * 8)  # not text at all
    monkeypatch.setenv("ELECTRALAB_DATA", str(tmp_path / "mirror"))
    stage = load_stage("finetune")
    with pytest.raises(SystemExit) as exit_info:
        stage.run_stage("finetune", stage.main, argv(root, "mlm"), stage.arguments)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert f"error: {rte / 'dev.tsv'}: not UTF-8 text at byte 128" in err
    assert not (root / "metrics").exists()


def test_a_requested_task_without_its_dev_file_fails_the_stage_unless_allowed(
    tmp_path, models, env, capsys, monkeypatch, local_ray, mlflow_uri
):
    """A missing GLUE dev file used to exit 0 with the task recorded as missing: `dvc repro` and the flow
    reported success. Now the stage stops before any trial, naming the file and the flag that allows it."""
    root = make_project(tmp_path, models, "mlm", tasks=["rte"], efficiency_tasks=["rte"], few_shot_tasks=["rte"])
    env(root)
    rte = tmp_path / "mirror" / "glue" / "RTE"
    rte.mkdir(parents=True)
    shutil.copy(mirror_root() / "glue" / "RTE" / "train.tsv", rte)  # no dev.tsv
    monkeypatch.setenv("ELECTRALAB_DATA", str(tmp_path / "mirror"))
    stage = load_stage("finetune")
    args = argv(root, "mlm")
    with pytest.raises(SystemExit) as exit_info:
        stage.run_stage("finetune", stage.main, args, stage.arguments)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert (
        "requested task(s) cannot run (rte: no dev split: glue/RTE/dev.tsv is not in the ELECTRALAB_DATA mirror" in err
    )
    assert "set ELECTRALAB_ALLOW_MISSING=1" in err and not (root / "metrics").exists()

    monkeypatch.setenv("ELECTRALAB_ALLOW_MISSING", "1")
    stage.run_stage("finetune", stage.main, args, stage.arguments)
    out = json.loads((root / "metrics" / "finetune" / "mlm.json").read_text())
    assert "glue/RTE/dev.tsv" in out["missing"]["rte"] and out["trials"] == 0
    # which MLflow runs these are, and of which pretraining run (the report reads only those)
    assert out["mlflow"]["pretrain_run_id"] == "the-pretraining-run"
    parents = search(mlflow_uri, "mlm", "finetune").set_index("run_id")
    assert set(out["mlflow"]["parents"]) == set(out["missing"]) and set(out["mlflow"]["parents"].values()) <= set(
        parents.index
    )
    assert (parents.loc[list(out["mlflow"]["parents"].values()), "tags.pretrain_run_id"] == "the-pretraining-run").all()


def test_a_killed_grids_parent_is_resumed_or_closed_killed_not_left_running(tmp_path, models, env, mlflow_uri):
    """A SIGKILLed stage leaves its parents RUNNING: the rerun continues the one whose inputs are the same and
    closes the one whose inputs changed as KILLED."""
    from mlflow import MlflowClient

    from electralab.finetune.grid import Group
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.track import FinetuneTracker

    root = make_project(tmp_path, models, "mlm")
    env(root)
    run = resolve_run(load_params(root / "params.yaml"), "mlm")
    state = tmp_path / "parents.json"
    killed = FinetuneTracker(run, (1, 2), state)
    same, changed = (killed.parent(Group(t), TASKS[t], f"{t}-inputs") for t in ("rte", "stsb"))
    rerun = FinetuneTracker(run, (1, 2), state)
    assert rerun.parent(Group("rte"), TASKS["rte"], "rte-inputs") == same
    replacement = rerun.parent(Group("stsb"), TASKS["stsb"], "stsb-inputs-changed")
    client = MlflowClient(mlflow_uri)
    assert replacement != changed and client.get_run(changed).info.status == "KILLED"
    assert "inputs changed" in client.get_run(changed).data.tags["error"]
    assert {client.get_run(r).info.status for r in (same, replacement)} == {"RUNNING"}


@pytest.mark.slow
def test_ctrl_c_stops_the_stage_in_one_line_its_parents_killed_and_the_rerun_keeps_the_finished_trials(
    tmp_path, models
):
    """SIGINT (Ctrl-C) once a trial has finished: the stage's own handler, not Tune's (which would end the grid
    early and report it as failed trials), so one line, status 130, every open parent KILLED, no metrics; the
    same command again trains only the trials that had not finished."""
    from mlflow import MlflowClient

    root = make_project(tmp_path, models, "mlm", tasks=["rte"], few_shot_tasks=[], efficiency_tasks=[])
    db = tmp_path / "mlflow.db"
    env = {
        **os.environ,
        "DVC_ROOT": str(root),
        "MLFLOW_TRACKING_URI": f"sqlite:///{db}",
        "ELECTRALAB_DATA": str(mirror_root()),
        "PYTHONPATH": str(ROOT / "src"),
    }
    command = [sys.executable, str(ROOT / "stages" / "finetune.py"), *argv(root, "mlm")]
    stage = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = root / "checkpoints" / "finetune" / "mlm" / "results"
    client = MlflowClient(f"sqlite:///{db}")

    def logged(stage_tag: str) -> list:
        experiment = client.get_experiment_by_name("electralab-tiny") if db.exists() else None
        return client.search_runs([experiment.experiment_id], f"tags.stage = '{stage_tag}'") if experiment else []

    deadline = time.monotonic() + 300
    while not logged("finetune-trial"):  # a trial has finished and is in MLflow, under its open parent
        assert stage.poll() is None and time.monotonic() < deadline, stage.stderr.read()[-3000:]
        time.sleep(0.2)
    stage.send_signal(signal.SIGINT)
    stdout, stderr = stage.communicate(timeout=120)
    assert stage.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert "finetune@mlm: stopped by SIGINT; run the same command again (`dvc repro`, `make repro`)" in stderr
    assert not (root / "metrics").exists()
    assert {r.info.status for r in logged("finetune")} == {"KILLED"}
    kept = len(list(results.rglob("*.json")))
    earlier = json.loads((results.parent / "seconds.json").read_text())["seconds"]  # saved at each finished trial
    assert earlier > 0

    again = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = re.search(r"finetune mlm: (\d+) trials \((\d+) from an earlier run\)", again.stdout)
    assert resumed and int(resumed.group(1)) == 10 and int(resumed.group(2)) >= kept >= 1, again.stdout[-3000:]
    # The stage's time counts both commands (make repro's time left reads it), not only the second one's.
    assert f"(earlier commands {earlier:.0f} s, data " in again.stdout, again.stdout[-3000:]
    phase = float(re.search(r"phase 1 (\d+) s", again.stdout).group(1))
    assert json.loads((root / "metrics" / "finetune" / "mlm.json").read_text())["seconds"] >= earlier + phase


def test_the_stage_clock_counts_earlier_commands_on_the_same_grid_only(tmp_path):
    """metrics' `seconds` of a grid stopped and run again: the earlier commands' time, kept at each finished
    trial, plus this one's; not the time of a grid of other inputs (its trials stale), nor of an unreadable file."""
    from electralab.finetune.protocol import StageClock

    path = tmp_path / "seconds.json"
    first = StageClock(path)
    first.of_grid("a")
    first.started -= 100.0  # this command has run 100 s
    first.save()
    same, other = StageClock(path), StageClock(path)
    same.of_grid("a")
    other.of_grid("b")
    assert same.earlier == pytest.approx(100.0, abs=0.2) and same.seconds() >= same.earlier
    assert other.earlier == 0.0
    path.write_text("{not json")
    assert StageClock(path).earlier == 0.0


def test_a_grid_resumed_after_the_library_changed_starts_over(tmp_path, models, env, monkeypatch):
    """Kept trial results carry the library's source digest: after a code change they are stale (the
    ResultStore test shows a stale result is never reused)."""
    from electralab.data.vocab import Tokenizer
    from electralab.finetune import protocol

    root = make_project(tmp_path, models, "mlm", tasks=["mnli", "rte"])
    env(root)
    params = load_params(root / "params.yaml")
    run, cfg = resolve_run(params, "mlm"), params.active.finetune
    the_plan = protocol.plan(run, cfg, models)
    data = protocol.load_data(the_plan, cfg, Tokenizer(models / "encoder"), mirror_root())

    def fingerprints() -> dict:
        scratch = tmp_path / "scratch"
        clock = protocol.StageClock(scratch / "seconds.json")
        return protocol.GridRun(run, cfg, the_plan, data, scratch, clock, show_progress=False).fingerprints

    before = fingerprints()
    assert fingerprints() == before and len(before) == 3  # MNLI, RTE, MNLI on checkpoint 050
    monkeypatch.setattr(protocol, "source_digest", lambda: "an edited library")
    after = fingerprints()
    assert after.keys() == before.keys() and all(after[g] != before[g] for g in before)


# --------------------------------------------------------------------------------------------------
# Retries, interruption, resume


def recording_trainable(record_dir: str, fail_always: str = "", fail_once: str = ""):
    """The real trainable, recording every attempt in record_dir; trials whose key contains every
    "*"-separated part of `fail_always` always raise, the one whose key is `fail_once` raises on its
    first attempt."""

    def fn(config, **kwargs):
        from pathlib import Path as P

        from electralab.finetune.grid import TrialSpec
        from electralab.finetune.tuning import trainable

        (key,) = [TrialSpec.from_dict(trial).key for trial in config["trials"]]  # one grid trial a Tune trial
        attempt = P(record_dir) / key.replace("/", "|")
        attempts = int(attempt.read_text()) + 1 if attempt.exists() else 1
        attempt.write_text(str(attempts))
        if (fail_always and all(part in key for part in fail_always.split("*"))) or (
            key == fail_once and attempts == 1
        ):
            raise RuntimeError(f"injected failure of {key}")
        return trainable(config, **kwargs)

    return fn


def attempts(record_dir: Path) -> dict[str, int]:
    return {p.name.replace("|", "/"): int(p.read_text()) for p in record_dir.iterdir()}


@pytest.mark.slow
def test_failed_trials_are_retried_and_an_interrupted_grid_resumes(tmp_path, models, env, monkeypatch, local_ray):
    from electralab.finetune import tuning
    from electralab.finetune.protocol import finetune

    root = make_project(tmp_path, models, "mlm", tasks=["mnli", "rte"])  # mlm: + MNLI on checkpoint 050
    env(root)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # a store of its own: it counts every parent of `mlm`
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    params = load_params(root / "params.yaml")
    run, cfg = resolve_run(params, "mlm"), params.active.finetune
    scratch = root / "checkpoints" / "finetune" / "mlm"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    flaky = "mnli/lr=0.001,epochs=2,bs=8,warmup=0.1/seed=1"
    handed = []  # the trials in the order the stage hands them to Tune, phase by phase
    real_run_trials = tuning.run_trials

    def recording_run_trials(specs, *args, **kwargs):
        handed.append([spec.key for spec in specs])
        return real_run_trials(specs, *args, **kwargs)

    monkeypatch.setattr(tuning, "run_trials", recording_run_trials)

    # 1st run: one MNLI trial fails once (retried), one RTE trial on every attempt: the grid stops
    broken = "rte/lr=0.001,epochs=2,bs=8,warmup=0.1/seed=3"
    with pytest.raises(
        TrialsFailed,
        match=r"1 trial\(s\) failed after 1 retries, e\.g\. rte/lr=0\.001,.*seed=3: "
        r"RuntimeError: injected failure .*error\.txt",
    ):
        finetune(
            run,
            cfg,
            models,
            scratch,
            mirror_root(),
            show_progress=False,
            trainable_fn=recording_trainable(str(first), fail_always=broken, fail_once=flaky),
        )
    tried = attempts(first)
    assert tried[flaky] == 2 and tried[broken] == 2  # each retried once
    # Longest first: Tune gets RTE's trials (its longer pairs are the most tokens to train) before MNLI's, which
    # come first in the plan. (Not the order they start in: which trial a worker takes first also depends on
    # when each worker is ready.)
    assert [[key.split("/")[0] for key in phase] for phase in handed] == [["rte"] * 10 + ["mnli"] * 10]
    assert len(tried) == 20 and sum(tried.values()) == 22  # phase 2 never started
    parents = search(mlflow_uri, "mlm", "finetune")
    assert sorted(parents["tags.task"]) == ["mnli", "rte"] and (parents["status"] == "FAILED").all()
    assert "injected failure" in parents["tags.error"].iloc[0]
    assert (scratch / "results").is_dir() and not (root / "metrics").exists()

    # 2nd run: only what did not finish runs; the same parents continue, no child is logged twice
    summary = finetune(
        run, cfg, models, scratch, mirror_root(), show_progress=False, trainable_fn=recording_trainable(str(second))
    )
    selected = search(mlflow_uri, "mlm", "finetune").query("`tags.task` == 'mnli' and `tags.checkpoint` == 'final'")
    lr = selected["params.selected.lr"].iloc[0]
    assert sorted(attempts(second)) == sorted(
        [broken, *[f"mnli@ckpt050/lr={lr},epochs=2,bs=8,warmup=0.1/seed={s}" for s in range(1, 6)]]
    )
    assert set(summary) >= {"mnli", "rte", "checkpoints"} and summary["trials"] == 25
    after = search(mlflow_uri, "mlm", "finetune")
    assert set(parents["run_id"]) <= set(after["run_id"]) and (after["status"] == "FINISHED").all()
    children = search(mlflow_uri, "mlm", "finetune-trial")
    per_parent = children.groupby("tags.mlflow.parentRunId").size()
    assert sorted(per_parent.tolist()) == [5, 10, 10]
    assert not children.duplicated(["tags.mlflow.parentRunId", "tags.config", "tags.seed"]).any()
    assert not scratch.exists()


# --------------------------------------------------------------------------------------------------
# The trial loop, in-process


@pytest.mark.usefixtures("single_thread")
def test_the_trial_loop_learns_and_dynamic_padding_changes_nothing(vocab_dir):
    from electralab.data.vocab import Tokenizer
    from electralab.finetune.data import prepare
    from electralab.finetune.grid import HParams
    from electralab.finetune.model import FinetuneModel
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.trial import TrialSettings, run_trial

    tok = Tokenizer(vocab_dir)
    cfg = dataclasses.replace(
        load_params(ROOT / "params.yaml").presets["tiny"].finetune,
        max_seq_len=64,
        max_train_examples=64,
        max_eval_examples=64,
    )
    data = prepare(TASKS["sst2"], tok, cfg, mirror_root())[1.0]
    encoder = tiny_encoder(tok.vocab_size, 0)
    settings = dataclasses.replace(TrialSettings.of(cfg), eval_every_epoch=True)
    history = run_trial(data, encoder, HParams(3e-3, 25, 16, 0.1), seed=1, settings=settings)
    assert [h["epoch"] for h in history] == list(range(1, 26)) and all("accuracy" in h for h in history)
    assert history[0]["train_loss"] > 0.6 and history[-1]["train_loss"] < 0.2  # it fits its training set

    model = FinetuneModel(tiny_encoder(tok.vocab_size, 0), TASKS["sst2"]).eval()
    index = np.arange(16)
    with torch.no_grad():
        dynamic = model(*data.train.batch(index)[:2])
        fixed = model(*data.train.batch(index, pad_to=64)[:2])
    torch.testing.assert_close(dynamic, fixed, atol=1e-5, rtol=1e-5)


def test_trials_together_are_packed_by_what_one_batched_model_can_share():
    from electralab.finetune.grid import Group, HParams, TrialSpec, packs

    specs = [
        TrialSpec(Group(task), HParams(lr, epochs, 32, 0.1), seed)
        for task, epochs in (("stsb", 10), ("mrpc", 3), ("stsb", 3))
        for lr in (1e-4, 3e-4)
        for seed in (1, 2, 3)
    ]
    together = packs(specs, 4)
    assert sorted(s.key for pack in together for s in pack) == sorted(s.key for s in specs)  # each once
    assert [len(p) for p in together] == [4, 2, 4, 2, 4, 2]  # 6 trials of each kind: a full pack and the rest
    for pack in together:  # one group, batch size and epoch count a pack; a learning rate may change inside
        assert len({(s.group, s.hparams.batch_size, s.hparams.epochs) for s in pack}) == 1
    assert [p[0] for p in together] == [specs[0], specs[4], specs[6], specs[10], specs[12], specs[16]]
    assert packs(specs, 1) == [[s] for s in specs]


@pytest.mark.slow
def test_trials_trained_together_on_tune_are_the_batched_models_trials(tmp_path, models, env, local_ray, monkeypatch):
    """resources.trials_together: the stage hands Tune packs of trials, each pack one batched model in one worker
    (finetune/batched.py), and records one child per grid trial with what that model gave it."""
    from electralab.finetune import batched, tuning
    from electralab.finetune.protocol import finetune
    from electralab.finetune.trial import TrialSettings

    root = make_project(
        tmp_path,
        models,
        "electra",
        tasks=["stsb", "mrpc"],
        efficiency_tasks=[],
        few_shot_tasks=[],
        resources={"trials_together": 5},
    )
    env(root)
    params = load_params(root / "params.yaml")
    run, cfg = resolve_run(params, "electra"), params.active.finetune
    packs_seen = []
    real = tuning.run_trials

    def recording(specs, *args, **kwargs):
        packs_seen.extend(tuning.packs(specs, cfg.resources.trials_together))
        return real(specs, *args, **kwargs)

    monkeypatch.setattr(tuning, "run_trials", recording)
    summary = finetune(run, cfg, models, tmp_path / "scratch", mirror_root(), show_progress=False)
    assert summary["trials"] == 2 * 2 * 5 and set(summary) >= {"stsb", "mrpc"}
    assert sorted(len(p) for p in packs_seen) == [5, 5, 5, 5]  # each configuration's five seeds together
    children = search(os.environ["MLFLOW_TRACKING_URI"], "electra", "finetune-trial")
    assert len(children) == 20 and (children["metrics.trials_together"] == 5).all()

    # What the stage recorded for one pack is what the batched model trains for it, in this process
    from electralab.data.vocab import Tokenizer
    from electralab.export import load_encoder
    from electralab.finetune.data import prepare
    from electralab.finetune.tasks import TASKS

    pack = next(p for p in packs_seen if p[0].group.task == "mrpc")
    data = prepare(TASKS["mrpc"], Tokenizer(models / "encoder"), cfg, mirror_root())[1.0]
    torch.set_num_threads(1)  # as the Tune worker (resources.cpus 1)
    again = batched.run_trials(
        data, load_encoder(models / "encoder"), [s.hparams for s in pack], [s.seed for s in pack], TrialSettings.of(cfg)
    )
    mine = children[(children["tags.task"] == "mrpc") & (children["tags.config"] == pack[0].hparams.name)]
    mine = mine.set_index(mine["params.seed"].astype(int)).loc[[s.seed for s in pack]]
    assert [h[-1]["accuracy"] for h in again] == pytest.approx(mine["metrics.accuracy"].tolist(), abs=0.05)


def test_trials_never_wait_for_resources_the_cluster_lacks(local_ray):
    from electralab.errors import ConfigError
    from electralab.finetune.tuning import check_resources

    check_resources(TrialResources(cpus=1, gpus=0))
    with pytest.raises(ConfigError, match=r"finetune.resources.gpus=0.25 per trial, but the Ray cluster has 0 GPUs"):
        check_resources(TrialResources(cpus=1, gpus=0.25))
    with pytest.raises(ConfigError, match=r"finetune.resources.cpus=3 per trial, but the Ray cluster has 2 CPUs"):
        check_resources(TrialResources(cpus=3))


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(
    "export,on_top,layers",
    [("mws", False, 12), ("rtd", False, 12), ("mws", True, 13)],
    ids=["TEAMS MWS branch", "RTD head outputs", "task head on 12th layer"],
)
def test_any_runs_export_fine_tunes(tmp_path, vocab_dir, export, on_top, layers):
    """The main Transformer as each TEAMS variant exports it goes through save/load into a trial."""
    from helpers import tiny_generators, tiny_model

    from electralab.data.vocab import Tokenizer
    from electralab.export import load_encoder
    from electralab.finetune.data import prepare
    from electralab.finetune.grid import HParams
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.trial import TrialSettings, run_trial
    from electralab.objectives.teams import Teams

    tok = Tokenizer(vocab_dir)
    torch.manual_seed(0)
    teams = Teams(tiny_model(), tiny_generators(), tok.vocab_size, Teams.Settings(export=export, heads_on_top=on_top))
    save_encoder(teams.main_encoder(), tmp_path / "encoder", vocab_dir)
    encoder = load_encoder(tmp_path / "encoder")
    assert len(encoder.layers) == layers
    cfg = dataclasses.replace(
        load_params(ROOT / "params.yaml").presets["tiny"].finetune,
        max_seq_len=64,
        max_train_examples=32,
        max_eval_examples=32,
    )
    data = prepare(TASKS["rte"], Tokenizer(tmp_path / "encoder"), cfg, mirror_root())[1.0]
    history = run_trial(data, encoder, HParams(1e-3, 1, 16, 0.1), seed=1, settings=TrialSettings.of(cfg))
    assert 0 <= history[-1]["accuracy"] <= 100


@pytest.mark.usefixtures("single_thread")
def test_a_diverged_model_scores_nan_never_wins_selection_and_leaves_no_glue_average(
    vocab_dir, tmp_path, models, env, mlflow_uri
):
    """A model that diverged to NaN through evaluation and grid selection: every metric of it is NaN (STS-B's
    Spearman used to be 8.45 and beat a weak real configuration), a real configuration wins although the
    diverged one comes first in the grid, and the GLUE average stays undefined."""
    from electralab.data.vocab import Tokenizer
    from electralab.finetune.data import prepare
    from electralab.finetune.grid import Group, HParams, TrialSpec, select
    from electralab.finetune.model import FinetuneModel
    from electralab.finetune.protocol import summarize
    from electralab.finetune.tasks import TASKS
    from electralab.finetune.trial import TrialSettings, evaluate

    tok = Tokenizer(vocab_dir)
    cfg = dataclasses.replace(
        load_params(ROOT / "params.yaml").presets["tiny"].finetune,
        max_seq_len=64,
        max_train_examples=16,
        max_eval_examples=128,
        squad=SquadSettings(doc_stride=32, max_query_len=16, max_eval_questions=16),
    )
    settings = TrialSettings.of(cfg)
    diverged, weak = HParams(1e-3, 2, 32, 0.1), HParams(3e-4, 2, 32, 0.1)
    selections = {}
    for name in ("stsb", "rte", "squad2"):
        task = TASKS[name]
        data = prepare(task, tok, cfg, mirror_root())[1.0]
        finals = {}
        for seed in (1, 2, 3):
            broken = tiny_encoder(tok.vocab_size, seed)
            with torch.no_grad():
                for p in broken.parameters():
                    p.fill_(float("nan"))
            nan_metrics = evaluate(FinetuneModel(broken, task), data, settings, torch.device("cpu"))
            assert nan_metrics and all(np.isnan(v) for v in nan_metrics.values()), (name, nan_metrics)
            finals[TrialSpec(Group(name), diverged, seed)] = nan_metrics
            real = evaluate(
                FinetuneModel(tiny_encoder(tok.vocab_size, seed), task), data, settings, torch.device("cpu")
            )
            assert all(np.isfinite(v) for v in real.values()), (name, real)
            finals[TrialSpec(Group(name), weak, seed)] = real
        selections[Group(name)] = selection = select(finals, [diverged, weak], task.main_metric)
        assert selection.best == weak and np.isfinite(selection.stats[f"median_{task.main_metric}"])
    assert "glue_avg" not in summarize(selections, {}, 1.0)

    # A grid where every configuration diverged: its parent says which metrics failed (the report's "failed").
    from mlflow import MlflowClient

    from electralab.finetune.track import FinetuneTracker

    root = make_project(tmp_path, models, "mlm")
    env(root)
    only_nan = {s: m for s, m in finals.items() if s.hparams == diverged}
    tracker = FinetuneTracker(resolve_run(load_params(root / "params.yaml"), "mlm"), (1, 2, 3), tmp_path / "p.json")
    parent = tracker.parent(Group("squad2"), TASKS["squad2"], "inputs")
    tracker.finish(parent, select(only_nan, [diverged], "f1"), {}, {})
    finished = MlflowClient(mlflow_uri).get_run(parent)
    assert finished.data.tags["failed_metrics"] == ",".join(sorted(only_nan[next(iter(only_nan))]))
    assert not any(k.startswith("median_") for k in finished.data.metrics)
