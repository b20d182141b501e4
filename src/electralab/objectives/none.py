"""No pretraining: the control row of every table ("No pretraining (control)").

The main encoder as initialised (BERT's N(0, 0.02) weights, the preset's shape and seed: exactly MLM's
starting weights), exported without a single training step and fine-tuned like every other run, so that
every table shows what pretraining bought: a pretrained row is worth reading only where it beats this one.
(Geiping & Goldstein 2023, "Cramming", report BERT-base without pretraining at about 18 STS-B Spearman
and 80 SST-2 accuracy.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSizes, MaskingConfig
from electralab.model.encoder import Encoder, make_token_embedding
from electralab.objectives.common import Objective, Output


@dataclass(frozen=True)
class Settings:
    masking: MaskingConfig = field(default_factory=MaskingConfig)  # unused: nothing is masked or trained


class NoPretraining(Objective):
    Settings = Settings
    trains = False  # the loop exports the initial encoder and takes no step

    def __init__(self, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int, settings: Settings):
        super().__init__()
        self.settings = settings
        self.tokens = make_token_embedding(vocab_size, model.embedding, model.initializer_range)
        self.encoder = Encoder(model, self.tokens)

    def forward(self, batch: Batch, progress: float = 0.0) -> Output:
        raise RuntimeError("the no-pretraining control has no training objective")

    def main_encoder(self) -> Encoder:
        return self.encoder
