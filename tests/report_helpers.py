"""A real SQLite MLflow store for the report tests, created once per session and filled with known
values in the shape docs/tracking.md fixes: pretraining runs (metrics over steps, `pretrain.steps`,
an exported encoder with a real sentencepiece model) and fine-tuning parents (median_/std_/min_/max_).

Known values: the median of (run, task, metric) is `median_of(run, task, metric)`; std 0.3,
min = median - 0.5, max = median + 0.4. Left out on purpose (the tests check they show as missing):
RTE of cocolm_no_copy, every task of cocolm_no_stopgrad and amos_gen12, SQuAD 1.1 (not in the grid).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import VOCAB, WIKITEXT, mirror_root  # noqa: E402  (the shared data fixtures)

CORPUS = mirror_root() / "corpus" / WIKITEXT
VOCAB_SIZE = VOCAB.size  # encoders here use the session vocabulary (conftest.vocab_dir)

# (task, metrics) as the fine-tuning parents log them
TASKS = {
    "mnli": ("accuracy", "accuracy_mm"),
    "qqp": ("accuracy", "f1"),
    "qnli": ("accuracy",),
    "sst2": ("accuracy",),
    "cola": ("mcc",),
    "rte": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearman"),
    "squad2": ("exact", "f1"),
}
BASE = {
    ("mnli", "accuracy"): 60.0,
    ("mnli", "accuracy_mm"): 61.0,
    ("qqp", "accuracy"): 70.0,
    ("qqp", "f1"): 65.0,
    ("qnli", "accuracy"): 58.0,
    ("sst2", "accuracy"): 80.0,
    ("cola", "mcc"): 10.0,
    ("rte", "accuracy"): 52.0,
    ("mrpc", "accuracy"): 68.0,
    ("mrpc", "f1"): 80.0,
    ("stsb", "pearson"): 20.0,
    ("stsb", "spearman"): 19.0,
    ("squad2", "exact"): 50.0,
    ("squad2", "f1"): 51.0,
}

FINETUNED = [
    "mlm",
    "electra",
    "cocolm",
    "cocolm_rtd_only",
    "cocolm_clm_only",
    "cocolm_scl_rtd",
    "cocolm_no_relpos",
    "cocolm_electra_aux",
    "cocolm_random_replace",
    "cocolm_converged_aux",
    "cocolm_all_token_lm",
    "cocolm_no_copy",
    "cocolm_crop70",
    "amos",
    "amos_random_layer",
    "amos_gen4",
    "teams",
    "teams_gen2",
    "teams_sampled_k1",
    "teams_hardest_k1",
]
OFFSET = {run: 0.5 * i for i, run in enumerate(FINETUNED)}
# The ablation tables' base rows (runs *_ablation) carry the same values as the main rows they repeat.
ABLATION_BASES = ("mlm", "electra", "cocolm", "amos", "teams")
FINETUNED += [f"{run}_ablation" for run in ABLATION_BASES]
OFFSET |= {f"{run}_ablation": OFFSET[run] for run in ABLATION_BASES}
MISSING = {("cocolm_no_copy", "rte")}
SEEDED = {"mlm", "electra", "cocolm"}  # parents that also log their per-seed values (the claim checks)
STEPS = 200
ENCODER_RUNS = ("mlm", "electra", "cocolm")
# The runs the store holds pretraining curves for (populate), which the figures' tests read back.
HISTORY_RUNS = (
    "mlm",
    "electra",
    "cocolm",
    "cocolm_clm_only",
    "cocolm_all_token_lm",
    "amos",
    "amos_gen4",
    "cocolm_ablation",
    "amos_ablation",
)


def median_of(run: str, task: str, metric: str) -> float:
    return BASE[(task, metric)] + OFFSET[run]


@dataclass
class Store:
    uri: str
    root: Path
    vocab_dir: Path  # a real vocabulary (the vocab stage on a slice of the mirror)


def tiny_encoder(vocab: int, seed: int):
    import torch

    from electralab.config import EncoderConfig
    from electralab.model.encoder import Encoder, make_token_embedding

    torch.manual_seed(seed)
    cfg = EncoderConfig(
        hidden=16,
        layers=2,
        heads=2,
        ffn=32,
        embedding=16,
        max_positions=64,
        relative_buckets=8,
        relative_max_distance=16,
    )
    return Encoder(cfg, make_token_embedding(vocab, cfg.embedding))


def _run(
    client,
    experiment: str,
    name: str,
    tags: dict,
    metrics: dict | None = None,
    params: dict | None = None,
    status: str = "FINISHED",
    start: int | None = None,
) -> str:
    from mlflow.entities import Metric, Param

    run = client.create_run(experiment, run_name=name, tags=tags, start_time=start)
    now = int(time.time() * 1000)
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, v, now, 0) for k, v in (metrics or {}).items()],
        params=[Param(k, str(v)) for k, v in (params or {}).items()],
    )
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id


def parent_metrics(median: dict[str, float], seeds: bool = False) -> dict[str, float]:
    """The parent's statistics; with `seeds`, also seed<k>_<metric> = median + 0.1 (k - 3) for seeds 1-5."""
    out = {}
    for metric, m in median.items():
        out |= {f"median_{metric}": m, f"std_{metric}": 0.3, f"min_{metric}": m - 0.5, f"max_{metric}": m + 0.4}
        if seeds:
            out |= {f"seed{k}_{metric}": m + 0.1 * (k - 3) for k in range(1, 6)}
    return out


