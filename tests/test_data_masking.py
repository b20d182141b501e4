"""mask_tokens: exact counts, eligible positions, replacement schemes, per-row generators."""

from __future__ import annotations

import pytest
import torch

from electralab import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from electralab.config import MaskingConfig
from electralab.data.masking import mask_tokens

V = 1000


def batch(B=64, T=128, seed=0):
    """(B, T) packed-looking rows: [CLS] tokens [SEP] ... with varying padding at the end."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0] = CLS_ID
    ids[:, T // 2] = SEP_ID
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    ids[torch.arange(T)[None, :] >= lengths[:, None]] = PAD_ID
    ids[torch.arange(B), lengths - 1] = SEP_ID
    return ids, ids != PAD_ID


def test_exact_count_per_row_and_never_pad():
    ids, am = batch()
    masked, mlm = mask_tokens(ids, am, MaskingConfig(), V, torch.Generator().manual_seed(1))
    n = am.sum(1)
    assert torch.equal(mlm.sum(1), torch.floor(0.15 * n + 0.5).long().clamp(min=1))  # round(p * n) each row
    assert not (mlm & ~am).any()  # never [PAD]
    assert torch.equal(masked[~mlm], ids[~mlm])  # others untouched
    assert masked.dtype == torch.long and mlm.dtype == torch.bool


def test_special_tokens_only_when_asked():
    ids, am = batch(B=256)
    special = (ids == CLS_ID) | (ids == SEP_ID)
    _, bert = mask_tokens(ids, am, MaskingConfig(mask_special_tokens=False), V, torch.Generator().manual_seed(1))
    assert not (bert & special).any()
    _, roberta = mask_tokens(ids, am, MaskingConfig(mask_special_tokens=True), V, torch.Generator().manual_seed(1))
    assert (roberta & special).any()  # RoBERTa / COCO-LM App. D: specials can be masked


@pytest.mark.parametrize("mask_p, random_p", [(0.8, 0.1), (0.85, 0.0)])  # BERT/RoBERTa, ELECTRA
def test_replacement_scheme(mask_p, random_p):
    ids, am = batch(B=512)
    cfg = MaskingConfig(mask_token_prob=mask_p, random_token_prob=random_p, mask_special_tokens=False)
    masked, mlm = mask_tokens(ids, am, cfg, V, torch.Generator().manual_seed(2))
    selected = mlm.sum().item()
    as_mask = (masked[mlm] == MASK_ID).float().sum().item() / selected
    changed = ((masked != ids) & (masked != MASK_ID))[mlm].float().sum().item() / selected
    assert abs(as_mask - mask_p) < 0.02
    assert abs(changed - random_p) < 0.015  # random tokens (a few equal the original by chance)
    replaced = masked[mlm & (masked != MASK_ID) & (masked != ids)]
    assert ((replaced >= 5) & (replaced < V)).all()  # random tokens are never special


def test_per_row_generators_make_rows_independent():
    ids, am = batch(B=8)
    gens = lambda: [torch.Generator().manual_seed(100 + i) for i in range(8)]  # noqa: E731
    full_ids, full_mask = mask_tokens(ids, am, MaskingConfig(), V, gens())
    part_ids, part_mask = mask_tokens(ids[3:5], am[3:5], MaskingConfig(), V, gens()[3:5])
    assert torch.equal(full_ids[3:5], part_ids) and torch.equal(full_mask[3:5], part_mask)


def test_zero_probability_and_empty_rows():
    ids, am = batch(B=4)
    masked, mlm = mask_tokens(ids, am, MaskingConfig(mask_prob=0.0), V, torch.Generator())
    assert not mlm.any() and torch.equal(masked, ids)
    pad = torch.zeros(2, 16, dtype=torch.long)
    _, mlm = mask_tokens(pad, pad != PAD_ID, MaskingConfig(), V, torch.Generator())
    assert not mlm.any()
