"""electralab's encoder in transformers: ELECTRA's layers plus the T5 bucketed relative position bias that
the papers' runs use and transformers' ELECTRA lacks.

Shipped as is inside the Hugging Face export of every relative-position run (electralab.export), where
config.json's `auto_map` names it, and loaded with transformers' remote code:

    model = AutoModel.from_pretrained("exports/cocolm", trust_remote_code=True)

It imports only torch and transformers (not electralab), and needs transformers 5 (tested with 5.23). The
bias (one learned scalar per (bucket, head), shared by all layers) rides along in the additive attention
mask, as our own encoder (electralab.model.encoder) adds it; everything else is `ElectraModel`'s.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import ElectraConfig, ElectraModel


class ElectralabConfig(ElectraConfig):
    # model_type stays "electra": AutoConfig and AutoTokenizer then load the export without remote code. Only
    # AutoModel needs this file (trust_remote_code=True); without it transformers builds a plain ElectraModel
    # and reports `relative_attention_bias.weight` as an unexpected key: that model lacks the bias.
    relative_buckets: int = 32
    relative_max_distance: int = 128
    untie_cls: bool = False  # [CLS]'s row and column: one learned scalar per head each (TUPE), not the bias


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bidirectional bucketing (electralab.model.encoder.relative_position_bucket)."""
    num_buckets //= 2
    buckets = (relative_position > 0).long() * num_buckets
    distance = relative_position.abs()
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class ElectralabModel(ElectraModel):
    config_class = ElectralabConfig
    _supports_flash_attn = False  # the bias is an additive mask: eager and SDPA attention take it
    _supports_flex_attn = False

    def __init__(self, config: ElectralabConfig):
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(config.relative_buckets, config.num_attention_heads)
        heads = config.num_attention_heads
        self.relative_attention_bias_cls = nn.Parameter(torch.zeros(2, heads)) if config.untie_cls else None
        self.post_init()

    def relative_bias(self, length: int, device: torch.device) -> torch.Tensor:
        pos = torch.arange(length, device=device)
        buckets = relative_position_bucket(
            pos[None, :] - pos[:, None], self.config.relative_buckets, self.config.relative_max_distance
        )
        bias = self.relative_attention_bias(buckets).permute(2, 0, 1)  # (heads, T, T)
        if self.relative_attention_bias_cls is not None:  # [CLS]'s row, then its column
            bias = bias.clone()
            bias[:, 0, :] = self.relative_attention_bias_cls[0][:, None]
            bias[:, 1:, 0] = self.relative_attention_bias_cls[1][:, None]
        return bias.unsqueeze(0)  # (1, heads, T, T)

    def _create_attention_masks(self, attention_mask, encoder_attention_mask, embedding_output, *args, **kwargs):
        attention_mask, encoder_attention_mask = super()._create_attention_masks(
            attention_mask, encoder_attention_mask, embedding_output, *args, **kwargs
        )
        bias = self.relative_bias(embedding_output.shape[1], embedding_output.device).to(embedding_output.dtype)
        if attention_mask is None:  # no padding (SDPA)
            attention_mask = bias
        elif attention_mask.dtype == torch.bool:  # True = attend (SDPA)
            attention_mask = bias.masked_fill(~attention_mask, torch.finfo(bias.dtype).min)
        else:  # additive: 0 or the dtype's minimum (eager)
            attention_mask = attention_mask + bias
        self._bias_added = True
        return attention_mask, encoder_attention_mask

    def forward(self, *args, **kwargs):
        self._bias_added = False
        out = super().forward(*args, **kwargs)
        if not self._bias_added:  # a transformers version that builds its masks elsewhere: never silently wrong
            raise RuntimeError(
                "this transformers version does not call ElectraModel._create_attention_masks; the "
                "export's modeling_electralab.py was tested with transformers 5.23"
            )
        return out


__all__ = ["ElectralabConfig", "ElectralabModel"]
