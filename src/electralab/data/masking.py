"""Masking X^orig into X^mask for the generator / MLM (BERT, RoBERTa, ELECTRA schemes).

    masked_ids, mlm_mask = mask_tokens(input_ids, attention_mask, MaskingConfig(), vocab_size, generator)

Selection: EXACTLY round(mask_prob * n) of each sequence's n eligible positions (at least one when n > 0),
not a Bernoulli draw per token. This is what BERT's and ELECTRA's data code do (a fixed number of
predictions per sequence) and fairseq/RoBERTa does up to the rounding; it keeps the number of MLM targets
per sequence constant, so the generator's loss has a steady scale and a short final block is never left
without a target. Eligible positions are real tokens; [CLS]/[SEP] only when `mask_special_tokens`
(RoBERTa, COCO-LM App. D) and never [PAD].

Replacement, independently per selected position: [MASK] with probability mask_token_prob, a uniformly
random non-special token (id >= 5) with random_token_prob, unchanged otherwise. BERT/RoBERTa: 0.8/0.1
(0.1 kept); ELECTRA's released code: 0.85/0.0 (0.15 kept). `mlm_mask` marks every selected position,
whatever it was replaced by.

`generator` is one torch.Generator for the whole batch, or one per row: with one per row, a row's mask
depends only on its own generator, which is how the loader makes masks independent of batch size, rank
count and resume point.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from electralab import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS
from electralab.config import MaskingConfig

FIRST_REGULAR_ID = len(SPECIAL_TOKENS)  # 5: random replacements never produce a special token


def derive_seed(*entropy: int) -> int:
    """A well-mixed 64-bit torch seed from small integers (seed, epoch, position, ...)."""
    hi, lo = np.random.SeedSequence(list(entropy)).generate_state(2, np.uint32)
    return int(hi) << 32 | int(lo)


def _uniform(shape: tuple[int, int], generator: torch.Generator | Sequence[torch.Generator]) -> torch.Tensor:
    if isinstance(generator, torch.Generator):
        return torch.rand(shape, generator=generator)
    return torch.stack([torch.rand(shape[1], generator=g) for g in generator])


def _random_ids(
    shape: tuple[int, int], vocab_size: int, generator: torch.Generator | Sequence[torch.Generator]
) -> torch.Tensor:
    if isinstance(generator, torch.Generator):
        return torch.randint(FIRST_REGULAR_ID, vocab_size, shape, generator=generator)
    return torch.stack([torch.randint(FIRST_REGULAR_ID, vocab_size, (shape[1],), generator=g) for g in generator])


def eligible_positions(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, mask_special_tokens: bool
) -> torch.Tensor:
    """(B, T) bool: positions that may be selected for masking."""
    eligible = attention_mask & (input_ids != PAD_ID)
    if not mask_special_tokens:
        eligible &= (input_ids != CLS_ID) & (input_ids != SEP_ID)
    return eligible


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cfg: MaskingConfig,
    vocab_size: int,
    generator: torch.Generator | Sequence[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked_ids (B, T) long, mlm_mask (B, T) bool); see the module docstring."""
    if vocab_size <= FIRST_REGULAR_ID:
        raise ValueError(f"vocab_size={vocab_size}: need regular tokens beyond the {FIRST_REGULAR_ID} special ids")
    input_ids = input_ids.long()
    B, T = input_ids.shape
    if not isinstance(generator, torch.Generator) and len(generator) != B:
        raise ValueError(f"got {len(generator)} generators for {B} rows")
    eligible = eligible_positions(input_ids, attention_mask.bool(), cfg.mask_special_tokens)  # (B, T)

    # Exactly k = round(p * n) per row: rank eligible positions by a random score, take the k lowest.
    n = eligible.sum(dim=1)  # (B,)
    k = torch.floor(cfg.mask_prob * n + 0.5).long()
    if cfg.mask_prob > 0:
        k = torch.where(n > 0, k.clamp(min=1), k)
    scores = _uniform((B, T), generator).masked_fill(~eligible, 2.0)  # ineligible sort last
    order = scores.argsort(dim=1)  # (B, T)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(T).expand(B, T))
    mlm_mask = rank < k[:, None]  # (B, T)

    # Of the selected: [MASK] / random regular token / kept, by one uniform draw per position.
    u = _uniform((B, T), generator)
    to_mask = mlm_mask & (u < cfg.mask_token_prob)
    to_random = mlm_mask & ~to_mask & (u < cfg.mask_token_prob + cfg.random_token_prob)
    random_ids = _random_ids((B, T), vocab_size, generator)
    masked_ids = torch.where(to_mask, torch.full_like(input_ids, MASK_ID), input_ids)
    masked_ids = torch.where(to_random, random_ids, masked_ids)
    return masked_ids, mlm_mask
