"""The reproduce flow as users run it (`python flows/reproduce.py ...`) against a real Prefect server, with real
DVC and MLflow, in tmp project copies shrunk to MINI: bad input fails before any work, a failed stage fails the
flow, one table end to end through the flow and through `dvc repro`, Prefect never serves a stage from its
cache, a kill mid-pretraining resumes, and two flows at once on one workspace take turns.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, mirror_root
from ops_helpers import (
    ABLATION,
    ABLATION_RUNS,
    FLOW_TIMEOUT,
    api,
    flow_env,
    flow_run_named,
    flow_runs,
    make_project,
    reproduce_cmd,
    task_runs,
)
from project_helpers import BIN, env_for, run, set_param

sys.path.insert(0, str(ROOT / "flows"))
import workspace  # noqa: E402
from deployments import DEPLOYMENTS  # noqa: E402
from reproduce import SAME_STOP_S, Stops, retry_unless_bad_input  # noqa: E402
from workspace import StageFailed, make_plan, targets  # noqa: E402

from electralab.errors import ConfigError  # noqa: E402


def flow(project: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        reproduce_cmd(*args), cwd=project, env=env, capture_output=True, text=True, timeout=FLOW_TIMEOUT
    )


def ran(output: str) -> list[str]:
    """The stages DVC actually ran, in order."""
    return re.findall(r"Running stage '([^']+)'", output)


def mlflow_runs(db: Path, experiment: str = "electralab-tiny"):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment} in {db}"
    return client, found, client.search_runs([found.experiment_id], "tags.stage = 'pretrain'")


# ---- the plan: validated before anything runs -----------------------------------------------------------


def test_plan_puts_producers_first_and_every_target_is_a_stage_of_dvc_yaml():
    plan = make_plan(ROOT, tables=["amos/table8"])
    assert plan.preset == "tiny" and plan.in_place and plan.workspace == ROOT
    assert plan.runs.index("amos_ablation") < plan.runs.index("amos_final_mix")
    assert make_plan(ROOT, runs=["cocolm_converged_aux"]).runs == ("cocolm_ablation", "cocolm_converged_aux")
    every = make_plan(ROOT)
    assert len(every.runs) == len(yaml.safe_load((ROOT / "params.yaml").read_text())["runs"])
    other = make_plan(ROOT, preset="small", runs=["mlm"])
    assert not other.in_place and other.workspace == ROOT / ".electralab" / "workspaces" / "small"
    # Cheapest first: the control (which trains nothing), then by tokens x weights; ties in the registry's order;
    # every row's first pretraining run before the rows' other seeds.
    headline = make_plan(ROOT, tables=["coco-lm/table1", "amos/table1", "teams/table1"])
    rows = ("control", "mlm", "electra", "cocolm", "teams", "amos")
    assert headline.runs == (*rows, *(f"{run}_seed{seed}" for run in rows for seed in (2, 3)))
    assert headline.costs[0] == 0 and list(headline.costs[:6]) == sorted(headline.costs[:6])
    assert list(headline.costs[6:]) == [cost for cost in headline.costs[:6] for _ in (2, 3)]

    assert targets(("cocolm", "cocolm_no_copy")) == [
        "corpus",
        "shards",
        "pretrain@cocolm",
        "finetune@cocolm",
        "export@cocolm",
        "pretrain@cocolm_no_copy",
        "finetune@cocolm_no_copy",
        "export@cocolm_no_copy",
        "report",
    ]
    # The flow runs every target it plans, without asking DVC first: each must be a stage of dvc.yaml, whose
    # per-run stages are one per run of params.yaml.
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    names = {name for name, stage in dvc.items() if "foreach" not in stage}
    names |= {
        f"{name}@{run}"
        for name, stage in dvc.items()
        if stage.get("foreach") == "${runs}"
        for run in yaml.safe_load((ROOT / "params.yaml").read_text())["runs"]
    }
    assert set(targets(every.runs)) <= names, set(targets(every.runs)) - names


def test_the_first_look_is_the_headlines_control_and_a_row_whose_claim_against_it_the_report_checks():
    from electralab.config import load_params
    from electralab.report.claims import comparisons
    from electralab.tables import HEADLINE, TABLES

    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["first_look"]
    first_look = stage["cmd"].split()[5:]  # python stages/first_look.py metrics out checkpoints RUN...
    plan = make_plan(ROOT, runs=first_look)
    assert plan.runs == ("control", "electra")  # cheapest first; nothing else trains
    assert set(plan.runs) <= set(make_plan(ROOT, tables=list(HEADLINE)).runs)  # make repro goes on from them
    # the stage waits for both runs' pretraining (DVC orders it after them) and reruns when they change
    assert {f"models/{run}" for run in first_look} | {f"metrics/pretrain/{run}.json" for run in first_look} <= set(
        stage["deps"]
    )
    assert {f"runs.{run}" for run in first_look} <= set(stage["params"])
    tasks = load_params(ROOT / "params.yaml").active.first_look_finetune().tasks
    assert tasks == ("stsb",)  # the tiny preset's first look: STS-B alone
    spec = TABLES[HEADLINE[0]]
    pairs = {(c.run, c.than) for c in comparisons(spec, spec.setting_for["tiny"])}
    assert ("electra", "control") in pairs


def test_the_time_left_uses_a_probe_until_a_pretraining_has_run_then_what_ran(
    shards_dir, tmp_path, monkeypatch, caplog
):
    """make repro's ETA: before any run has trained here, pretraining's pace is a few seconds of the cheapest
    trained run's real step (electralab.train.probe); once a pretraining stage has run, its measured pace."""
    import dataclasses
    import logging
    import shutil

    from workspace import Pace, probe_pace

    from electralab.config import load_params
    from electralab.runs import resolve_run

    plan = make_plan(ROOT, tables=["coco-lm/table1"])  # control, mlm, electra, cocolm
    pace = Pace(plan)
    rest = ["pretrain@mlm", "finetune@mlm"]
    assert pace.left(rest) is None  # nothing measured
    monkeypatch.setattr(workspace, "PROBE_SECONDS", 0)  # at least 3 timed steps: enough for the test
    project = tmp_path / "project"  # what the probe reads: params.yaml, and dvc.yaml's shards output
    project.mkdir()
    shutil.copy(ROOT / "params.yaml", project / "params.yaml")
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"shards": {"outs": [str(shards_dir)]}}}))
    with caplog.at_level(logging.INFO):
        pace.probed = probe_pace(
            dataclasses.replace(plan, project=project), {**os.environ, "ELECTRALAB_THREADS": "1"}, logging.getLogger()
        )
    assert pace.probed is not None and pace.probed > 0, caplog.text
    steps = resolve_run(load_params(ROOT / "params.yaml"), "mlm").pretrain.steps
    assert re.search(
        rf"one mlm step takes \d+ ms here \(cpu, (bf16|fp32)\), {steps} steps: pretraining it about", caplog.text
    )
    mlm = dict(zip(plan.runs, plan.costs))["mlm"]
    assert pace.left(["pretrain@mlm"]) == pytest.approx(mlm * pace.probed)
    assert pace.left(rest) is None  # fine-tuning not measured yet
    pace.record("finetune@control", "ran", 100.0)
    assert pace.left(rest) == pytest.approx(mlm * pace.probed + 100.0)
    pace.record("pretrain@mlm", "ran", 50.0)  # measured beats probed
    assert pace.left(["pretrain@electra"]) == pytest.approx(dict(zip(plan.runs, plan.costs))["electra"] * 50.0 / mlm)

    # Run again after a stop: what an earlier command finished here timed itself (its metrics files).
    for kind, name, record in (
        ("pretrain", "mlm", {"wall_hours": 0.5}),
        ("pretrain", "control", {"wall_hours": 0.0}),
        ("finetune", "control", {"seconds": 900.0}),
        ("finetune", "mlm", ["not", "a", "dict"]),
    ):
        (project / "metrics" / kind).mkdir(parents=True, exist_ok=True)
        (project / "metrics" / kind / f"{name}.json").write_text(json.dumps(record))
    again = Pace(dataclasses.replace(plan, project=project))
    assert again.left(rest) == pytest.approx(1800.0 + 900.0)
    # A stage this command resumed took longer than this command saw: its metrics count all its commands.
    (project / "metrics" / "pretrain" / "electra.json").write_text(json.dumps({"wall_hours": 1.0}))
    again.record("pretrain@electra", "ran", 60.0)
    costs = dict(zip(plan.runs, plan.costs))
    assert again.left(["pretrain@cocolm"]) == pytest.approx(costs["cocolm"] * 5400.0 / (mlm + costs["electra"]))


