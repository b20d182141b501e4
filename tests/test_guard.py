"""The collapse guard (src/electralab/train/diagnostics.py): its measures, its verdicts, and a real run
collapsed on purpose that the loop stops by name, fails in MLflow and leaves no model behind."""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch
from project_helpers import copy_project, run, shrink, stage_args
from test_pretrain import mlflow_client, mlflow_env

from electralab.config import GuardConfig
from electralab.train.diagnostics import (
    HeldOut,
    attention_entropy,
    attention_inputs,
    binary_entropy,
    collapse,
    guard_active,
    token_cosine,
)


def test_token_cosine_is_one_for_one_vector_and_zero_for_orthogonal_ones_and_skips_padding():
    mask = torch.tensor([[True, True, True, False]])
    same = torch.ones(1, 4, 8)
    same[0, 3] = -5.0  # a [PAD] position: not counted
    assert token_cosine(same, mask) == pytest.approx(1.0)
    orthogonal = torch.eye(8)[:4].unsqueeze(0)
    assert token_cosine(orthogonal, mask) == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(token_cosine(same, torch.tensor([[True, False, False, False]])))


def test_attention_entropy_is_one_for_even_attention_over_the_real_keys_and_falls_as_attention_picks():
    from electralab.config import EncoderConfig
    from electralab.model.encoder import Encoder, make_token_embedding

    torch.manual_seed(0)
    cfg = EncoderConfig(hidden=16, layers=2, heads=2, ffn=32, embedding=16, max_positions=32, relative_positions=False)
    encoder = Encoder(cfg, make_token_embedding(100, 16))
    ids = torch.randint(5, 100, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False  # padding: the second input has 7 real keys

    def measured() -> list[float]:
        with attention_inputs(encoder) as calls:
            encoder(ids, mask)
        return [attention_entropy(*call, mask) for call in calls]

    assert len(measured()) == 2 and not encoder.layers[0].attention._forward_pre_hooks  # recorded, then unhooked
    for layer in encoder.layers:  # q = k = 0: every query spreads evenly over its input's real keys only
        torch.nn.init.zeros_(layer.attention.qkv.weight)
        torch.nn.init.zeros_(layer.attention.qkv.bias)
    assert measured() == pytest.approx([1.0, 1.0], abs=1e-5)
    for layer in encoder.layers:  # large random q and k: each query picks a few keys
        torch.nn.init.normal_(layer.attention.qkv.weight, std=3.0)
    assert max(measured()) < 0.5


def test_binary_entropy_is_the_loss_of_predicting_the_base_rate():
    p = 0.15
    base_rate_bce = torch.nn.functional.binary_cross_entropy(torch.full((1000,), p), (torch.arange(1000) < 150).float())
    assert binary_entropy(p) == pytest.approx(float(base_rate_bce), rel=1e-5)
    assert binary_entropy(0.0) == 0.0 and binary_entropy(1.0) == 0.0


HEALTHY = {
    "token_cosine": 0.45,
    "rtd_base_rate_gain": 0.20,
    "rtd_acc_replaced": 0.31,
    "mlm_acc": 0.2,
    "mlm_unigram_gain": 0.15,
}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"token_cosine": 0.995}, "one vector for every token"),
        ({"rtd_base_rate_gain": 0.005, "rtd_acc_replaced": 0.0}, "rtd detector predicts only the base rate"),
        ({"copy_base_rate_gain": -0.01}, "copy detector predicts only the base rate"),
        ({"mlm_acc": 0.05, "mlm_unigram_gain": 0.0}, "no better than guessing the most frequent token"),
    ],
)
def test_each_rule_names_what_collapsed(change, words):
    guard = GuardConfig()
    assert collapse(HEALTHY, guard) is None
    assert words in collapse({**HEALTHY, **change}, guard)


def test_the_guard_judges_only_after_warmup_and_its_fraction_of_training():
    guard = GuardConfig(after=0.25)
    assert not guard_active(step=100, steps=1000, warmup_steps=50, guard=guard)  # before 25%
    assert not guard_active(step=300, steps=1000, warmup_steps=400, guard=guard)  # still warming up
    assert guard_active(step=400, steps=1000, warmup_steps=400, guard=guard)
    assert not guard_active(step=900, steps=1000, warmup_steps=0, guard=dataclasses.replace(guard, enabled=False))