def finetune_tags(run: str, task: str, checkpoint: str = "final") -> dict:
    return {
        "run": run,
        "method": run.split("_")[0],
        "tables": "",
        "preset": "tiny",
        "stage": "finetune",
        "task": task,
        "checkpoint": checkpoint,
        "label_fraction": "1.0",
        "seed": "1",
    }


# What train/loop.py tags a pretraining run with for its provenance (the report's provenance.csv)
PROVENANCE_TAGS = {"git_sha": "0123456789abcdef", "precision": "bf16", "machine": "Test CPU", "load_at_start": "1.5"}


def populate(client, experiment: str, vocab_dir: Path, work: Path) -> None:
    from mlflow.entities import Metric

    from electralab.export import save_encoder

    t0 = int(time.time() * 1000) - 10_000_000
    # Pretraining runs: metrics over steps every 10 steps, hours linear in the step.
    for i, run in enumerate(HISTORY_RUNS):
        rid = _run(
            client,
            experiment,
            run,
            {"run": run, "method": run.split("_")[0], "tables": "", "preset": "tiny", "stage": "pretrain", "seed": "1"}
            | PROVENANCE_TAGS,
            params={"pretrain.steps": STEPS},
            status="RUNNING",
            start=t0 + i,
        )
        series = {
            "wall_hours": lambda s, i=i: s / STEPS * (1.0 + i),
            "device_hours": lambda s, i=i: s / STEPS * (1.0 + i),
            "heldout_token_cosine": lambda s, i=i: 0.9 - s / 1000 - i / 100,
        }
        if run.split("_")[0] in ("electra", "amos"):  # an RTD detector, at its base rate until step 100
            series["heldout_rtd_base_rate_gain"] = lambda s: max(0.0, (s - 100) / 1000)
        if run.startswith("cocolm"):
            series |= {
                "heldout_copy_base_rate_gain": lambda s: s / 2000,
                "scl_pos_cos": lambda s: 0.5 + s / 1000,
                "scl_neg_cos": lambda s: 0.4 - s / 2000,
                "copy_acc_replaced": lambda s: s / 400,
                "copy_acc_original": lambda s: 0.9,
                "clm_acc_replaced": lambda s: s / 800,
                "clm_acc_original": lambda s: 0.95,
            }
        if run.startswith("amos"):
            series |= {
                "rtd_acc_replaced": lambda s: 0.2 + s / 500,
                **{f"mix_weight_exit{d}": (lambda s, d=d: 1 / 3 + (d - 6) * s / 6000) for d in (4, 6, 8)},
            }
        client.log_batch(
            rid,
            metrics=[
                Metric(name, f(step), t0, step) for name, f in series.items() for step in range(10, STEPS + 1, 10)
            ],
        )
        if run in ENCODER_RUNS:
            enc_dir = work / f"encoder-{run}"
            save_encoder(tiny_encoder(VOCAB_SIZE, seed=i), enc_dir, vocab_dir)
            client.log_artifacts(rid, str(enc_dir), "encoder")
        client.log_batch(rid, metrics=[Metric("final_wall_hours", 1.0 + i, t0, 0)])
        client.set_terminated(rid, "FINISHED")

    # Fine-tuning parents of the finished pretraining runs.
    for run in FINETUNED:
        for task, metrics in TASKS.items():
            if (run, task) in MISSING:
                continue
            medians = {m: median_of(run, task, m) for m in metrics}
            _run(
                client,
                experiment,
                f"{run}/{task}",
                finetune_tags(run, task),
                parent_metrics(medians, seeds=run in SEEDED),
                start=t0 + 100,
            )
    # A later re-run of (cocolm, mnli) wins over the first; a still later FAILED one does not count.
    _run(
        client,
        experiment,
        "cocolm/mnli",
        finetune_tags("cocolm", "mnli"),
        parent_metrics({"accuracy": 66.6, "accuracy_mm": 67.7}),
        start=t0 + 200,
    )
    _run(
        client,
        experiment,
        "cocolm/mnli",
        finetune_tags("cocolm", "mnli"),
        parent_metrics({"accuracy": 1.0, "accuracy_mm": 1.0}),
        status="FAILED",
        start=t0 + 300,
    )
    # MNLI on checkpoints at 25/50/75% of pretraining (COCO-LM Fig. 3, AMOS Fig. 4).
    for run in ("cocolm", "amos"):
        for k, checkpoint in enumerate(("025", "050", "075")):
            _run(
                client,
                experiment,
                f"{run}/mnli@{checkpoint}",
                finetune_tags(run, "mnli", checkpoint),
                parent_metrics({"accuracy": 40.0 + 5 * k, "accuracy_mm": 41.0 + 5 * k}),
                start=t0 + 100,
            )


COCOLM_MNLI = 66.6  # the re-run's value


@pytest.fixture(scope="session")
def store(tmp_path_factory, vocab_dir) -> Store:
    """The populated store (experiment electralab-tiny). Tests may add report runs (the report never
    reads them back) and other presets' experiments, nothing else."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("electralab-tiny", artifact_location=(root / "artifacts").as_uri())
    populate(client, experiment, vocab_dir, root)
    return Store(uri, root, vocab_dir)
