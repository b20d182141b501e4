"""ELECTRA (Clark et al. 2020): a small generator trained by MLM corrupts the input; the main
model (discriminator) detects replaced tokens.

    X^rep_i ~ p_G(x | X^mask) for i in M, X^rep_i = x_i^orig elsewhere
    L = L_MLM(G) + lambda * L_RTD(D),  lambda = 50

The generator has the main model's depth and 1/3 (base) or 1/4 (small) of its width, shares the
token and position embeddings (and their LayerNorm; ELECTRA Sec. 3.2), keeps dropout on, and
receives no gradient from the discriminator (sampling is discrete). A sample equal to the original
token counts as original (ELECTRA Sec. 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSizes, MaskingConfig, bounded
from electralab.model.encoder import Encoder, make_token_embedding
from electralab.model.heads import BinaryHead
from electralab.objectives.common import (
    MaskedLM,
    Objective,
    Output,
    detector_head,
    mlm_loss,
    replaced_prior,
    rtd,
    sample,
    share_embeddings,
    sized,
)


def _electra_masking() -> MaskingConfig:
    # ELECTRA's released pretrain_helpers.mask: 85% of selected positions -> [MASK], 15% kept, none random;
    # [CLS]/[SEP] are never candidates (its _get_candidates_mask).
    return MaskingConfig(mask_prob=0.15, mask_token_prob=0.85, random_token_prob=0.0, mask_special_tokens=False)


@dataclass(frozen=True)
class Settings:
    masking: MaskingConfig = field(default_factory=_electra_masking)
    rtd_weight: float = bounded(50.0, lo=0.0)  # lambda (ELECTRA Sec. 3.2)
    rtd_head: Literal["mlp", "linear"] = "mlp"  # ELECTRA's released head: dense -> GELU -> dense
    # The release samples replacements from softmax(logits / temperature) (configure_pretraining.py `temperature`,
    # 1.0; the paper: p_G itself). Above 1 the generator's samples are flatter, so easier to detect.
    temperature: float = bounded(1.0, lo=1e-4)


class Electra(Objective):
    Settings = Settings

    def __init__(self, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int, settings: Settings):
        super().__init__()
        self.settings = settings
        self.tokens = make_token_embedding(vocab_size, model.embedding, model.initializer_range)
        self.generator = MaskedLM(sized(model, generators.electra), self.tokens)
        self.discriminator = Encoder(model, self.tokens)
        # ELECTRA Sec. 3.2 "Weight Sharing": with a smaller generator "we only share the embeddings
        # (both the token and positional embeddings) of the generator and discriminator"; the released
        # code shares the whole embedding scope (tokens, positions, LayerNorm) and gives each model its
        # own projection to its hidden size. So the generator uses the discriminator's positions and norm.
        share_embeddings(self.generator.encoder.embeddings, self.discriminator.embeddings)
        self.rtd_head = BinaryHead(
            model.hidden,
            detector_head(model, settings.rtd_head),
            model.initializer_range,
            prior=replaced_prior(model, settings.masking),
        )

    def forward(self, batch: Batch, progress: float = 0.0) -> Output:
        masked = self.masked(batch)
        logits = self.generator(batch, masked)  # (M, V)
        targets = masked.take(batch.input_ids)  # (M,)
        gen_loss = mlm_loss(logits, targets, masked)
        replaced = masked.put(batch.input_ids, sample(logits, self.settings.temperature))
        is_replaced = replaced != batch.input_ids  # a lucky sample is "original"
        hidden = self.discriminator(replaced, batch.attention_mask)[-1]
        rtd_loss, metrics = rtd(self.rtd_head(hidden), is_replaced, self.per_token(batch.attention_mask))
        loss = gen_loss + self.settings.rtd_weight * rtd_loss
        metrics.update(gen_loss=gen_loss.detach(), gen_acc=masked.accuracy(logits.argmax(-1), targets))
        return Output(loss, metrics)

    def main_encoder(self) -> Encoder:
        return self.discriminator

    def detect(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.rtd_head(self.discriminator(ids, attention_mask)[-1])
