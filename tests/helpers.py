"""Small builders shared by the model/objective tests (no data stage needed)."""

from __future__ import annotations

import dataclasses

import torch

from electralab import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from electralab.batch import Batch
from electralab.config import AmosGeneratorSize, EncoderConfig, GeneratorSize, GeneratorSizes

VOCAB = 97


def tiny_model(**overrides) -> EncoderConfig:
    """A miniature encoder with the papers' depths (12 layers) so every exit/ablation exists."""
    cfg = EncoderConfig(
        hidden=32,
        layers=12,
        heads=2,
        ffn=64,
        embedding=32,
        max_positions=64,
        relative_buckets=8,
        relative_max_distance=16,
    )
    return dataclasses.replace(cfg, **overrides)


def tiny_generators() -> GeneratorSizes:
    return GeneratorSizes(
        electra=GeneratorSize(hidden=16, heads=1, ffn=32),
        cocolm=GeneratorSize(layers=4),
        amos=AmosGeneratorSize(layers=8),
        teams=GeneratorSize(layers=6),
    )


def make_batch(
    batch_size: int = 4, length: int = 24, vocab: int = VOCAB, mask_prob: float = 0.3, pad_last: int = 0, seed: int = 0
) -> Batch:
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
    mlm[:, 1] = True  # at least one masked position per row
    return Batch(ids, attention, ids.masked_fill(mlm, MASK_ID), mlm)


def train_losses(build, batch: Batch, steps: int = 6, lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Build a model under `seed` (build() -> nn.Module returning an Output), then take `steps` AdamW
    steps on the fixed `batch`, reseeding before every forward so that dropout, sampling and
    candidate draws are the same noise at every step (the loss is then a fixed function of the
    weights). Returns the losses seen before each step, plus the loss after the last step."""
    torch.manual_seed(seed)
    model = build()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps + 1):
        torch.manual_seed(seed + 1)
        loss = model(batch).loss
        losses.append(float(loss.detach()))
        if len(losses) > steps:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return losses


def jitter(module: torch.nn.Module, std: float = 0.1, seed: int = 0) -> torch.nn.Module:
    """Add N(0, std) noise to every parameter, in place: freshly initialised zero biases and unit
    LayerNorms hide terms a formula test should see (a loss with an extra zero bias still matches)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return module