def refusing_prefect(tmp_path: Path) -> str:
    """A directory for PYTHONPATH whose sitecustomize refuses any import of prefect."""
    where = tmp_path / "no-prefect"
    where.mkdir()
    (where / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoPrefect:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'prefect':\n"
        "            raise ImportError(f'{name}: refused by the test')\n"
        "sys.meta_path.insert(0, NoPrefect())\n",
        encoding="utf-8",
    )
    return str(where)


def test_targets_print_without_prefect(tmp_path):
    """`python flows/reproduce.py --tables ... --targets` needs no Prefect: the command runs with any import of
    prefect refused."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([refusing_prefect(tmp_path), str(ROOT / "src")])}
    refused = subprocess.run(
        [sys.executable, "-c", "import prefect"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1 and "prefect: refused by the test" in refused.stderr, refused.stderr
    proc = subprocess.run(
        [sys.executable, "flows/reproduce.py", "--tables", "coco-lm/table1", "--targets"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = ("control", "mlm", "electra", "cocolm")
    runs = [
        f"{stage}@{run}"
        for run in (*rows, *(f"{row}_seed{seed}" for row in rows for seed in (2, 3)))
        for stage in ("pretrain", "finetune", "export")
    ]
    assert proc.stdout.split() == ["corpus", "shards", *runs]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"preset": "huge"},
            r"preset 'huge' is not a preset of .*params.yaml; choose one of \['tiny', 'small', 'base'",
        ),
        ({"tables": ["coco-lm/table9"]}, r"table 'coco-lm/table9' is not a table; choose from: coco-lm/table1, "),
        (
            {"runs": ["mlm", "no_such_run"]},
            r"run 'no_such_run' is not in params.yaml runs; known runs: control, mlm, electra, ",
        ),
    ],
)
def test_the_plan_names_a_bad_value_and_the_allowed_ones(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make_plan(ROOT, **kwargs)


def test_a_flow_with_a_bad_preset_table_or_run_fails_before_any_work(tmp_path, prefect_api):
    """From the command line a bad value fails before Prefect is imported (so before its temporary server
    starts); through the flow API, as a deployment's parameters arrive, the flow run fails in Prefect."""
    project = make_project(tmp_path / "project")
    env = flow_env(project, prefect_api, tmp_path / "mlflow.db")
    before = (project / "dvc.yaml").stat().st_mtime_ns, sorted(p.name for p in project.iterdir())

    no_prefect = {**env, "PYTHONPATH": os.pathsep.join([refusing_prefect(tmp_path), env["PYTHONPATH"]])}
    proc = flow(project, no_prefect, "--preset", "huge", "--runs", "mlm")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: preset 'huge' is not a preset of" in proc.stderr and "'tiny', 'small'" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The flow API too (a deployment's parameters reach the flow function, not the CLI).
    code = (
        "import sys; sys.path.insert(0, 'flows'); from reproduce import reproduce\n"
        "for kw in ({'tables': ['amos/table99']}, {'runs': ['mlm', 'nope']}):\n"
        "    try: reproduce(**kw)\n"
        "    except Exception as e: print(type(e).__name__, e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=FLOW_TIMEOUT
    )
    assert "ConfigError table 'amos/table99' is not a table; choose from: coco-lm/table1" in proc.stdout, proc.stderr
    assert "ConfigError run 'nope' is not in params.yaml runs; known runs: control, mlm, electra" in proc.stdout

    for name, value in (
        ("params.yaml: amos/table99", "'amos/table99'"),
        ("params.yaml: mlm, nope", "'nope'"),
    ):
        flow_run = flow_run_named(prefect_api, name)
        assert flow_run["state_type"] == "FAILED" and value in flow_run["state"]["message"], flow_run["state"]
        assert task_runs(prefect_api, flow_run["id"]) == []  # not one stage started
    assert "huge: mlm" not in [r["name"] for r in flow_runs(prefect_api)]  # the command line never reached Prefect
    assert ((project / "dvc.yaml").stat().st_mtime_ns, sorted(p.name for p in project.iterdir())) == before


