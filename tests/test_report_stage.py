"""The report stage end to end on the populated MLflow store: every file written, the DVC stage's
plots files as declared, the report logged to MLflow with one row run per table row, and nothing
partial when the build fails half-way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from project_helpers import load_stage, stage_args
from report_helpers import CORPUS, _run, median_of

from electralab.report import stem
from electralab.report.track import ROW_STAGE
from electralab.tables import TABLES

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads only add overhead

ROOT = Path(__file__).resolve().parents[1]
ARGS = stage_args("report")[1:]  # dvc.yaml's paths, relative to the project root: the tests work there
OURS = ["headline", "learning_curves"]  # the report's own figures
FIGURES = [  # the papers'
    "coco-lm/fig1-5",
    "coco-lm/fig3",
    "coco-lm/fig4",
    "coco-lm/fig7a",
    "coco-lm/fig8",
    "amos/fig3a",
    "amos/fig3b",
    "amos/fig4",
    "teams/fig4",
    "teams/fig5",
]


def project(tmp_path: Path, preset: str) -> tuple[Path, Path]:
    """A project root with params.yaml (the given preset) and an offline data mirror for Fig. 1/5."""
    root, data = tmp_path / "project", tmp_path / "data"
    (data / "glue" / "STS-B").mkdir(parents=True)
    (data / "corpus").mkdir()
    (data / "glue" / "STS-B" / "dev.tsv").write_text(
        "sentence1\tsentence2\tscore\nA man runs.\tA man is running.\t5.000\nA dog.\tA cat.\t1.0\n", encoding="utf-8"
    )
    text = CORPUS.read_text(encoding="utf-8")[:50_000]
    for name in ("wikitext-2-raw_test_nonblank.txt", "enwiki_featured_articles.txt", "enwiki_good_articles_sample.txt"):
        (data / "corpus" / name).write_text(text, encoding="utf-8")
    root.mkdir()
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["preset"] = preset
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    return root, data


@pytest.fixture
def env(monkeypatch, store):
    def use(root: Path, data: Path) -> None:
        monkeypatch.chdir(root)
        monkeypatch.setenv("DVC_ROOT", str(root))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
        monkeypatch.setenv("ELECTRALAB_DATA", str(data))

    return use


def test_stage_writes_every_output_and_logs_the_report(tmp_path, env, store):
    from mlflow import MlflowClient

    root, data = project(tmp_path, "tiny")
    env(root, data)
    stage = load_stage("report")
    stage.run_stage("report", stage.main, ["--params", str(root / "params.yaml"), *ARGS], stage.arguments)

    reports = root / "reports"
    for key in TABLES:
        assert (reports / "tables" / f"{stem(key)}.md").read_text().startswith(f"### {TABLES[key].name} — ours: tiny")
        assert (
            "Data: tiny preset: corpus enwiki_featured_articles.txt, enwiki_good_articles_sample.txt (offline "
            "mirror); 8192-piece uncased BPE; main model 4 layers x 128 hidden (layer 1 on the same-piece prior, "
            "4); 2000 steps (ablation runs: 12 layers x 64 hidden, 1400 steps) x 32 sequences x 128 tokens"
            in (reports / "tables" / f"{stem(key)}.md").read_text()
        )
        csv = pd.read_csv(reports / "tables" / f"{stem(key)}.csv")
        assert (csv["preset"] == "tiny").all()
    for key in [*OURS, *FIGURES]:  # ours, then the papers'
        assert (reports / "figures" / f"{stem(key)}.png").read_bytes().startswith(b"\x89PNG")
    page = (reports / "index.html").read_text()
    # Each table three times: compact, with spread, range and difference behind its <details>, and its claims.
    assert page.count("data:image/png;base64,") == len(OURS) + len(FIGURES) and page.count("<table>") == 3 * len(TABLES)
    assert page.count("<details>") == 2 * len(TABLES)
    assert "| `cocolm_rtd_only` |" in (reports / "report.md").read_text()
    t3 = pd.read_csv(reports / "tables" / "coco-lm_table3.csv")
    rte = t3[(t3["row"] == "CLM w/o. Copy") & (t3["column"] == "RTE")].iloc[0]
    assert pd.isna(rte["ours"]) and rte["published"] == 76.9  # missing stays empty in the CSV
    assert rte["why"] == "RTE: no dev split: glue/RTE/dev.tsv is not in the ELECTRALAB_DATA mirror"  # says why
    assert (t3["ours"].isna() == t3["why"].notna()).all()
    metrics = json.loads((root / "metrics" / "report.json").read_text())
    assert metrics["mnli_m"]["mlm"] == median_of("mlm", "mnli", "accuracy")
    assert "cocolm_no_copy" not in metrics["glue_avg"]  # 7 of 8 tasks: no average
    assert metrics["cells"]["coco-lm/table3"] == {"filled": 98, "total": 120}  # the control row is not filled here

    # The report stage of dvc.yaml: its deps exist, its plots files are the ones written.
    snippet = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    report = snippet["stages"]["report"]
    assert report["always_changed"] is True and report["outs"] == [
        {"reports": {"persist": True}},
        {"metrics/report.json": {"cache": False, "persist": True}},
    ]
    assert snippet["metrics"] == ["metrics"]  # `dvc metrics show` reads every metrics file there is
    assert all((ROOT / d).exists() for d in report["deps"] if not d.startswith("metrics/"))
    for entry in snippet["plots"]:
        if isinstance(entry, str):
            assert (root / entry).is_dir()
            continue
        ((path, spec),) = entry.items()
        columns = pd.read_csv(root / path).columns
        assert spec["x"] in columns and set(spec["y"]) <= set(columns), path

    # MLflow: the report run with the directory as artifacts, one child per (table, row we train).
    client = MlflowClient(store.uri)
    experiment = client.get_experiment_by_name("electralab-tiny").experiment_id
    report_runs = client.search_runs([experiment], "tags.stage = 'report'")
    assert len(report_runs) == 1 and report_runs[0].info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(report_runs[0].info.run_id)} >= {
        "index.html",
        "report.md",
        "tables",
        "figures",
        "plots",
    }
    rows = client.search_runs(
        [experiment], f"tags.stage = '{ROW_STAGE}' and tags.report_latest = 'true' and tags.tables = 'coco-lm/table3'"
    )
    assert len(rows) == 12  # the 11 rows we train and the control
    rtd = [r for r in rows if r.data.tags["run"] == "cocolm_rtd_only"][0]
    assert rtd.data.metrics["CoLA"] == median_of("cocolm_rtd_only", "cola", "mcc")
    assert rtd.data.metrics["published/CoLA"] == 67.3 and rtd.data.metrics["std/CoLA"] == 0.3
    assert rtd.data.tags["mlflow.parentRunId"] == report_runs[0].info.run_id

    # A second build: the filter shows only the newest rows.
    stage.run_stage("report", stage.main, ["--params", str(root / "params.yaml"), *ARGS], stage.arguments)
    assert len(client.search_runs([experiment], "tags.stage = 'report'")) == 2
    latest = client.search_runs(
        [experiment], f"tags.stage = '{ROW_STAGE}' and tags.report_latest = 'true' and tags.tables = 'coco-lm/table3'"
    )
    assert len(latest) == 12 and {r.info.run_id for r in latest}.isdisjoint({r.info.run_id for r in rows})


def test_a_failed_build_leaves_the_previous_report_untouched(tmp_path, env, store, capsys):
    """The `small` experiment's mlm run logged a broken encoder: the build fails at Fig. 1/5, after the
    tables were written into the temporary directory."""
    from mlflow import MlflowClient

    client = MlflowClient(store.uri)
    experiment = client.create_experiment("electralab-small", artifact_location=(tmp_path / "art").as_uri())
    broken = tmp_path / "encoder"
    broken.mkdir()
    (broken / "config.json").write_text('{"format": "something-else"}')
    for name in ("spm.model", "electralab_tokenizer.json"):
        (broken / name).write_bytes((store.vocab_dir / name).read_bytes())
    rid = _run(client, experiment, "mlm", {"run": "mlm", "stage": "pretrain", "preset": "small"}, status="RUNNING")
    client.log_artifacts(rid, str(broken), "encoder")
    client.set_terminated(rid, "FINISHED")

    root, data = project(tmp_path, "small")
    env(root, data)
    (root / "reports").mkdir()
    (root / "reports" / "index.html").write_text("the previous report")
    stage = load_stage("report")
    with pytest.raises(SystemExit) as exit_info:
        stage.run_stage("report", stage.main, ["--params", str(root / "params.yaml"), *ARGS], stage.arguments)
    assert exit_info.value.code == 2
    assert "format='something-else'" in capsys.readouterr().err  # load_encoder's error, one line
    assert [p.name for p in (root / "reports").iterdir()] == ["index.html"]
    assert (root / "reports" / "index.html").read_text() == "the previous report"
    assert not (root / "metrics").exists()
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp-")] == []
    assert client.search_runs([experiment], "tags.stage = 'report'") == []


def test_cli_without_an_experiment_for_the_preset_is_one_line_exit_2(tmp_path, store):
    root, data = project(tmp_path, "base")
    env = {
        **os.environ,
        "DVC_ROOT": str(root),
        "MLFLOW_TRACKING_URI": store.uri,
        "ELECTRALAB_DATA": str(data),
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [sys.executable, str(ROOT / "stages" / "report.py"), *ARGS, "--params", str(root / "params.yaml")]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "no MLflow experiment 'electralab-base' for preset='base'" in error[0]
    assert "Traceback" not in proc.stderr
    assert not (root / "reports").exists()


def test_every_number_comes_from_the_runs_the_workspace_names_not_the_latest(tmp_path, monkeypatch):
    """A store holding the workspace's 100-step `mlm`, a 20-step `dvc exp` of it that only pretrained, and a
    later fine-tuning of a third pretraining: the report shows the numbers of the runs the workspace's
    metrics files name, marks a diverged task failed and says why one could not run; once the experiment's
    pretraining is in the workspace, mlm's fine-tuning (of the other model) is left out as stale."""
    from mlflow import MlflowClient
    from report_helpers import finetune_tags, parent_metrics

    from electralab.io import write_json

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("electralab-tiny", artifact_location=(tmp_path / "art").as_uri())

    def pretrain(steps: int, dvc_exp: str, start: int) -> str:
        tags = {"run": "mlm", "method": "mlm", "stage": "pretrain", "preset": "tiny", "dvc_exp": dvc_exp}
        return _run(client, experiment, "mlm", tags, params={"pretrain.steps": steps}, start=start)

    def parent(task: str, metrics: dict, start: int, **tags) -> str:
        return _run(client, experiment, f"mlm/{task}", {**finetune_tags("mlm", task), **tags}, metrics, start=start)

    base, short, other = pretrain(100, "", 1000), pretrain(20, "short", 2000), pretrain(50, "other", 3000)
    parents = {
        "rte": parent("rte", parent_metrics({"accuracy": 70.0}), 1100),
        "stsb": parent("stsb", {}, 1100, failed_metrics="pearson,spearman"),
        "qqp": parent("qqp", {}, 1100, missing="no dev split: glue/QQP/dev.tsv is not in the mirror"),
    }
    parent("rte", parent_metrics({"accuracy": 99.0}), 3100)  # fine-tuning of `other`: the latest
    root, data = project(tmp_path, "tiny")
    for name, value in (("DVC_ROOT", str(root)), ("MLFLOW_TRACKING_URI", uri), ("ELECTRALAB_DATA", str(data))):
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(root)
    write_json(root / "metrics" / "pretrain" / "mlm.json", {"steps": 100, "mlflow_run_id": base})
    write_json(
        root / "metrics" / "finetune" / "mlm.json",
        {"rte": {"accuracy": 70.0}, "mlflow": {"pretrain_run_id": base, "parents": parents}},
    )
    stage = load_stage("report")

    def cells() -> pd.DataFrame:
        stage.run_stage("report", stage.main, ["--params", str(root / "params.yaml"), *ARGS], stage.arguments)
        table = pd.read_csv(root / "reports" / "tables" / "coco-lm_table1.csv")
        return table[table["run"] == "mlm"].set_index("column")

    mlm = cells()
    assert mlm.loc["RTE", "ours"] == 70.0  # not 99.0, the latest run's
    assert mlm.loc["STS-B", "failed"] and pd.isna(mlm.loc["STS-B", "ours"])
    assert not mlm.loc["RTE", "failed"] and pd.isna(mlm.loc["QQP", "ours"])
    report = (root / "reports" / "report.md").read_text()
    assert f"| `mlm` | {base[:8]} | workspace | 100 |" in report and short[:8] not in report and other[:8] not in report
    assert "- `mlm` qqp: no dev split: glue/QQP/dev.tsv is not in the mirror" in report
    table1 = (root / "reports" / "tables" / "coco-lm_table1.md").read_text()
    assert "| failed / " in table1

    write_json(root / "metrics" / "pretrain" / "mlm.json", {"steps": 20, "mlflow_run_id": short})  # the exp
    mlm = cells()
    assert mlm["ours"].isna().all()
    report = (root / "reports" / "report.md").read_text()
    assert f"| `mlm` | {short[:8]} | short | 20 |" in report and f"| `mlm` | {base[:8]} |" not in report
    assert "`mlm`: its fine-tuning is of another pretraining run than models/mlm (stale" in report
    assert f"mlm {short[:8]} (short)" in (root / "reports" / "index.html").read_text()


def test_a_killed_builds_report_run_is_closed_by_the_next_build(tmp_path):
    from mlflow import MlflowClient

    from electralab.report.build import fetch_results
    from electralab.report.track import log_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_experiment("electralab-tiny", artifact_location=(tmp_path / "art").as_uri())
    results = fetch_results("tiny", uri)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "report.md").write_text("# a report\n")
    killed = client.create_run(results.experiment_id, tags={"stage": "report", "reports_dir": str(reports.resolve())})
    elsewhere = client.create_run(results.experiment_id, tags={"stage": "report", "reports_dir": str(tmp_path / "x")})
    built = log_report(results, reports, {})
    assert client.get_run(killed.info.run_id).info.status == "KILLED"
    assert client.get_run(elsewhere.info.run_id).info.status == "RUNNING"  # another directory's build
    assert client.get_run(built).info.status == "FINISHED"
