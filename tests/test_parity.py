"""Parity with transformers at MINI size: from identical weights (our Hugging Face export mapping) on
identical real batches, our ELECTRA and MLM give the same first outputs as transformers' ELECTRA pair /
BertForMaskedLM and follow their loss curves within bench/parity.py's TOLERANCE; a wrong mapping or a
different learning rate is caught. The bench at the default shape: bench/parity.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from electralab.config import EncoderConfig, GeneratorSize, GeneratorSizes
from electralab.data.loader import PretrainLoader
from electralab.objectives import method_settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import parity  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

MINI = EncoderConfig(hidden=32, layers=2, heads=2, ffn=64, embedding=32, max_positions=64)
GENERATORS = GeneratorSizes(electra=GeneratorSize(hidden=16, heads=1, ffn=32))
STEPS, BATCH = 80, 8
SCHEDULE = parity.Schedule(steps=STEPS, lr=2e-3, warmup_steps=8)


def batches(shards_dir: Path, method: str):
    return PretrainLoader(
        shards_dir, "train", micro_batch_size=BATCH, seed=1, masking=method_settings(method, None).masking
    )


def pair(method: str, shards_dir: Path):
    return parity.build_pair(method, MINI, GENERATORS, batches(shards_dir, method).vocab_size)


@pytest.mark.parametrize("method", ["electra", "mlm"])
def test_identical_first_forward(method, shards_dir):
    ours, peer = pair(method, shards_dir)
    assert parity.count_trainable(ours) == parity.count_trainable(peer)
    first = next(iter(batches(shards_dir, method)))
    out = parity.initial_outputs(ours, peer, first)
    assert parity.first_forward_deviation(out, method) < parity.INITIAL_TOLERANCE, out
    if method == "electra":  # the same tokens were sampled, so the same ones count as replaced
        assert out["electralab"]["replaced_fraction"] == out["transformers"]["replaced_fraction"] > 0


def test_a_wrong_mapping_is_caught(shards_dir):
    """The fused QKV split in the wrong order (key and value of one generator layer swapped): the
    generator's outputs disagree, although its loss, near ln(V) at initialisation whatever the weights,
    barely moves. (A correct mapping gives bit-identical outputs.)"""
    ours, peer = pair("electra", shards_dir)
    attention = peer.gen.electra.encoder.layer[1].attention.self
    with torch.no_grad():
        key = attention.key.weight.clone()
        attention.key.weight.copy_(attention.value.weight)
        attention.value.weight.copy_(key)
    out = parity.initial_outputs(ours, peer, next(iter(batches(shards_dir, "electra"))))
    assert out["outputs"]["gen_logits"] > 100 * parity.INITIAL_TOLERANCE, out
    assert out["outputs"]["rtd_logits"] < parity.INITIAL_TOLERANCE  # the discriminator is untouched


@pytest.mark.parametrize("method", ["electra", "mlm"])
def test_loss_curves_follow_transformers(method, shards_dir):
    ours, peer = pair(method, shards_dir)
    curves = parity.train_side_by_side(ours, peer, iter(batches(shards_dir, method)), SCHEDULE)
    result = parity.compare(curves, method)
    assert result["within_tolerance"], result
    losses = curves["electralab"]["loss"]
    assert losses[-1] < 0.9 * losses[0]  # it trained: a curve that stays put would match trivially


@pytest.mark.parametrize("method", ["electra", "mlm"])
def test_a_different_learning_rate_exceeds_the_tolerance(method, shards_dir):
    """The same comparison with the peer's learning rate 20% higher fails: the tolerance can be missed."""
    ours, peer = pair(method, shards_dir)
    curves = parity.train_side_by_side(
        ours, peer, iter(batches(shards_dir, method)), SCHEDULE, peer_lr=1.2 * SCHEDULE.lr
    )
    devs = {k: parity.deviation(curves, k) for k in parity.PARTS[method]}  # the curves alone, not the samplers
    assert not parity.within_tolerance(devs, method), devs
