"""bench/pair_attention.py's parts (docs/findings.md quotes its figures): which query-key pairs hold the same piece
across a sentence pair, and that even attention sends exactly what the `even` column says."""

from __future__ import annotations

import subprocess
import sys

import torch
from conftest import ROOT
from helpers import tiny_model

from electralab import CLS_ID, PAD_ID, SEP_ID
from electralab.finetune.features import pack
from electralab.model.encoder import Encoder

sys.path.insert(0, str(ROOT / "bench"))
import pair_attention  # noqa: E402


def test_the_same_piece_across_the_pair_and_nowhere_else():
    ids = torch.tensor([[CLS_ID, 5, 6, 6, SEP_ID, 6, 7, 5, SEP_ID, PAD_ID]])
    mask = ids != PAD_ID
    pairs = pair_attention.across_the_pair(ids, mask)
    # 5 at 1 and 7; 6 at 2 and 3 (both in a: not paired with each other) and 5 (in b); [CLS], [SEP], [PAD]: never
    expected = {(1, 7), (7, 1), (2, 5), (5, 2), (3, 5), (5, 3)}
    assert {tuple(ij) for ij in pairs[0].nonzero().tolist()} == expected


def test_even_attention_sends_the_even_share():
    torch.manual_seed(0)
    cfg = tiny_model(layers=2)
    encoder = Encoder(cfg, torch.nn.Embedding(100, cfg.embedding)).eval()
    for layer in encoder.layers:  # q = k = 0: every query spreads its attention evenly over the real keys
        torch.nn.init.zeros_(layer.attention.qkv.weight)
        torch.nn.init.zeros_(layer.attention.qkv.bias)
    if encoder.relative_bias is not None:  # and no position is preferred
        torch.nn.init.zeros_(encoder.relative_bias.bias.weight)
    sequences = [[CLS_ID, 5, 6, SEP_ID, 6, SEP_ID], [CLS_ID, 7, 8, 9, SEP_ID, 9, 9, 8, SEP_ID]]
    rows = pair_attention.measure(encoder, pack(sequences, torch.zeros(2).numpy()), batch_size=2)
    # queries: 6, 6 (one partner in 6 keys); 8 (one in 9), 9 (two in 9), 9, 9, 8 (one each in 9)
    even = (2 * 1 / 6 + 1 / 9 + 2 / 9 + 3 * 1 / 9) / 7
    assert [row["layer"] for row in rows] == [1, 2]
    for row in rows:
        assert abs(row["even"] - even) < 1e-9
        assert abs(row["same_piece"] - even) < 1e-5 and abs(row["best_head"] - even) < 1e-5


def test_a_directory_that_is_not_an_encoder_fails_by_name_before_any_work(tmp_path):
    (tmp_path / "encoder").mkdir()
    out = tmp_path / "out.json"
    commands = {
        "pair_attention.py": [str(tmp_path / "encoder")],
        "sentence_probe.py": [str(tmp_path / "encoder")],
        "precision.py": ["--encoder", str(tmp_path / "encoder")],
    }
    for script, args in commands.items():
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / script), *args, "--out", str(out)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2, done.stderr
        assert f"{tmp_path / 'encoder'}: not an exported encoder (no config.json" in done.stderr
        assert not out.exists()
