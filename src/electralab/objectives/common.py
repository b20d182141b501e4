"""Pieces every pretraining objective shares: the output type, the masked LM, sampling, RTD."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSize, MaskingConfig
from electralab.model.encoder import Embeddings, Encoder
from electralab.model.heads import LMHead
from electralab.objectives.positions import Positions, predictions_per_row


@dataclass
class Output:
    """What every objective returns: the loss to minimise and named diagnostics (detached scalars)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class Objective(nn.Module):
    """A pretraining method: forward(batch, progress) -> Output; main_encoder() is what we export."""

    Settings: type
    trains = True  # False: the no-pretraining control (objectives/none.py), exported as initialised
    static = False  # fixed shapes for torch.compile(fullgraph=True) and CUDA graphs: set_static()

    def forward(self, batch: Batch, progress: float = 0.0) -> Output:  # pragma: no cover - abstract
        raise NotImplementedError

    def main_encoder(self) -> Encoder:  # pragma: no cover - abstract
        raise NotImplementedError

    def select(self, mask: torch.Tensor, per_row: int) -> Positions:
        """The positions of `mask` (B, T), at most `per_row` a row, gathered in this objective's form."""
        return Positions(mask, per_row=per_row if self.static else None)

    def masked(self, batch: Batch) -> Positions:
        """The masked positions M (objectives/positions.py)."""
        return self.select(batch.mlm_mask, predictions_per_row(self.settings.masking, batch.mlm_mask.shape[1]))

    def per_token(self, mask: torch.Tensor) -> Positions:
        """Positions of a per-token term (real tokens, replaced ones): weighted in place when static."""
        return Positions(mask, weighted=self.static)

    def detect(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """(B, T) logits of "replaced" from the method's binary detector on `ids`, or None if it has none.
        The held-out diagnostics give it a fixed corruption to tell a detector that reads context from one
        that learned which tokens its generator proposes (train/diagnostics.py, detector_unigram_gain)."""
        return None

    def auxiliary_state(self) -> dict[str, torch.Tensor] | None:
        """State of the auxiliary network that other runs load (COCO-LM's converged auxiliary)."""
        return None


def sized(main: EncoderConfig, size: GeneratorSize, **overrides) -> EncoderConfig:
    """The config of an auxiliary network: the main model's, with the given size fields replaced."""
    changes = {k: v for k, v in dataclasses.asdict(size).items() if v is not None}
    changes.update({k: v for k, v in overrides.items() if v is not None})
    return dataclasses.replace(main, **changes)


class MaskedLM(nn.Module):
    """An encoder with an LM head evaluated only at the masked positions: the vocabulary
    projection is the most expensive matmul of a small model, so never spend it on the 85%."""

    def __init__(self, cfg: EncoderConfig, tokens: nn.Embedding, *, projection: bool = True, **encoder_kwargs):
        super().__init__()
        self.encoder = Encoder(cfg, tokens, **encoder_kwargs)
        self.head = LMHead(cfg.hidden, tokens, projection=projection, eps=cfg.layer_norm_eps, std=cfg.initializer_range)

    def forward(self, batch: Batch, masked: Positions | None = None) -> torch.Tensor:
        """(M, V) logits at the masked positions (`masked`: the objective's form; None: the batch's, dynamic)."""
        hidden = self.encoder(batch.masked_ids, batch.attention_mask)
        return self.head((masked or Positions(batch.mlm_mask)).take(hidden[-1]))  # (M, V)


def set_static(module: nn.Module, on: bool = True) -> None:
    """Every objective and encoder in `module` to the static step (or back): no shape or branch that depends
    on the data, so torch.compile(fullgraph=True) captures the whole step and CUDA graphs can replay it. The
    same losses as the dynamic step; on the CPU the dynamic one is cheaper (issue 38, docs/performance.md)."""
    for m in module.modules():
        if isinstance(m, (Objective, Encoder)):
            m.static = on


def share_embeddings(own: Embeddings, shared: Embeddings) -> None:
    """`own` uses `shared`'s position table and embedding LayerNorm (the token table is one Parameter already);
    each keeps its projection to its own width: ELECTRA's released embedding scope, COCO-LM's release too."""
    own.positions, own.norm = shared.positions, shared.norm


def gumbel_noise(like: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise in fp32: -log(Exp(1))."""
    return -torch.empty_like(like, dtype=torch.float32).exponential_().log()


def sample(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """One token per row from softmax(logits / temperature), no gradient: an exact categorical draw by inverting
    the CDF (one uniform number per row: 4x cheaper on CPU than Gumbel-max's one per vocabulary entry)."""
    with torch.no_grad():
        scaled = logits if temperature == 1.0 else logits / temperature  # no extra (M, V) pass at the default
        cdf = scaled.float().softmax(-1).cumsum(-1)  # (M, V)
        u = torch.rand(cdf.shape[0], 1, device=cdf.device) * cdf[:, -1:]
        # Row i of the draw is the first entry whose cdf exceeds u: P(token j) = p_j exactly.
        return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)


def random_tokens(count: int, vocab_size: int, device: torch.device, first: int = 5) -> torch.Tensor:
    """Uniform draws over the non-special vocabulary (ids >= 5)."""
    return torch.randint(first, vocab_size, (count,), device=device)


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, multiplier: float) -> torch.Tensor:
        ctx.multiplier = multiplier
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return -ctx.multiplier * grad, None


def grad_reverse(x: torch.Tensor, multiplier: float = 1.0) -> torch.Tensor:
    """Identity forward; gradient multiplied by -multiplier backward (Ganin et al. 2016)."""
    return _GradReverse.apply(x, multiplier)


def mlm_loss(logits: torch.Tensor, targets: torch.Tensor, masked: Positions) -> torch.Tensor:
    """Mean cross-entropy over the masked positions; 0 (with a graph) when nothing is masked."""
    return masked.mean(F.cross_entropy(logits.float(), targets, reduction="none"), empty=0)


def replaced_prior(model: EncoderConfig, masking: MaskingConfig) -> float | None:
    """The share of tokens a detector's "replaced" label starts near, when the model asks for a base-rate
    bias (model.detector_bias); None: the papers' zero bias. It counts the selected positions whose input
    hides the original token ([MASK] and random ones). The generator resamples the kept ones too, so at the
    very first step the share can reach mask_prob (0.15 against 0.135 at 80/10/10): a starting point for the
    bias, not the exact rate."""
    if model.detector_bias == "zero":
        return None
    return masking.mask_prob * (masking.mask_token_prob + masking.random_token_prob)


def detector_head(model: EncoderConfig, own: str) -> str:
    """The kind of binary head a method builds: its own setting, unless the model names one for all."""
    return own if model.detector_head == "method" else model.detector_head


def rtd(
    logits: torch.Tensor, is_replaced: torch.Tensor, real: Positions, prefix: str = "rtd"
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Replaced token detection: BCE on every real token; logit > 0 means "replaced".

    Returns the mean loss and the diagnostics the papers plot: accuracy on replaced and on
    original tokens (AMOS Fig. 3b) and the fraction of tokens replaced.
    """
    logits, target = real.take(logits).float(), real.take(is_replaced)
    loss = real.mean(F.binary_cross_entropy_with_logits(logits, target.float(), reduction="none"), empty=0)
    pred = logits > 0
    metrics = {
        f"{prefix}_loss": loss.detach(),
        f"{prefix}_acc_replaced": real.accuracy(pred, target, target),
        f"{prefix}_acc_original": real.accuracy(pred, target, ~target),
        "replaced_fraction": real.mean(target.float()),
    }
    return loss, metrics