def test_measuring_restores_train_mode_and_random_state(shards_dir):
    from electralab.config import EncoderConfig, GeneratorSize, GeneratorSizes
    from electralab.objectives.electra import Electra, Settings

    torch.manual_seed(0)
    cfg = EncoderConfig(hidden=16, layers=2, heads=1, ffn=32, embedding=16, max_positions=128)
    objective = Electra(cfg, GeneratorSizes(electra=GeneratorSize(hidden=8, heads=1, ffn=16)), 1000, Settings())
    heldout = HeldOut.from_shards(shards_dir, Settings().masking, 2, 4, 1, torch.device("cpu"))
    objective.train()
    state = torch.random.get_rng_state()
    first = heldout.measure(objective, "fp32")
    assert objective.training and torch.equal(state, torch.random.get_rng_state())
    assert first == heldout.measure(objective, "fp32")  # the same numbers every time
    assert {"token_cosine", "rtd_loss", "rtd_base_rate_gain", "gen_acc", "detector_unigram_gain"} <= set(first)
    entropies = [first[f"attention_entropy_{layer}"] for layer in (1, 2)]  # the main encoder's 2 layers
    assert "attention_entropy_3" not in first and all(0.0 < e <= 1.0 for e in entropies)
    assert first["attention_entropy"] == pytest.approx(sum(entropies) / 2)
    assert 0.0 < heldout.unigram_accuracy < 0.5
    with torch.no_grad():  # the position map: bucket 0 is the token itself, 1 the one before, 17 the one after
        objective.discriminator.relative_bias.bias.weight[[0, 1, 17], 0] = torch.tensor([-0.5, 2.0, 1.5])
    bias = heldout.measure(objective, "fp32")
    assert (bias["position_bias_previous"], bias["position_bias_self"], bias["position_bias_next"]) == (2.0, -0.5, 1.5)


def test_the_fixed_corruption_replaces_only_masked_positions_with_real_words_drawn_the_same_each_time(shards_dir):
    from electralab import SPECIAL_TOKENS
    from electralab.objectives.electra import Settings

    def build():
        return HeldOut.from_shards(shards_dir, Settings().masking, 2, 4, 1, torch.device("cpu"))

    heldout, again = build(), build()
    for batch, corrupted, same in zip(heldout.batches, heldout.unigram_corrupted, again.unigram_corrupted):
        assert torch.equal(corrupted, same)
        assert torch.equal(corrupted[~batch.mlm_mask], batch.input_ids[~batch.mlm_mask])
        drawn = corrupted[batch.mlm_mask]
        assert bool((drawn >= len(SPECIAL_TOKENS)).all())
        assert (drawn != batch.input_ids[batch.mlm_mask]).float().mean() > 0.9  # nearly all really replaced


@pytest.mark.parametrize("method", ["electra", "cocolm", "amos", "teams"])
def test_every_detector_scores_the_fixed_corruption_and_an_oracle_gains_everything(shards_dir, method):
    """Each method's detect() is its binary detector (COCO-LM's copy head negated); a detector that knows
    which tokens were drawn gains ~1, one that predicts each batch's replaced share everywhere gains ~0."""
    from helpers import tiny_generators, tiny_model

    from electralab.objectives import METHODS, build_objective

    torch.manual_seed(0)
    cfg, sizes = tiny_model(max_positions=128), tiny_generators()
    settings = METHODS[method].Settings()
    objective = build_objective(method, settings, cfg, sizes, 1000)
    heldout = HeldOut.from_shards(shards_dir, settings.masking, 2, 4, 1, torch.device("cpu"))
    ids, mask = heldout.unigram_corrupted[0], heldout.batches[0].attention_mask
    assert objective.detect(ids, mask).shape == ids.shape
    assert math.isfinite(heldout.measure(objective, "fp32")["detector_unigram_gain"])

    replaced = [c != b.input_ids for b, c in zip(heldout.batches, heldout.unigram_corrupted)]
    oracle = iter([torch.where(r, 20.0, -20.0) for r in replaced])
    objective.detect = lambda ids, mask: next(oracle)
    assert heldout.measure(objective, "fp32")["detector_unigram_gain"] > 0.99
    shares = [float(r[b.attention_mask].float().mean()) for r, b in zip(replaced, heldout.batches)]
    base_rate = iter([torch.full(r.shape, math.log(p / (1 - p))) for r, p in zip(replaced, shares)])
    objective.detect = lambda ids, mask: next(base_rate)
    assert abs(heldout.measure(objective, "fp32")["detector_unigram_gain"]) < 1e-3
    mlm = build_objective("mlm", METHODS["mlm"].Settings(), cfg, sizes, 1000)
    assert "detector_unigram_gain" not in heldout.measure(mlm, "fp32")