def test_a_flow_run_cannot_be_pointed_at_another_directory(tmp_path, prefect_api):
    """A deployment's `project` parameter reaches the flow from anyone who can reach the Prefect API: it must
    not run `dvc repro` in an arbitrary directory, only in the flow's own project or one the serving process
    lists in $ELECTRALAB_PROJECTS."""
    project, other = make_project(tmp_path / "project"), make_project(tmp_path / "other")
    env = flow_env(project, prefect_api, tmp_path / "mlflow.db")
    before = sorted(p.name for p in other.iterdir())
    proc = flow(project, env, "--project", str(other), "--runs", "mlm")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        f"error: project '{other}' is not this flow's project ({project}) nor listed in $ELECTRALAB_PROJECTS"
        in proc.stderr
    )
    # As a deployment's parameter it reaches the flow function, whose run fails in Prefect with no stage run.
    code = (
        "import sys; sys.path.insert(0, 'flows'); from reproduce import reproduce\n"
        f"try: reproduce(runs=['mlm'], project={str(other)!r})\n"
        "except Exception as e: print(type(e).__name__, e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=FLOW_TIMEOUT
    )
    assert f"ConfigError project '{other}' is not this flow's project" in proc.stdout, proc.stderr[-2000:]
    flow_run = flow_run_named(prefect_api, "params.yaml: mlm")
    assert flow_run["state_type"] == "FAILED" and task_runs(prefect_api, flow_run["id"]) == []
    assert sorted(p.name for p in other.iterdir()) == before  # nothing ran there
    listed = flow(
        project, {**env, "ELECTRALAB_PROJECTS": str(other)}, "--project", str(other), "--runs", "mlm", "--targets"
    )
    assert listed.returncode == 0 and listed.stdout.split() == [
        "corpus",
        "shards",
        "pretrain@mlm",
        "finetune@mlm",
        "export@mlm",
    ]


