"""The batch contract between the data loader and the pretraining objectives."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    """One micro-batch of packed sequences, already masked for the generator/MLM.

    input_ids:      (B, T) long  X^orig, the packed tokens ([CLS] ... [SEP], [PAD] only at the end)
    attention_mask: (B, T) bool  True on real tokens, False on [PAD]
    masked_ids:     (B, T) long  X^mask, the generator's/MLM's input (80/10/10 or ELECTRA scheme)
    mlm_mask:       (B, T) bool  True at the selected positions M (whatever they were replaced by)
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    masked_ids: torch.Tensor
    mlm_mask: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())
