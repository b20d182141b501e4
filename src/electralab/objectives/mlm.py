"""BERT/RoBERTa-style masked language modeling: the baseline of every table.

    L_MLM = -E[ sum_{i in M} log p_MLM(x_i^orig | h_i) ]        (COCO-LM Sec. 3.1)

15% of positions are selected, 80/10/10 replaced/randomised/kept (the loader's masking); the head is
the BERT/RoBERTa MLM head (dense -> GELU -> LayerNorm -> tied embeddings), evaluated only at the
selected positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSizes, MaskingConfig
from electralab.model.encoder import Encoder, make_token_embedding
from electralab.objectives.common import MaskedLM, Objective, Output, mlm_loss


@dataclass(frozen=True)
class Settings:
    masking: MaskingConfig = field(default_factory=MaskingConfig)  # RoBERTa: 15%, 80/10/10, specials maskable


class MLM(Objective):
    Settings = Settings

    def __init__(self, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int, settings: Settings):
        super().__init__()
        self.settings = settings
        self.tokens = make_token_embedding(vocab_size, model.embedding, model.initializer_range)
        self.mlm = MaskedLM(model, self.tokens)

    def forward(self, batch: Batch, progress: float = 0.0) -> Output:
        masked = self.masked(batch)
        logits = self.mlm(batch, masked)  # (M, V)
        targets = masked.take(batch.input_ids)  # (M,)
        loss = mlm_loss(logits, targets, masked)
        return Output(loss, {"mlm_loss": loss.detach(), "mlm_acc": masked.accuracy(logits.argmax(-1), targets)})

    def main_encoder(self) -> Encoder:
        return self.mlm.encoder