# ---- schedules ----------------------------------------------------------------------------------------


def test_the_cron_schedules_of_the_deployments_produce_scheduled_flow_runs_and_the_scheduler_logs_no_errors(
    tmp_path, prefect_server
):
    """Scheduled flows in the Prefect UI need the server's scheduler. Under SQLAlchemy 2.1 Prefect 3.8.8's
    scheduler raised InvalidRequestError on every pass and no deployment got a run: a lock update must not
    break it silently again (requirements.lock pins SQLAlchemy 2.0)."""
    log_start = prefect_server.log.stat().st_size
    env = {**os.environ, "PREFECT_API_URL": prefect_server.api, "PREFECT_HOME": str(tmp_path / "prefect-client")}
    code = (
        "import sys; sys.path.insert(0, 'flows'); from deployments import deployments\n"
        "for d in deployments(): print(d.name, d.apply())"
    )  # what `python flows/deployments.py` registers
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=FLOW_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = dict(line.split() for line in proc.stdout.splitlines())
    crons = {name: cron for name, cron, _, _ in DEPLOYMENTS}
    assert set(ids) == set(crons)

    def scheduled() -> dict[str, list[datetime]]:
        runs = api(
            prefect_server.api,
            "flow_runs/filter",
            {"flow_runs": {"deployment_id": {"any_": list(ids.values())}, "state": {"type": {"any_": ["SCHEDULED"]}}}},
        )
        names = {v: k for k, v in ids.items()}
        out: dict[str, list[datetime]] = {name: [] for name in ids}
        for r in runs:
            out[names[r["deployment_id"]]].append(datetime.fromisoformat(r["expected_start_time"]))
        return {name: sorted(times) for name, times in out.items()}

    try:
        deadline = time.monotonic() + 90  # the server schedules recently changed deployments every 5 s
        while min(len(scheduled()[name]) for name, cron in crons.items() if cron) < 3:
            assert time.monotonic() < deadline, prefect_server.log.read_text()[log_start:][-3000:]
            time.sleep(1)
        runs = scheduled()
    finally:
        # Their scheduled runs would outlive this test on the session's server: once 02:00 UTC has passed, the
        # nightly one is late, and the process that test_ui.py serves later would start it (the whole tiny preset).
        for deployment_id in ids.values():
            api(prefect_server.api, f"deployments/{deployment_id}", method="DELETE")
    assert runs["tiny-one-table"] == []  # on demand only
    nightly, weekly = runs["nightly-tiny"], runs["weekly-small"]
    assert all((t.hour, t.minute, t.utcoffset().total_seconds()) == (2, 0, 0) for t in nightly), nightly
    assert all((b - a).days == 1 for a, b in zip(nightly, nightly[1:])), nightly
    assert all((t.weekday(), t.hour, t.minute) == (5, 4, 0) for t in weekly), weekly  # Saturdays 04:00 UTC
    log = prefect_server.log.read_text()[log_start:]
    errors = [line for line in log.splitlines() if "ERROR" in line or "Traceback" in line or "Error:" in line]
    assert not errors, log[-3000:]


