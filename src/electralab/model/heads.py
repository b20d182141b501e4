"""Output heads. Every head that predicts tokens multiplies by the shared token table."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def dense_gelu_layernorm(hidden: int, dim: int, eps: float = 1e-5, std: float = 0.02) -> nn.Sequential:
    """dense -> GELU -> LayerNorm (BERT's MLM transform; COCO-LM's released SCL head), N(0, std) weights."""
    net = nn.Sequential(nn.Linear(hidden, dim), nn.GELU(), nn.LayerNorm(dim, eps=eps))
    nn.init.normal_(net[0].weight, std=std)
    nn.init.zeros_(net[0].bias)
    return net


class LMHead(nn.Module):
    """Token prediction tied to the token embeddings: logits = transform(h) @ E^T + b.

    projection=True is the BERT/RoBERTa MLM head (dense -> GELU -> LayerNorm, "the projection layer"
    of COCO-LM App. D); projection=False is COCO-LM's main-model CLM head, "only the final linear
    layer" (a plain linear map is kept only when the hidden size differs from the embedding size).
    """

    def __init__(
        self,
        hidden: int,
        tokens: nn.Embedding,
        *,
        projection: bool = True,
        bias: bool = True,
        eps: float = 1e-5,
        std: float = 0.02,
    ):
        super().__init__()
        dim = tokens.embedding_dim
        self.tokens = tokens
        self.transform: nn.Module | None = None
        if projection:
            self.transform = dense_gelu_layernorm(hidden, dim, eps, std)
        elif hidden != dim:
            self.transform = nn.Linear(hidden, dim)
            nn.init.normal_(self.transform.weight, std=std)
            nn.init.zeros_(self.transform.bias)
        self.bias = nn.Parameter(torch.zeros(tokens.num_embeddings)) if bias else None

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., E): the embedding AMOS mixes (its h^(d), "after the projection head")."""
        return self.transform(h) if self.transform is not None else h

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """(..., E) -> (..., V)."""
        return F.linear(z, self.tokens.weight, self.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.logits(self.project(h))


class BinaryHead(nn.Module):
    """One logit per token. kind="linear" is the papers' sigmoid(w^T h) (COCO-LM's p_copy, AMOS Eq. 1,
    TEAMS Eq. 6); kind="mlp" is ELECTRA's released discriminator head (dense -> GELU -> dense)."""

    def __init__(self, hidden: int, kind: str = "linear", std: float = 0.02, prior: float | None = None):
        super().__init__()
        if kind == "linear":
            self.net: nn.Module = nn.Linear(hidden, 1)
        elif kind == "mlp":
            self.net = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))
        else:
            raise ValueError(f"binary head kind={kind!r}: choose 'linear' or 'mlp'")
        for m in self.net.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                nn.init.zeros_(m.bias)
        if prior is not None:  # start at the positive label's base rate: sigmoid(output bias) = prior
            output = [m for m in self.net.modules() if isinstance(m, nn.Linear)][-1]
            nn.init.constant_(output.bias, math.log(prior / (1 - prior)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h).squeeze(-1)  # (...,)
