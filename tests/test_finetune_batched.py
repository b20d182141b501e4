"""Fine-tuning trials trained together (finetune/batched.py) against the one-trial path (finetune/trial.py).

Same task data, same encoder, same configurations and seeds: with dropout off the two are the same arithmetic in
another order (a batched matmul, AdamW written out on stacked weights), so over a few dozen steps in fp32 every
epoch's training loss agrees within LOSS_TOLERANCE (relative) and every dev metric within METRIC_TOLERANCE points
(of 100: a tiny model's STS-B predictions are nearly constant, and a correlation of such outputs amplifies the float
differences a hundredfold).
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
from conftest import ROOT, mirror_root
from report_helpers import tiny_encoder

from electralab.config import load_params
from electralab.data.vocab import Tokenizer
from electralab.finetune.batched import run_trials
from electralab.finetune.data import prepare
from electralab.finetune.grid import HParams
from electralab.finetune.tasks import TASKS
from electralab.finetune.trial import TrialSettings, run_trial
from electralab.model.encoder import set_dropout

pytestmark = pytest.mark.usefixtures("single_thread")
LOSS_TOLERANCE = 1e-4
METRIC_TOLERANCE = 0.05  # a twentieth of a point: tables print one decimal


def task(vocab_dir, name: str, examples: int = 48):
    cfg = dataclasses.replace(
        load_params(ROOT / "params.yaml").presets["tiny"].finetune,
        max_seq_len=64,
        max_train_examples=examples,
        max_eval_examples=32,
        precision="fp32",
    )
    settings = dataclasses.replace(TrialSettings.of(cfg), eval_every_epoch=True)
    return prepare(TASKS[name], Tokenizer(vocab_dir), cfg, mirror_root())[1.0], settings


@pytest.mark.parametrize("name", ["sst2", "stsb"])  # a classification and the regression head
def test_trials_trained_together_equal_each_trial_trained_alone(vocab_dir, name):
    data, settings = task(vocab_dir, name)
    encoder = tiny_encoder(Tokenizer(vocab_dir).vocab_size, 0)
    set_dropout(encoder, 0.0)
    encoder.cfg = dataclasses.replace(encoder.cfg, dropout=0.0)  # the task head's dropout too
    hps = [HParams(1e-3, 2, 16, 0.1), HParams(3e-3, 2, 16, 0.0), HParams(1e-3, 2, 16, 0.1)]
    seeds = [1, 1, 2]  # a learning rate apart, a seed apart
    together = run_trials(data, encoder, hps, seeds, settings)
    for hp, seed, batched in zip(hps, seeds, together):
        alone = run_trial(data, copy.deepcopy(encoder), hp, seed, settings)
        assert [h["epoch"] for h in batched] == [h["epoch"] for h in alone] == [1, 2]
        for b, a in zip(batched, alone):
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=LOSS_TOLERANCE), (hp, seed)
            for key in (k for k in a if k not in ("epoch", "train_loss", "seconds", "threads")):
                assert b[key] == pytest.approx(a[key], abs=METRIC_TOLERANCE), (hp, seed, key)
    assert together[0][-1]["train_loss"] != together[2][-1]["train_loss"]  # the seeds' trials differ


def test_clipping_is_per_trial_and_the_trials_must_share_their_steps(vocab_dir):
    data, settings = task(vocab_dir, "sst2", examples=32)
    encoder = tiny_encoder(Tokenizer(vocab_dir).vocab_size, 0)
    set_dropout(encoder, 0.0)
    encoder.cfg = dataclasses.replace(encoder.cfg, dropout=0.0)
    clipped = dataclasses.replace(settings, clip_norm=0.05)  # small enough to clip every step of every trial
    hps = [HParams(1e-2, 1, 16, 0.0), HParams(1e-3, 1, 16, 0.0)]
    together = run_trials(data, encoder, hps, [1, 2], clipped)
    for hp, seed, batched in zip(hps, [1, 2], together):
        alone = run_trial(data, copy.deepcopy(encoder), hp, seed, clipped)
        assert batched[-1]["accuracy"] == pytest.approx(alone[-1]["accuracy"], abs=METRIC_TOLERANCE)
        assert batched[-1]["train_loss"] == pytest.approx(alone[-1]["train_loss"], rel=LOSS_TOLERANCE)
    with pytest.raises(ValueError, match="share the batch size and the epochs"):
        run_trials(data, encoder, [HParams(1e-3, 1, 16, 0.0), HParams(1e-3, 2, 16, 0.0)], [1, 2], settings)


def test_with_dropout_each_trial_draws_its_own_masks_and_learns(vocab_dir):
    data, settings = task(vocab_dir, "sst2", examples=64)
    encoder = tiny_encoder(Tokenizer(vocab_dir).vocab_size, 0)  # dropout 0.1
    hps = [HParams(3e-3, 6, 16, 0.1)] * 2
    first, second = run_trials(data, encoder, hps, [1, 1], settings)  # one seed twice: only the masks differ
    assert first[-1]["train_loss"] != second[-1]["train_loss"]
    assert all(h[0]["train_loss"] > h[-1]["train_loss"] for h in (first, second))
    assert torch.isfinite(torch.tensor([first[-1]["accuracy"], second[-1]["accuracy"]])).all()


@pytest.mark.compile
def test_the_static_step_compiles_whole_and_equals_the_dynamic_step(vocab_dir, monkeypatch):
    """finetune.step=static pads every batch to one shape and compiles the forward, backward and update with
    fullgraph=True (a graph break raises): the same losses and metrics as the eager step, clipping included.
    Traced by aot_eager (the forward and backward graphs as inductor gets them, run by eager kernels): inductor's
    C++ code generation would cost minutes here; bench/finetune_grid.py --step static runs it."""
    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    data, settings = task(vocab_dir, "stsb", examples=40)  # 3 batches an epoch, the last one short
    encoder = tiny_encoder(Tokenizer(vocab_dir).vocab_size, 0)
    set_dropout(encoder, 0.0)
    encoder.cfg = dataclasses.replace(encoder.cfg, dropout=0.0)
    clipped = dataclasses.replace(settings, clip_norm=0.5)
    hps = [HParams(1e-3, 2, 16, 0.1), HParams(3e-3, 2, 16, 0.0)]
    dynamic = run_trials(data, encoder, hps, [1, 2], dataclasses.replace(clipped, step="dynamic"))
    torch._dynamo.utils.counters.clear()
    static = run_trials(data, encoder, hps, [1, 2], dataclasses.replace(clipped, step="static"))
    # Each compiled function (the trials' losses, their update) once: the relative-position buckets the encoder
    # caches must not change the graphs' guards (model/encoder.py, RelativePositionBias.buckets).
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    for d, s in zip(dynamic, static):
        assert [h["epoch"] for h in s] == [1, 2]
        for a, b in zip(d, s):
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=LOSS_TOLERANCE)
            for key in (k for k in a if k not in ("epoch", "train_loss", "seconds", "threads")):
                assert b[key] == pytest.approx(a[key], abs=METRIC_TOLERANCE), key
