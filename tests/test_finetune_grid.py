"""The grid protocol without Ray: configurations, the median per configuration and the best one, the
spread of its seeds, the result store that resume relies on, the per-run plan (efficiency checkpoints
and few-shot fractions from the run's tables) and the metrics file."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import ROOT

from electralab.config import FinetuneConfig, SearchSpace, load_params
from electralab.errors import ConfigError, DataError
from electralab.finetune.grid import FINAL, Group, HParams, ResultStore, TrialSpec, configurations, select
from electralab.finetune.protocol import plan, summarize
from electralab.finetune.tasks import TASKS
from electralab.io import fingerprint, source_digest, write_json
from electralab.runs import resolve_run

PARAMS = load_params(ROOT / "params.yaml")
TINY: FinetuneConfig = PARAMS.presets["tiny"].finetune


def test_configurations_are_the_full_product_in_a_fixed_order():
    space = SearchSpace(lr=(2e-5, 3e-5), epochs=(2, 3, 5), batch_size=(16, 32), warmup=(0.06, 0.1))
    configs = configurations(space)
    assert len(configs) == 24 and len(set(configs)) == 24
    assert configs[0] == HParams(2e-5, 2, 16, 0.06) and configs[-1] == HParams(3e-5, 5, 32, 0.1)
    base = PARAMS.presets["base"].finetune.grids
    # COCO-LM Table 7: small tasks 4 x 4 x 2 x 2, large tasks 4 x 3; Table 8 (SQuAD): 4 x 2 x 2 x 2
    assert [len(configurations(g)) for g in (base.glue_small, base.glue_large, base.squad2)] == [64, 12, 32]


def test_a_tasks_own_epochs_replace_its_groups():
    # The tiny preset fine-tunes as ELECTRA does: STS-B and RTE 10 epochs, the other small tasks 3.
    assert TINY.search_space(TASKS["stsb"]).epochs == (10,)
    assert TINY.search_space(TASKS["rte"]).epochs == (10,)
    assert TINY.search_space(TASKS["cola"]) == TINY.grids.glue_small
    assert TINY.grids.glue_small.epochs == (3,)
    # Only the epochs change: one configuration per task still, the same rate, batch and warm-up.
    stsb = configurations(TINY.search_space(TASKS["stsb"]))
    assert stsb == [dataclasses.replace(configurations(TINY.grids.glue_small)[0], epochs=10)]


def finals(values: dict[HParams, list[float]], extra: float = 0.0) -> dict[TrialSpec, dict[str, float]]:
    return {
        TrialSpec(Group("rte"), hp, seed): {"accuracy": v, "other": v + extra}
        for hp, vs in values.items()
        for seed, v in enumerate(vs, start=1)
    }


def test_the_best_median_wins_and_reports_its_seeds_spread():
    a, b, c = HParams(1e-5, 2, 32, 0.06), HParams(2e-5, 2, 32, 0.06), HParams(3e-5, 2, 32, 0.06)
    # a has the best single seed but a worse median than b; c's median is NaN (a diverged seed)
    values = {a: [90.0, 50.0, 51.0, 52.0, 53.0], b: [60.0, 61.0, 59.0, 62.0, 58.0], c: [70.0, np.nan, 70, 70, 70]}
    selection = select(finals(values, extra=1.0), [a, b, c], "accuracy")
    assert selection.best == b
    assert selection.stats["median_accuracy"] == 60.0 and selection.stats["median_other"] == 61.0
    assert selection.stats["std_accuracy"] == pytest.approx(np.std([60, 61, 59, 62, 58]))
    assert (selection.stats["min_accuracy"], selection.stats["max_accuracy"]) == (58.0, 62.0)
    table = selection.medians
    assert table["config"].tolist() == [a.name, b.name, c.name] and table["seeds"].tolist() == [5, 5, 5]
    assert table["accuracy"].tolist()[:2] == [52.0, 60.0] and np.isnan(table["accuracy"].tolist()[2])


def test_ties_go_to_the_earlier_configuration_and_even_seed_counts_average():
    a, b = HParams(1e-5, 2, 32, 0.06), HParams(2e-5, 2, 32, 0.06)
    selection = select(finals({b: [50.0, 52.0], a: [51.0, 51.0]}), [a, b], "accuracy")
    assert selection.best == a and selection.stats["median_accuracy"] == 51.0
    with pytest.raises(ValueError, match="no trial reported 'mcc'"):
        select(finals({a: [1.0]}), [a], "mcc")


def test_result_store_keeps_finished_trials_for_their_fingerprint(tmp_path):
    store = ResultStore(tmp_path)
    spec = TrialSpec(Group("mnli", "050", 0.1), HParams(1e-3, 2, 32, 0.1), 3)
    assert spec.key == "mnli@ckpt050@labels0.1/lr=0.001,epochs=2,bs=32,warmup=0.1/seed=3"
    assert TrialSpec.from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
    assert store.get(spec, "fp1") is None
    store.put(spec, {"fingerprint": "fp1", "history": [{"epoch": 1, "accuracy": 50.0}]})
    assert store.get(spec, "fp1")["history"][0]["accuracy"] == 50.0
    assert store.get(spec, "fp2") is None  # other inputs: run it again
    store.path(spec).write_text("{truncated", encoding="utf-8")
    assert store.get(spec, "fp1") is None  # a torn file is not a result
    assert fingerprint("a", 1) == fingerprint("a", 1) != fingerprint("a", 2)


def model_dir(tmp_path, fractions=(0.25, 0.5, 1.0)):
    root = tmp_path / "models" / "run"
    (root / "encoder").mkdir(parents=True)
    (root / "encoder" / "config.json").write_text("{}", encoding="utf-8")
    write_json(root / "summary.json", {"wall_hours": 2.0, "device_hours": 4.0, "loss": 1.0})
    for f in fractions:
        (root / "fractions" / f"{round(f * 100):03d}").mkdir(parents=True)
        write_json(
            root / "fractions" / f"{round(f * 100):03d}" / "meta.json",
            {"fraction": f, "step": 1, "wall_hours": f, "device_hours": 2 * f},
        )
    return root


def test_the_source_digest_changes_with_any_module_of_the_library(tmp_path):
    import shutil
    from pathlib import Path

    import electralab

    package = tmp_path / "electralab"
    shutil.copytree(Path(electralab.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_digest(package)
    assert before == source_digest() == source_digest(package)  # the same sources, wherever they are
    trial = package / "finetune" / "trial.py"
    trial.write_text(trial.read_text() + "\n# an edit\n")
    assert source_digest(package) != before


def test_plan_adds_the_extras_of_the_runs_tables(tmp_path):
    root = model_dir(tmp_path)
    cocolm = plan(resolve_run(PARAMS, "cocolm"), TINY, root)  # coco-lm/fig3: MNLI on its checkpoints
    keys, n = [g.key for g in cocolm.groups], len(TINY.tasks)
    assert keys[:n] == list(TINY.tasks)
    assert keys[n:] == ["mnli@ckpt025", "stsb@ckpt025", "mnli@ckpt050", "stsb@ckpt050"]  # + STS-B: equal compute
    ablation = plan(resolve_run(PARAMS, "cocolm_ablation"), TINY, root)  # coco-lm/fig7: MNLI on fractions of its labels
    assert [g.key for g in ablation.groups][n:] == ["mnli@labels0.01", "mnli@labels0.1", "mnli@labels0.2"]
    assert cocolm.hours == {
        FINAL: {"wall_hours": 2.0, "device_hours": 4.0},
        "025": {"wall_hours": 0.25, "device_hours": 0.5},
        "050": {"wall_hours": 0.5, "device_hours": 1.0},
    }
    assert set(cocolm.encoders) == {FINAL, "025", "050"}  # 100% is the final encoder
    assert [g.key for g in plan(resolve_run(PARAMS, "amos"), TINY, root).groups][n:] == keys[n:]
    assert len(plan(resolve_run(PARAMS, "teams"), TINY, root).groups) == n
    bare = plan(resolve_run(PARAMS, "mlm"), TINY, model_dir(tmp_path / "bare", fractions=()))
    assert list(bare.missing) == ["mnli@checkpoints", "stsb@checkpoints"] and len(bare.groups) == n
    assert "no pretraining fraction checkpoints" in bare.missing["mnli@checkpoints"]


def test_plan_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match=r"no exported encoder; run the pretraining first \(dvc repro pretrain@mlm\)"):
        plan(resolve_run(PARAMS, "mlm"), TINY, tmp_path / "nothing")
    cfg = dataclasses.replace(TINY, tasks=("rte",))
    with pytest.raises(ConfigError, match="'mnli' is not in finetune.tasks"):
        plan(resolve_run(PARAMS, "cocolm"), cfg, model_dir(tmp_path))


def test_metrics_file_layout():
    def selection(**medians):
        hp = HParams(1e-3, 2, 32, 0.1)
        spec = {TrialSpec(Group("x"), hp, 1): medians}
        return select(spec, [hp], next(iter(medians)))

    glue = {
        "mnli": selection(accuracy=40.0, accuracy_mm=41.0),
        "qqp": selection(accuracy=70.0, f1=60.0),
        "qnli": selection(accuracy=50.0),
        "sst2": selection(accuracy=80.0),
        "cola": selection(mcc=10.0),
        "rte": selection(accuracy=55.0),
        "mrpc": selection(accuracy=68.0, f1=80.0),
        "stsb": selection(spearman=20.0, pearson=np.nan),
    }
    out = summarize(
        {Group(t): s for t, s in glue.items()}
        | {Group("mnli", "050"): glue["mnli"], Group("mnli", label_fraction=0.01): glue["mnli"]},
        {"squad2": "no dev split"},
        12.34,
    )
    assert out["mnli"] == {"accuracy": 40.0, "accuracy_mm": 41.0}
    assert out["stsb"] == {"spearman": 20.0, "pearson": None}  # undefined stays null, never 0
    assert out["glue_avg"] == pytest.approx((40 + 70 + 50 + 80 + 10 + 55 + 68 + 20) / 8)
    assert out["checkpoints"] == {"050": {"mnli": out["mnli"]}}
    assert out["label_fractions"] == {"0.01": {"mnli": out["mnli"]}}
    assert out["missing"] == {"squad2": "no dev split"} and out["trials"] == 10 and out["seconds"] == 12.3
    del glue["qqp"]
    assert "glue_avg" not in summarize({Group(t): s for t, s in glue.items()}, {}, 1.0)
    json.dumps(out, allow_nan=False)
