"""TEAMS (Shen et al. 2021): Training ELECTRA Augmented with Multi-word Selection.

The generator G (half the discriminator's depth, same width; its bottom half of layers are the
discriminator's own, Sec. 3.2 "Partial Layer Sharing" and Sec. 4.3 "we tie the bottom half of
generator with the discriminator") is trained by MLM. For each masked position it supplies

  * one sample x_hat ~ P_G for the corrupted sequence x^R (RTD, Eq. 4/6), and
  * K = 5 non-original candidates drawn from P_G without replacement; with the original token they
    form the candidate set S (Sec. 3.2; "Hardest" takes the K most likely instead, Fig. 5).

The discriminator's two task heads are attention-based (Sec. 3.2): the main stack's last layer L
feeds multi-word selection, a separate Transformer layer on the output of layer L-1 feeds RTD; the
MWS representation is the one fine-tuned (footnote 3) and exported.

    P_D(x | x^R, S) = exp(e(x)^T h_MWS) / sum_{x' in S} exp(e(x')^T h_MWS)         (Eq. 7)
    L = L_MLM + lambda_1 L_RTD + lambda_2 L_MWS,   lambda_1 = 5, lambda_2 = 2         (Eq. 9, App. B)

Every Table 2-4 / Figure 4-5 ablation is a Settings switch; docs/methods.md maps rows to values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSize, GeneratorSizes, MaskingConfig, bounded
from electralab.errors import ConfigError
from electralab.model.encoder import Encoder, TransformerLayer, init_layer, make_token_embedding
from electralab.model.heads import BinaryHead, LMHead
from electralab.objectives.common import (
    MaskedLM,
    Objective,
    Output,
    detector_head,
    gumbel_noise,
    mlm_loss,
    replaced_prior,
    rtd,
    sample,
    sized,
)


def _teams_masking() -> MaskingConfig:
    # App. B: "we follow BERT" (static masking of BERT's create_pretraining_data): 15%, 80/10/10, and
    # like BERT only real tokens are candidates, never [CLS]/[SEP].
    return MaskingConfig(mask_prob=0.15, mask_token_prob=0.8, random_token_prob=0.1, mask_special_tokens=False)


@dataclass(frozen=True)
class Settings:
    masking: MaskingConfig = field(default_factory=_teams_masking)
    generator_layers: int | None = bounded(None, lo=1, hi=128)  # None: the preset's (1/2 depth); Fig. 4
    # Generator layers that are the discriminator's own bottom layers. None = half the generator's
    # (TEAMS); 0 = Table 4 "No Tie"; "all" = Table 4 "Full Tie", whatever the generator's depth (a number
    # would fix it to one preset's: 6 of base's generator is half of large's 12).
    tied_layers: int | Literal["all"] | None = bounded(None, lo=0, hi=128)
    candidates: int = bounded(5, lo=1, hi=10_000)  # K (Sec. 4.1; Fig. 5: 1, 3, 5, 10, 50)
    candidate_sampling: Literal["sampled", "hardest"] = "sampled"  # Fig. 5
    # "attention": a Transformer layer per task (TEAMS); "ffn": per-token feed-forward heads on the
    # last layer (Table 3 "Use FFN task heads").
    task_heads: Literal["attention", "ffn"] = "attention"
    heads_on_top: bool = False  # both task layers on layer L (Table 3 "Add task head on 12th layer")
    export: Literal["mws", "rtd"] = "mws"  # which branch is fine-tuned (Table 3 "Use RTD task head outputs")
    mlm_weight: float = bounded(1.0, lo=0.0)
    rtd_weight: float = bounded(5.0, lo=0.0)  # lambda_1 (App. B); 0 = Table 2 "Only MWS"
    mws_weight: float = bounded(2.0, lo=0.0)  # lambda_2 (App. B); 0 = Table 2 "Only RTD"
    # The RTD head after its task layer. "mlp": the authors' release (TF Model Garden teams_pretrainer.py:
    # Dense(gelu) then Dense(1), its ELECTRA's head too, so the paper's TEAMS-ELECTRA comparison had one head);
    # "linear": Eq. 6 as printed, sigmoid(w^T h). The FFN-heads ablation always uses ELECTRA's MLP head.
    rtd_head: Literal["mlp", "linear"] = "mlp"

    def check(self, where: str) -> None:
        if self.rtd_weight == 0 and self.mws_weight == 0:
            raise ConfigError(f"{where}: rtd_weight and mws_weight are both 0: the discriminator has no task")
        if self.task_heads == "ffn" and (self.heads_on_top or self.export == "rtd"):
            raise ConfigError(
                f"{where}: task_heads='ffn' has no separate task layers: heads_on_top and "
                f"export='rtd' need task_heads='attention'"
            )
        if self.mws_weight == 0 and self.export == "mws" and self.task_heads == "attention":
            raise ConfigError(
                f"{where}: mws_weight=0 trains no MWS branch; set export='rtd' to fine-tune the RTD branch"
            )
        if (
            self.generator_layers is not None
            and isinstance(self.tied_layers, int)
            and self.tied_layers > self.generator_layers
        ):
            raise ConfigError(
                f"{where}.tied_layers={self.tied_layers} exceeds generator_layers={self.generator_layers}"
            )


def draw_candidates(logits: torch.Tensor, original: torch.Tensor, k: int, how: str) -> torch.Tensor:
    """K distinct non-original tokens per row (M, K): sampled without replacement from softmax(logits)
    (Gumbel top-k) or the K most likely ("hardest")."""
    with torch.no_grad():
        scores = logits.float()
        if how == "sampled":
            scores = scores + gumbel_noise(scores)
        scores = scores.scatter(1, original[:, None], float("-inf"))  # never the original
        return scores.topk(k, dim=-1).indices


class Teams(Objective):
    Settings = Settings

    def __init__(self, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int, settings: Settings):
        super().__init__()
        self.settings = s = settings
        self.model_cfg = model
        self.tokens = make_token_embedding(vocab_size, model.embedding, model.initializer_range)
        self.discriminator = Encoder(model, self.tokens)
        layers = s.generator_layers or generators.teams.layers or max(model.layers // 2, 1)
        tied = {None: layers // 2, "all": layers}.get(s.tied_layers, s.tied_layers)
        if tied > min(layers, model.layers):
            raise ConfigError(
                f"teams tied_layers={tied} exceeds the generator's {layers} or the "
                f"discriminator's {model.layers} layers"
            )
        d = self.discriminator
        self.generator = MaskedLM(
            sized(model, GeneratorSize(layers=layers)),
            self.tokens,
            embeddings=d.embeddings,
            relative_bias=d.relative_bias,
            shared_layers=d.layers[:tied],
        )
        self.tied_layers = tied
        if s.mws_weight > 0 and s.candidates > vocab_size - 1:  # K distinct non-original tokens must exist
            raise ConfigError(
                f"teams candidates={s.candidates} exceeds the {vocab_size - 1} non-original "
                f"tokens of a {vocab_size}-token vocabulary"
            )
        # Task heads (built only for the tasks that train, so every Parameter gets a gradient).
        self.rtd_layer: TransformerLayer | None = None
        self.mws_layer: TransformerLayer | None = None
        if s.rtd_weight > 0:
            # The RTD task layer reads layer L-1 (Sec. 3.2). Without MWS (and heads below the top), the
            # discriminator's own layer L is exactly that layer: a separate one would leave layer L
            # computed but untrained (no gradient, dead weights).
            if s.task_heads == "attention" and (s.mws_weight > 0 or s.heads_on_top):
                self.rtd_layer = self._layer(model)
            # On the attention task layer: rtd_head (the release's MLP, or Eq. 6's linear); the FFN ablation
            # uses ELECTRA's MLP head.
            self.rtd_head = BinaryHead(
                model.hidden,
                detector_head(model, s.rtd_head if s.task_heads == "attention" else "mlp"),
                model.initializer_range,
                prior=replaced_prior(model, s.masking),
            )
        if s.mws_weight > 0:
            if s.heads_on_top:
                self.mws_layer = self._layer(model)
            # MWS scores candidates by e(x)^T z, dot products with their (shared) embeddings and no
            # output bias (Eq. 7; the authors' released head too); the transform (dense -> GELU ->
            # LayerNorm) maps h to the embedding size (needed when they differ: 256 vs 128 in TEAMS-Small).
            self.mws_head = LMHead(
                model.hidden,
                self.tokens,
                projection=True,
                bias=False,
                eps=model.layer_norm_eps,
                std=model.initializer_range,
            )

    @staticmethod
    def _layer(model: EncoderConfig) -> TransformerLayer:
        layer = TransformerLayer(model)
        init_layer(layer, model)
        return layer

    def task_states(self, raw: list[torch.Tensor], mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_RTD, h_MWS), each (B, T, H), from the discriminator's raw layer states (forward(raw=True): the
        same as its outputs post-LN), so that the exported branch (main_encoder) computes the same."""
        d = self.discriminator
        on_top = self.settings.heads_on_top
        h_rtd = h_mws = d.normalize(raw[-1])
        if self.rtd_layer is not None:
            h_rtd = d.run_layer(self.rtd_layer, raw[-1] if on_top else raw[-2], mask)
        if self.mws_layer is not None:
            h_mws = d.run_layer(self.mws_layer, raw[-1], mask)
        return h_rtd, h_mws

    def forward(self, batch: Batch, progress: float = 0.0) -> Output:
        s = self.settings
        masked = self.masked(batch)
        targets = masked.take(batch.input_ids)  # (M,)
        gen_logits = self.generator(batch, masked)  # (M, V)
        gen_loss = mlm_loss(gen_logits, targets, masked)
        replaced = masked.put(batch.input_ids, sample(gen_logits))
        raw = self.discriminator(replaced, batch.attention_mask, raw=True)
        h_rtd, h_mws = self.task_states(raw, batch.attention_mask)
        loss = s.mlm_weight * gen_loss
        metrics = {"gen_loss": gen_loss.detach(), "gen_acc": masked.accuracy(gen_logits.argmax(-1), targets)}

        if s.rtd_weight > 0:
            real = self.per_token(batch.attention_mask)
            rtd_loss, rtd_metrics = rtd(self.rtd_head(h_rtd), replaced != batch.input_ids, real)
            loss = loss + s.rtd_weight * rtd_loss
            metrics.update(rtd_metrics)
        if s.mws_weight > 0:  # Eq. 7-8
            negatives = draw_candidates(gen_logits, targets, s.candidates, s.candidate_sampling)
            candidates = torch.cat([targets[:, None], negatives], 1)  # (M, K+1); the original first
            z = self.mws_head.project(masked.take(h_mws))  # (M, E)
            scores = torch.einsum("me,mke->mk", z, self.tokens(candidates))  # (M, K+1)
            zero = torch.zeros_like(targets)
            mws_loss = masked.mean(F.cross_entropy(scores.float(), zero, reduction="none"), empty=0)
            loss = loss + s.mws_weight * mws_loss
            metrics.update(mws_loss=mws_loss.detach(), mws_acc=masked.accuracy(scores.argmax(-1), zero))
        return Output(loss, metrics)

    def detect(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        if self.settings.rtd_weight <= 0:  # the MWS-only ablation has no RTD head
            return None
        h_rtd, _ = self.task_states(self.discriminator(ids, attention_mask, raw=True), attention_mask)
        return self.rtd_head(h_rtd)

    def main_encoder(self) -> Encoder:
        d, s = self.discriminator, self.settings
        task_layer = self.rtd_layer if s.export == "rtd" else self.mws_layer
        if task_layer is None:  # the exported branch is the main stack itself
            return d
        below = d.layers if s.heads_on_top else d.layers[:-1]  # the RTD layer reads layer L-1
        return Encoder.from_parts(self.model_cfg, d.embeddings, d.relative_bias, [*below, task_layer], d.final_norm)