# ---- failures propagate -----------------------------------------------------------------------------


def test_the_corpus_stage_retries_unless_it_reported_bad_input():
    from prefect.states import Failed

    def failed(status):
        return Failed(data=StageFailed("corpus", ROOT, 1, status, ["..."]))

    assert retry_unless_bad_input(None, None, failed(1))  # e.g. the hub download broke off
    assert retry_unless_bad_input(None, None, failed(None))  # dvc itself failed
    assert not retry_unless_bad_input(None, None, failed(2))  # a config or data error: a retry cannot help
    assert retry_unless_bad_input(None, None, Failed(data=OSError("connection reset")))


def test_a_failing_stage_fails_the_flow_and_nothing_after_it_runs(tmp_path, prefect_api):
    project = make_project(tmp_path / "project")
    script = project / "stages" / "pretrain.py"
    script.write_text(
        script.read_text().replace(
            'if __name__ == "__main__":', 'if __name__ == "__main__":\n    raise SystemExit("broken on purpose")'
        )
    )
    proc = flow(project, flow_env(project, prefect_api, tmp_path / "mlflow.db"), "--runs", "mlm", "electra")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "error: dvc repro pretrain@mlm failed in" in proc.stderr and "broken on purpose" in proc.stderr

    flow_run = flow_run_named(prefect_api, "params.yaml: mlm, electra")
    assert flow_run["state_type"] == "FAILED"
    states = {t["name"]: t["state_type"] for t in task_runs(prefect_api, flow_run["id"])}
    assert states == {"corpus": "COMPLETED", "shards": "COMPLETED", "pretrain@mlm": "FAILED"}, states
    assert not (project / "models").exists()


# ---- one table end to end ---------------------------------------------------------------------------


