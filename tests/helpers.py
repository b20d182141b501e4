"""Small builders shared by the model/objective tests (no data stage needed)."""

from __future__ import annotations

import dataclasses

import torch

from electralab import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSize, GeneratorSizes

VOCAB = 97


def tiny_model(**overrides) -> EncoderConfig:
    """A miniature encoder with the papers' depths (12 layers) so every exit/ablation exists."""
    cfg = EncoderConfig(hidden=32, layers=12, heads=2, ffn=64, embedding=32, max_positions=64,
                        relative_buckets=8, relative_max_distance=16)
    return dataclasses.replace(cfg, **overrides)


def tiny_generators() -> GeneratorSizes:
    return GeneratorSizes(electra=GeneratorSize(hidden=16, heads=1, ffn=32), cocolm=GeneratorSize(layers=4),
                          amos=GeneratorSize(layers=8), teams=GeneratorSize(layers=6))


def make_batch(batch_size: int = 4, length: int = 24, vocab: int = VOCAB, mask_prob: float = 0.3,
               pad_last: int = 0, seed: int = 0) -> Batch:
    """Random packed sequences [CLS] ... [SEP] (the last `pad_last` tokens of row 0 are [PAD]),
    with a random mask; masked positions hold [MASK] in masked_ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch_size, length), generator=g)
    ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
    attention = torch.ones_like(ids, dtype=torch.bool)
    if pad_last:
        ids[0, -pad_last:] = PAD_ID
        ids[0, -pad_last - 1] = SEP_ID
        attention[0, -pad_last:] = False
    mlm = (torch.rand(ids.shape, generator=g) < mask_prob) & attention
    mlm[:, 1] = True   # at least one masked position per row
    return Batch(ids, attention, ids.masked_fill(mlm, MASK_ID), mlm)