@pytest.mark.slow
def test_a_run_collapsed_on_purpose_stops_by_name_fails_in_mlflow_and_leaves_no_model(tmp_path):
    """ELECTRA at a learning rate far too high for its width (the regime the issue found): the final layer
    turns into one vector within a few dozen steps. The stage exits 2 naming the collapse."""
    project = copy_project(tmp_path / "project")
    shrink(
        project,
        steps=60,
        lr=5e-3,
        warmup_steps=2,
        checkpoint_every=20,
        log_every=10,
        guard={"enabled": True, "every": 10, "after": 0.5, "batches": 2},
    )
    env = mlflow_env(project, tmp_path / "mlflow.db")
    for stage in ("corpus", "vocab", "shards"):
        assert run([sys.executable, *stage_args(stage)], project, env).returncode == 0
    proc = run([sys.executable, *stage_args("pretrain", "electra")], project, env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: run electra collapsed at step" in proc.stderr and "Traceback" not in proc.stderr
    assert not (project / "models" / "electra").exists()
    assert not (project / "metrics" / "pretrain" / "electra.json").exists()
    client = mlflow_client(tmp_path / "mlflow.db")
    failed = client.search_runs([client.get_experiment_by_name("electralab-tiny").experiment_id])[0]
    assert failed.info.status == "FAILED" and "RepresentationCollapsed" in failed.data.tags["error"]
    cosines = client.get_metric_history(failed.info.run_id, "heldout_token_cosine")
    assert min(m.value for m in cosines if m.step == 0) < 0.5  # not collapsed at initialisation
    # The report names the broken run instead of showing it.
    from electralab.report import build_report

    report = build_report("tiny", tmp_path / "reports", f"sqlite:///{tmp_path / 'mlflow.db'}")
    text = (tmp_path / "reports" / "report.md").read_text()
    assert (
        "Not in any table: run electra, whose pretraining failed (RepresentationCollapsed: run electra "
        "collapsed at step" in text
    )
    assert report["tables"]["coco-lm/table1"].frame.query("run == 'electra'")["ours"].isna().all()


@pytest.mark.parametrize("qk_norm", [False, True])
def test_the_recomputed_attention_is_the_attention_the_layer_applies(qk_norm):
    from electralab.config import EncoderConfig
    from electralab.model.encoder import Encoder, make_token_embedding
    from electralab.train.diagnostics import attention_probs

    torch.manual_seed(0)
    cfg = EncoderConfig(hidden=16, layers=2, heads=2, ffn=32, embedding=16, max_positions=32, qk_norm=qk_norm)
    encoder = Encoder(cfg, make_token_embedding(100, 16)).eval()
    for layer in encoder.layers:  # attention that picks, so a missed norm or bias shows
        torch.nn.init.normal_(layer.attention.qkv.weight, std=1.0)
    ids, mask = torch.randint(5, 100, (2, 12)), torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False
    with attention_inputs(encoder) as calls:
        encoder(ids, mask)
    for attention, x, bias in calls:
        B, T, H = x.shape
        v = attention.qkv(x).view(B, T, 3, cfg.heads, H // cfg.heads)[:, :, 2].transpose(1, 2)
        mixed = (attention_probs(attention, x, bias) @ v).transpose(1, 2).reshape(B, T, H)
        assert torch.allclose(attention.out(mixed), attention(x, bias), atol=1e-5)
