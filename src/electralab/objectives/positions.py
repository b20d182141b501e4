"""The positions a loss reads, taken out of (B, T) tensors in a dynamic or a static shape (issue 38).

    where = Positions(batch.mlm_mask, per_row=predictions_per_row(masking, T) if static else None)
    logits = lm_head(where.take(hidden))            # (N, V)
    loss = where.mean(cross_entropy(logits, where.take(batch.input_ids), reduction="none"))
    replaced = where.put(batch.input_ids, sample(logits))

Dynamic (`per_row=None`, `weighted=False`): boolean indexing, N = mask.sum() rows, only the selected ones
computed. N depends on the data, so torch.compile breaks its graph there and CUDA graphs cannot replay the step;
on the CPU it is the cheapest form.

Static, `per_row=P`: each row's selected positions by index, padded to P with unselected positions at weight 0
(ELECTRA's released `max_predictions_per_seq`): N = B * P every step. The padding's rows are computed and
weighted out, so every loss and mean equals the dynamic one.

Static, `weighted=True`: every position, weighted by the mask, N = B * T: for per-token terms cheap enough to
compute everywhere (a binary head's loss, an accuracy), where gathering would cost more than it saves.
"""

from __future__ import annotations

import math

import torch

from electralab.config import MaskingConfig


def predictions_per_row(masking: MaskingConfig, length: int) -> int:
    """The most positions the masking selects in a row of `length` tokens: round(mask_prob * n) of its n <=
    length eligible ones, at least one (data/masking.py selects exactly that many)."""
    return max(1, math.floor(masking.mask_prob * length + 0.5))


class Positions:
    def __init__(self, mask: torch.Tensor, *, per_row: int | None = None, weighted: bool = False):
        self.mask = mask  # (B, T) bool
        self.index: torch.Tensor | None = None  # (B, P) long: static, gathered
        self.weights: torch.Tensor | None = None  # (N,) bool: static; None: dynamic, every row taken is selected
        if per_row is not None:
            if not torch.compiler.is_compiling() and mask.shape[0] and int(mask.sum(1).max()) > per_row:
                raise ValueError(
                    f"Positions: a row selects {int(mask.sum(1).max())} positions, more than per_row={per_row} "
                    f"(the masking's bound, predictions_per_row): the static step would drop targets"
                )
            # A stable sort puts each row's selected positions first, in order, then its unselected ones:
            # the padding is distinct positions that are not selected, so put() writes them back unchanged.
            selected, self.index = mask.to(torch.uint8).sort(dim=1, descending=True, stable=True)
            self.index, self.weights = self.index[:, :per_row], selected[:, :per_row].bool().reshape(-1)
        elif weighted:
            self.weights = mask.reshape(-1)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...): the rows this loss reads."""
        if self.index is not None:
            index = self.index.reshape(*self.index.shape, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:])
            return x.gather(1, index).flatten(0, 1)
        if self.weights is not None:
            return x.flatten(0, 1)
        return x[self.mask]

    def mean(
        self, values: torch.Tensor, within: torch.Tensor | None = None, *, empty: float = float("nan")
    ) -> torch.Tensor:
        """The mean of (N,) `values` over the selected rows (and of those, the ones `within`, (N,) bool); `empty`
        when there are none (0 keeps a loss's graph)."""
        if self.weights is None:
            values = values if within is None else values[within]
            if values.numel():
                return values.float().mean()
            return values.float().sum() * 0 if empty == 0 else torch.full((), empty, device=values.device)
        w = (self.weights if within is None else self.weights & within).float()
        total, count = (values.float() * w).sum(), w.sum()
        return total / (count.clamp(min=1) if empty == 0 else count)

    def accuracy(self, pred: torch.Tensor, target: torch.Tensor, within: torch.Tensor | None = None) -> torch.Tensor:
        """Mean of pred == target over the selected rows of (N,) predictions (NaN when none)."""
        return self.mean((pred == target).float(), within)

    def spread(self, values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """(N, E) `values` placed at their positions in zeros of `shape` (B, T, E), differentiably."""
        if self.index is not None:
            values = values * self.weights[:, None].to(values.dtype)  # the padding's rows add nothing
            index = self.index[..., None].expand(-1, -1, shape[-1])
            return values.new_zeros(shape).scatter(1, index, values.view(*self.index.shape, -1))
        if self.weights is not None:
            return (values * self.weights[:, None].to(values.dtype)).view(shape)
        out = values.new_zeros(shape)
        out[self.mask] = values
        return out

    def put(self, base: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """`base` (B, T) with (N,) `values` at the selected positions (the padding's keep base's own)."""
        if self.index is not None:
            values = torch.where(self.weights, values, base.gather(1, self.index).reshape(-1))
            return base.scatter(1, self.index, values.view(self.index.shape).to(base.dtype))
        if self.weights is not None:
            return torch.where(self.weights, values.to(base.dtype), base.flatten()).view_as(base)
        out = base.clone()
        out[self.mask] = values.to(base.dtype)
        return out
