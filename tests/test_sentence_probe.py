"""bench/sentence_probe.py's parts (docs/findings.md, "What a frozen encoder holds: the sentence probes", quotes
its figures): the ridge probe finds a linear signal among noise and finds none where there is none, the overlap
baseline is Jaccard's, and the layer states are each sequence's [CLS] and mean over its real tokens, whatever the
padding of its batch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import ROOT
from helpers import tiny_model

from electralab.finetune.features import pack
from electralab.model.encoder import Encoder

sys.path.insert(0, str(ROOT / "bench"))
import sentence_probe  # noqa: E402


def test_ridge_reads_a_linear_signal_and_nothing_from_noise():
    rng = np.random.default_rng(0)
    x, x_dev = rng.normal(size=(2000, 40)), rng.normal(size=(500, 40))
    w = np.zeros(40)
    w[:3] = (1.0, -2.0, 0.5)
    y, y_dev = x @ w + 0.1 * rng.normal(size=2000), x_dev @ w
    assert sentence_probe.spearman(sentence_probe.ridge(x, y, x_dev), y_dev) > 99
    # Labels that are noise, scored on fresh noise: nothing to read (Spearman's sd on 500 pairs is about 4.5)
    noise = sentence_probe.ridge(x, rng.normal(size=2000), x_dev)
    assert abs(sentence_probe.spearman(noise, rng.normal(size=500))) < 10


def test_jaccard_overlap():
    got = sentence_probe.jaccard([{1, 2, 3}, {1}, set()], [{2, 3, 4}, {2}, set()])
    assert np.allclose(got, [0.5, 0.0, 0.0])


def test_layer_states_are_cls_and_the_mean_over_real_tokens():
    torch.manual_seed(0)
    cfg = tiny_model(layers=2)
    encoder = Encoder(cfg, torch.nn.Embedding(100, cfg.embedding)).eval()
    sequences = [[1, 7, 8, 9, 2], [1, 5, 2], [1, 11, 12, 13, 14, 15, 16, 2]]
    cls, mean = sentence_probe.layer_states(encoder, pack(sequences, np.zeros(3)), batch_size=2)
    assert len(cls) == len(mean) == 3  # the embeddings and two layers
    for row, ids in enumerate(sequences):  # each sequence alone, no padding
        with torch.no_grad():
            alone = encoder(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool))
        for layer, h in enumerate(alone):
            assert np.allclose(cls[layer][row], h[0, 0].numpy(), atol=1e-5)
            assert np.allclose(mean[layer][row], h[0].mean(0).numpy(), atol=1e-5)


def test_compare_pairs_each_probed_encoder_with_its_fine_tuned_point(tmp_path):
    def point(name: str, encoder: str, stsb: float | None) -> Path:
        finetune = {"stsb": {"median": stsb}} if stsb is not None else None
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"encoder": encoder, "finetune": finetune}))
        return path

    def layers(*ridge_mean: float) -> list[dict]:
        return [{"layer": i, "ridge_mean": value} for i, value in enumerate(ridge_mean)]

    probes = tmp_path / "probe.json"
    probes.write_text(
        json.dumps(
            {
                "encoders": [
                    {"encoder": "m/a/encoder", "layers": layers(90.0, 10.0)},  # the final layer is read
                    {"encoder": "m/b/encoder", "layers": layers(0.0, 30.0)},
                    {"encoder": "m/c/encoder", "layers": layers(0.0, 20.0)},  # not fine-tuned: left out
                    {"encoder": "m/d/encoder", "layers": layers(0.0, 40.0)},  # no point names it: left out
                ]
            }
        )
    )
    points = [point("a", "m/a/encoder", 15.0), point("b", "m/b/encoder", 50.0), point("c", "m/c/encoder", None)]
    assert sentence_probe.compare([probes], points) == [("m/a/encoder", 10.0, 15.0), ("m/b/encoder", 30.0, 50.0)]