def test_one_ablation_table_through_the_flow(ablation, prefect_api):
    project, db, proc = ablation
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The whole pipeline for one table: data once, then each run's pretraining and fine-tuning, then the report.
    expected = ["corpus", "vocab", "shards", "resolve"] + [
        f"{s}@{r}" for r in ABLATION_RUNS for s in ("pretrain", "finetune", "export")
    ]
    assert ran(proc.stdout + proc.stderr) == expected + ["report"]

    flow_run = flow_run_named(prefect_api, f"params.yaml: {ABLATION}")
    assert flow_run["state_type"] == "COMPLETED"
    tasks = {t["name"]: t["state_type"] for t in task_runs(prefect_api, flow_run["id"])}
    assert set(tasks) == {"corpus", "shards", "report", *[t for t in expected if "@" in t]}
    assert set(tasks.values()) == {"COMPLETED"}

    status = run(
        [str(BIN / "dvc"), "status", *[t for t in expected if "@" in t]], project, flow_env(project, prefect_api, db)
    )
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    client, experiment, runs = mlflow_runs(db)
    assert sorted(r.data.tags["run"] for r in runs) == sorted(ABLATION_RUNS)
    assert all(r.info.status == "FINISHED" and ABLATION in r.data.tags["tables"] for r in runs)
    parents = client.search_runs([experiment.experiment_id], "tags.stage = 'finetune'")
    assert {
        (r.data.tags["run"], r.data.tags["task"])
        for r in parents
        if r.data.tags.get("checkpoint", "final") == "final" and r.data.tags.get("label_fraction", "1.0") == "1.0"
    } >= {(r, t) for r in ABLATION_RUNS for t in ("rte", "stsb", "squad2")}

    check_export(project, "teams_ablation", next(r.info.run_id for r in runs if r.data.tags["run"] == "teams_ablation"))

    summary = api(
        prefect_api,
        "artifacts/filter",
        {"artifacts": {"key": {"any_": ["reproduce-tiny"]}, "flow_run_id": {"any_": [flow_run["id"]]}}},
    )
    assert len(summary) == 1 and summary[0]["type"] == "markdown"
    markdown = summary[0]["data"]
    assert f"#/experiments/{experiment.experiment_id})" in markdown and "MLflow experiment electralab-tiny" in markdown
    for r in ABLATION_RUNS:
        assert f"| `pretrain@{r}` | ran |" in markdown and f"| `finetune@{r}` | ran |" in markdown
    table = api(
        prefect_api,
        "artifacts/filter",
        {"artifacts": {"key": {"any_": ["tiny-teams-table4"]}, "flow_run_id": {"any_": [flow_run["id"]]}}},
    )
    assert len(table) == 1, [a["key"] for a in api(prefect_api, "artifacts/latest/filter", {})]
    # The fine-tuned tasks' cells hold our medians (numbers), the tasks MINI skips stay missing.
    rows = [line for line in table[0]["data"].splitlines() if "`teams_no_tie`" in line]
    assert len(rows) == 1 and re.search(r"\| -?\d+\.\d", rows[0]) and "—" in rows[0], rows
    assert "TEAMS Table 4" in table[0]["data"] and "[MLflow experiment electralab-tiny](" in table[0]["data"]
    # The report depends on every run's metrics; --single-item kept DVC from training the runs of other tables
    # (ran() above), and the report still publishes every table, their cells missing.
    assert "dvc --wait-for-lock repro --single-item report" in proc.stdout + proc.stderr
    keys = {a["key"] for a in api(prefect_api, "artifacts/latest/filter", {})}
    assert {"tiny-coco-lm-table1", "tiny-coco-lm-table3", "tiny-amos-table2", "tiny-teams-table1"} <= keys


