"""The pretrained main Transformer with a task head.

    model = FinetuneModel(load_encoder("models/cocolm/encoder"), task)
    logits = model(input_ids, attention_mask)   # (B, C) classes, (B,) STS-B score, (B, T, 2) SQuAD start/end
    loss = model.loss(logits, labels)

Heads (fairseq's, which COCO-LM and AMOS fine-tune with): sentence tasks read the final layer's [CLS]
state through dropout -> dense -> tanh -> dropout -> output; STS-B is one output trained with MSE;
SQuAD is a linear start/end layer over every token (BERT), the [CLS] position standing for "no answer".
Any run's exported encoder works, TEAMS's MWS branch and "RTD head outputs" export included: the
head reads whatever the export's last layer is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from electralab.finetune.tasks import Task
from electralab.model.encoder import Dropout, Encoder, init_weights


class ClassificationHead(nn.Module):
    """fairseq's RobertaClassificationHead on the [CLS] state."""

    def __init__(self, hidden: int, outputs: int, dropout: float):
        super().__init__()
        self.dropout = Dropout(dropout)
        self.dense = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, outputs)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dense(self.dropout(cls)))
        return self.out(self.dropout(x))


class FinetuneModel(nn.Module):
    def __init__(self, encoder: Encoder, task: Task):
        super().__init__()
        self.encoder = encoder
        self.kind = task.kind
        hidden = encoder.cfg.hidden
        if task.kind == "span":
            self.head: nn.Module = nn.Linear(hidden, 2)
        else:
            self.head = ClassificationHead(hidden, task.num_outputs, encoder.cfg.dropout)
        init_weights(self.head, encoder.cfg.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.kind == "span":  # [PAD] positions can be neither start nor end
            hidden = self.encoder(input_ids, attention_mask)[-1]  # (B, T, H) the last layer
            logits = self.head(hidden)  # (B, T, 2)
            return logits.masked_fill(~attention_mask[..., None], torch.finfo(logits.dtype).min)
        # Sentence heads read [CLS] alone: the last layer is computed at that position only (the same values).
        hidden = self.encoder(input_ids, attention_mask, last_layer_queries=1)[-1]  # (B, 1, H)
        logits = self.head(hidden[:, 0])  # (B, C) from [CLS]
        return logits.squeeze(-1) if self.kind == "regression" else logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The batch's mean loss, or each row's (`reduction="none"`: batched trials weigh their padding rows out)."""
        if self.kind == "regression":
            return F.mse_loss(logits.float(), labels.float(), reduction=reduction)
        if self.kind == "span":  # mean of the start and end cross-entropies over the window's tokens
            return (
                F.cross_entropy(logits[..., 0].float(), labels[:, 0], reduction=reduction)
                + F.cross_entropy(logits[..., 1].float(), labels[:, 1], reduction=reduction)
            ) / 2
        return F.cross_entropy(logits.float(), labels, reduction=reduction)


__all__ = ["ClassificationHead", "FinetuneModel"]
