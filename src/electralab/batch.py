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

    def split(self, length: int) -> "Batch":
        """The same tokens as rows of `length` (which divides T): (B, T) -> (B * T / length, length), each row
        cut into consecutive pieces, its masked positions where they were. Pieces holding only [PAD] are left
        out (padding sits at a row's end, so a piece is kept where its first token is real): a row with no key
        to attend to has no defined attention."""
        width = self.input_ids.shape[1]
        if width % length:
            raise ValueError(f"Batch.split: length {length} does not divide the sequence length {width}")
        pieces = {f.name: getattr(self, f.name).reshape(-1, length) for f in fields(self)}
        keep = pieces["attention_mask"][:, 0]
        return Batch(**{name: value[keep] for name, value in pieces.items()})

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())