def check_export(project: Path, run: str, pretrain_run_id: str) -> None:
    """exports/<run>/ as transformers' users load it: the tokenizer gives our ids, the model our encoder's outputs
    (TEAMS: its MWS branch, relative positions: the remote code), and the card lists the run's medians."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from electralab.data.vocab import Tokenizer
    from electralab.export import load_encoder

    export, ours = project / "exports" / run, project / "models" / run / "encoder"
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModel.from_pretrained(export, trust_remote_code=True).eval()
    texts = ["The cat sat on the mat.", "Zürich's  second, longer sentence\tabout something else entirely."]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    for row, text in zip(batch["input_ids"], texts):
        assert row[row != 0].tolist() == [2, *Tokenizer(ours).encode(text), 3]
    with torch.no_grad():
        expected = load_encoder(ours).eval()(batch["input_ids"], mask)[-1]
        assert torch.allclose(model(**batch).last_hidden_state[mask], expected[mask], atol=1e-5)
    card = (export / "README.md").read_text()
    assert f"pretraining run `{pretrain_run_id}`" in card and "trust_remote_code=True" in card
    assert re.search(r"\| RTE \| \d+\.\d \|", card) and "| MNLI-m | — (not fine-tuned) |" in card, card


def test_make_repro_needs_no_prefect_runs_cheapest_first_reports_each_row_then_the_flow_agrees(tmp_path, prefect_api):
    """`make repro`'s path (flows/reproduce.py --no-prefect) on two rows of COCO-LM Table 1: no Prefect imported,
    the control first, the report after each row, a line after each stage with the time left; then the flow
    finds nothing to do but the report, and re-runs exactly the stages of a changed run (Prefect never answers
    from its cache)."""
    project = make_project(tmp_path / "project")
    env = flow_env(project, prefect_api, tmp_path / "mlflow.db")
    local = {**env, "PYTHONPATH": os.pathsep.join([refusing_prefect(tmp_path), env["PYTHONPATH"]])}
    made = subprocess.run(
        reproduce_cmd("--runs", "cocolm", "control", "--no-prefect"),
        cwd=project,
        env=local,
        capture_output=True,
        text=True,
        timeout=FLOW_TIMEOUT,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    runs = [f"{s}@{r}" for r in ("control", "cocolm") for s in ("pretrain", "finetune", "export")]
    assert ran(made.stdout) == ["corpus", "vocab", "shards", "resolve", *runs[:3], "report", *runs[3:], "report"]
    progress = re.findall(r"^reproduce: \[\d+/8\] (\S+): (\S+); (.*)$", made.stdout, re.M)
    assert [stage for stage, _, _ in progress] == ["corpus", "shards", *runs], made.stdout[-3000:]
    assert {result for _, result, _ in progress} == {"ran"}
    assert re.search(r"^reproduce: one cocolm step takes \d+ ms here \(cpu, ", made.stdout, re.M)  # the probe
    assert "the time left shows once a fine-tuning has run here" in progress[2][2]
    assert re.fullmatch(
        r"4 stages left \(control, cocolm\), about \d+ min more at this machine's pace so far", progress[3][2]
    )
    assert re.fullmatch(r"2 stages left \(cocolm\), about \d+ min more at this machine's pace so far", progress[5][2])
    assert progress[-1][2] == "every stage done"
    table1 = (project / "reports" / "tables" / "coco-lm_table1.md").read_text()
    rows = [line for line in table1.splitlines() if "| `cocolm` |" in line]
    assert "tiny preset" in table1 and len(rows) == 1 and re.search(r"\d+\.\d ±", rows[0]), table1

    again = flow(project, env, "--runs", "cocolm", "control")  # DVC's state: nothing to do but the report
    assert again.returncode == 0, again.stderr[-3000:]
    assert ran(again.stdout + again.stderr) == ["report"]  # always_changed: it reads MLflow, which DVC cannot hash

    # Same flow, same task inputs, one changed run setting: DVC re-runs exactly that stage, and Prefect does not
    # answer from its input cache.
    for name in ("cocolm", "cocolm_seed2", "cocolm_seed3"):  # a row's pretraining seeds change together (checked)
        set_param(project, f"runs.{name}.settings", {"crop_fraction": 0.85})
    changed = flow(project, env, "--runs", "cocolm", "control")
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert ran(changed.stdout + changed.stderr) == [
        "resolve",  # every run resolved again; only cocolm's changed
        *["pretrain@cocolm", "finetune@cocolm", "export@cocolm", "report"],
    ]


# ---- faults -------------------------------------------------------------------------------------------


def test_kill_mid_pretraining_then_the_flow_again_resumes_and_redoes_nothing_finished(tmp_path, prefect_api):
    project = make_project(tmp_path / "project", steps=24)
    db = tmp_path / "mlflow.db"
    env = flow_env(project, prefect_api, db)
    state = project / "checkpoints" / "electra" / "state.pt"
    first = subprocess.Popen(
        reproduce_cmd("--runs", "electra"),
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # its own process group
    deadline = time.monotonic() + FLOW_TIMEOUT
    while not state.exists():
        assert first.poll() is None, "the flow ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the flow, dvc and the stage, as a crash or an OOM kill would
    first.wait()
    assert not (project / "models" / "electra").exists() and state.exists()

    again = flow(project, env, "--runs", "electra")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    output = again.stdout + again.stderr
    assert ran(output) == ["pretrain@electra", "finetune@electra", "export@electra", "report"], ran(
        output
    )  # no data stage redone
    for stage in ("corpus", "vocab", "shards"):
        assert f"Stage '{stage}' didn't change, skipping" in output
    _, _, runs = mlflow_runs(db)
    # One MLflow run, continued: the stage resumed from its checkpoint instead of starting over.
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].data.metrics["final_steps"] == 24
    assert not state.exists() and (project / "models" / "electra" / "encoder").is_dir()


def test_a_signal_twice_at_once_is_one_stop_and_a_later_one_ends_the_command_at_once():
    stops = Stops()
    assert not stops.received(signal.SIGTERM, 100.0) and stops.signum == signal.SIGTERM  # after the current stage
    assert not stops.received(signal.SIGTERM, 100.001)  # make passing the group's SIGTERM on: the same stop
    assert stops.received(signal.SIGINT, 100.0 + SAME_STOP_S + 0.1)  # a second Ctrl-C: at once
    assert stops.signum == signal.SIGTERM  # the stop the command names is the first


def test_ctrl_c_of_make_repro_stops_the_stage_and_the_command_in_one_line_each_and_it_goes_on(tmp_path):
    """Ctrl-C on `make repro`'s path (the terminal signals the process group) mid fine-tuning: the stage stops itself
    in its one line, the command after it in one line of its own, no traceback; the same command goes on."""
    project = make_project(tmp_path / "project")
    env = {**env_for(project, mirror_root()), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = reproduce_cmd("--runs", "control", "--no-prefect")
    first = subprocess.Popen(
        command,
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = []
    for line in first.stdout:  # until DVC starts fine-tuning
        output.append(line)
        if "> python stages/finetune.py control" in line:
            break
    # Signal once the stage holds its lock (its stop handlers are in place by then), not a fixed time after DVC's
    # line: DVC runs the stage under $SHELL, and dash (/bin/sh where SHELL is unset, as in CI) forks it rather than
    # exec'ing it; a SIGINT that lands while dash forks never reaches the stage, which then runs its whole grid
    # while dash waits, and exits -2 after it (CI, 28 Nov).
    lock = project / ".electralab" / "locks" / "stage-finetune@control.lock"
    deadline = time.monotonic() + FLOW_TIMEOUT
    while not (lock.exists() and lock.read_text().startswith("pid ")):
        assert first.poll() is None and time.monotonic() < deadline, "".join(output)[-3000:]
        time.sleep(0.1)
    time.sleep(2)  # inside the stage: its data and Ray starting
    os.killpg(first.pid, signal.SIGINT)
    os.kill(first.pid, signal.SIGINT)  # the same stop again at once, as make passes a group's SIGTERM on to the flow
    output.append(first.stdout.read())
    assert first.wait(timeout=FLOW_TIMEOUT) == 130, "".join(output)[-3000:]
    text = "".join(output)
    assert "Traceback" not in text, text[-3000:]
    assert "finetune@control: stopped by SIGINT; run the same command again" in text, text[-3000:]
    assert "reproduce: stopped by SIGINT; the same command goes on from there (`make repro`)" in text
    assert not (project / "metrics" / "finetune" / "control.json").exists()

    again = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=FLOW_TIMEOUT)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert ran(again.stdout) == ["finetune@control", "export@control", "report"]  # nothing before it again


def test_two_flows_at_once_on_another_presets_workspace_one_waits_and_params_stay_untouched(tmp_path, prefect_api):
    project = make_project(tmp_path / "project", preset="small")
    params = (project / "params.yaml").read_bytes()
    env = flow_env(project, prefect_api, tmp_path / "unused.db")
    env.pop("MLFLOW_TRACKING_URI")  # the default store: the project's mlflow.db, also from the workspace
    procs = [
        subprocess.Popen(
            reproduce_cmd("--preset", "small", "--runs", "mlm"),
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=FLOW_TIMEOUT)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    # The second flow waited for the first to end, then found every stage up to date: each ran once (but the
    # report, which always runs).
    assert sorted(ran(outputs[0]) + ran(outputs[1])) == sorted(
        ["corpus", "vocab", "shards", "resolve", "pretrain@mlm", "finetune@mlm", "export@mlm", "report", "report"]
    )
    assert sum("waiting for another reproduce flow" in out for out in outputs) == 1

    assert (project / "params.yaml").read_bytes() == params  # the user's file: untouched
    workspace = project / ".electralab" / "workspaces" / "small"
    assert yaml.safe_load((workspace / "params.yaml").read_text())["preset"] == "small"
    assert (workspace / "models" / "mlm" / "encoder").is_dir() and not (project / "models").exists()
    status = run([str(BIN / "dvc"), "status", "pretrain@mlm", "finetune@mlm", "export@mlm"], workspace, env)
    assert "Data and pipelines are up to date" in status.stdout and status.returncode == 0, status.stdout
    assert not (workspace / "mlflow.db").exists()
    client, experiment, runs = mlflow_runs(project / "mlflow.db", "electralab-small")
    assert experiment.artifact_location == (project / "mlartifacts" / "electralab-small").as_uri()
    assert [r.data.tags["run"] for r in runs] == ["mlm"] and runs[0].data.tags["preset"] == "small"
