"""COCO-LM (Meng et al. 2021): Correcting and Contrasting text sequences.

A shallow, full-width auxiliary Transformer trained by MLM corrupts X^orig into X^MLM (Eq. 1),
sampling its replacements in inference mode (no dropout; App. D). The main Transformer learns

  Corrective LM (Sec. 3.3):
    p_LM(x_i|h_i)  = 1(x_i = x_i^MLM) p_copy(1|h_i) + p_copy(0|h_i) softmax(x_i^T h_i)
    p_copy(1|h_i)  = sigmoid(w_copy^T h_i)
    L_copy = BCE of p_copy against 1(x_i^MLM = x_i^orig) on all tokens          (Eq. 2)
    L_LM   = -sum_{i in M} log p_LM(x_i^orig | h_i), with p_copy under stop-gradient
             (lm_form "release": sum_{i in M} p_copy^sg(0|h_i) CE(softmax(x^T h_i), x_i^orig), the released
             criterion's form: the vocabulary's loss weighted by the copy head's belief in a replacement;
             lm_positions "mask_token": M's positions the auxiliary saw as [MASK] only, as the criterion does)
    L_CLM  = lambda_copy * L_copy + L_LM,  lambda_copy = 50                     (App. B)
  Sequence contrastive learning (Sec. 3.3):
    positives (X^MLM_k, X^crop_k) where X^crop is a random contiguous 90% span of X^orig;
    cosine similarity of the [CLS] states, temperature 1, symmetric, the other 2N-2 sequences of
    the batch as negatives                                                      (Eq. 3)
  Total: L = L_MLM(aux) + L_CLM + L_SCL                                         (Eq. 4; scl_weight 1)

Heads (App. D): the auxiliary's MLM head has the projection layer, the main CLM head does not.
Every Table 3 / Figure 4 ablation is a Settings switch; docs/methods.md maps rows to values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from electralab import CLS_ID, MASK_ID, PAD_ID
from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSizes, MaskingConfig, bounded
from electralab.errors import ConfigError
from electralab.model.encoder import Encoder, make_token_embedding
from electralab.model.heads import BinaryHead, LMHead, dense_gelu_layernorm
from electralab.objectives.common import (
    MaskedLM,
    Objective,
    Output,
    detector_head,
    mlm_loss,
    random_tokens,
    replaced_prior,
    sample,
    share_embeddings,
    sized,
)
from electralab.objectives.positions import Positions, predictions_per_row


@dataclass(frozen=True)
class Settings:
    masking: MaskingConfig = field(default_factory=MaskingConfig)  # 15%, 80/10/10, specials maskable (App. D)
    copy_weight: float = bounded(50.0, lo=0.0)  # lambda_copy (App. B)
    # Which tokens L_LM covers: "masked" = CLM (positions M); "all_tokens" = All-Token MLM (ELECTRA's
    # variant, Table 3 "All-Token LM Only"); "none" = no LM term (Table 3 "RTD Only", "SCL + RTD").
    lm: Literal["masked", "all_tokens", "none"] = "masked"
    copy_loss: bool = True  # the binary L_copy term (its absence: "All-Token LM Only")
    copy_mechanism: bool = True  # p_LM mixes in p_copy; False = "CLM w/o. Copy" (plain softmax)
    stop_gradient: bool = True  # sg on p_copy inside L_LM; False = "CLM w/o. Stop-grad"
    # L_LM's form: "printed" = Sec. 3.3, -log(1(x = x^MLM) p_copy(1) + p_copy(0) p_LM(x)); "release" = the
    # released criterion's p_copy(0) x CE(p_LM, x) (docs/methods.md, "Where paper and release differ").
    lm_form: Literal["printed", "release"] = "printed"
    # Which of M's positions L_LM covers (lm="masked"): "selected" = every selected position, whatever the
    # auxiliary saw there (App. D's RoBERTa masking, 80/10/10); "mask_token" = only those it saw as [MASK], as the
    # released criterion does. (Its [CLS] is never masked: masking.mask_special_tokens=false.)
    lm_positions: Literal["selected", "mask_token"] = "selected"
    copy_head: Literal["linear", "mlp"] = "linear"  # sigmoid(w_copy^T h) (Sec. 3.3), linear in the release too
    scl: bool = True  # sequence contrastive learning
    scl_weight: float = bounded(1.0, lo=0.0)  # L_SCL's weight in Eq. 4 (1: the paper's sum)
    # SCL on h_[CLS] as Sec. 3.3 prints it (False), or through the release's projection head on [CLS]
    # (dense -> GELU -> LayerNorm, the released model's SCL head) before the cosine (True).
    scl_projection: bool = False
    scl_temperature: float = bounded(1.0, lo=1e-4)  # tau = 1 (Sec. 3.3, App. B)
    crop_fraction: float = bounded(0.9, lo=0.05, hi=1.0)  # |X^crop| / |X^orig| (Fig. 4: 0.7 .. 1.0)
    # "shallow": COCO-LM's (4 layers base, 6 large, full width); "electra": ELECTRA's generator (same
    # depth, 1/3 width); "random": uniform random replacements, no auxiliary; "converged": a frozen
    # auxiliary loaded from `auxiliary_checkpoint` (a finished run's), trained no further.
    auxiliary: Literal["shallow", "electra", "random", "converged"] = "shallow"
    auxiliary_checkpoint: str | None = None
    sample_without_dropout: bool = True  # App. D: replacements sampled with the auxiliary in eval mode
    # What the auxiliary shares with the main model: "all" = the release's whole embedding module but the
    # projection (token and position tables, embedding LayerNorm), as ELECTRA's; "tokens" = the token table
    # alone (App. B names only the token embeddings; the positions it does not mention).
    share_embeddings: Literal["all", "tokens"] = "all"

    def check(self, where: str) -> None:
        if self.auxiliary == "converged" and not self.auxiliary_checkpoint:
            raise ConfigError(f"{where}.auxiliary_checkpoint: required when auxiliary='converged'")
        if self.lm == "none" and not self.copy_loss and not (self.scl and self.scl_weight > 0):
            raise ConfigError(
                f"{where}: lm='none', copy_loss=false and scl=false (or scl_weight=0) leave the main model "
                f"without a training signal"
            )
        if self.lm_positions == "mask_token" and self.lm != "masked":
            raise ConfigError(
                f"{where}.lm_positions='mask_token' picks L_LM's positions among the masked ones: it needs "
                f"lm='masked' (lm={self.lm!r})"
            )
        if self.lm_form == "release" and not self.copy_mechanism:
            raise ConfigError(
                f"{where}.lm_form='release' weighs the LM loss by the copy head's p_copy(0): it needs "
                f"copy_mechanism=true (without it, L_LM is the plain softmax's in either form)"
            )


def crop(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, fraction: float, static: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """X^crop: [CLS] + a random contiguous span of X^orig's tokens after [CLS], `fraction` long.

    Sequences of different real lengths crop their own real tokens; the result is right-padded to the longest
    crop (`static`: to the longest a row of this length can have, whatever the batch holds).
    """
    B, T = input_ids.shape
    content = attention_mask.sum(1) - 1  # (B,) real tokens after [CLS]
    keep = torch.clamp(torch.round(content.float() * fraction).long(), min=1)
    start = 1 + (torch.rand(B, device=input_ids.device) * (content - keep + 1).float()).long()
    # static: a bound on keep whatever float32 makes of a half-way product (the columns past a row's crop are [PAD])
    width = min(T - 1, math.ceil((T - 1) * fraction) + 1) if static else int(keep.max())
    offsets = torch.arange(width, device=input_ids.device)
    valid = offsets[None, :] < keep[:, None]  # (B, L)
    index = (start[:, None] + offsets[None, :]).clamp(max=T - 1)
    span = input_ids.gather(1, index).masked_fill(~valid, PAD_ID)
    cls = torch.full((B, 1), CLS_ID, dtype=input_ids.dtype, device=input_ids.device)
    ones = torch.ones((B, 1), dtype=torch.bool, device=input_ids.device)
    return torch.cat([cls, span], 1), torch.cat([ones, valid], 1)


def scl_loss(s: torch.Tensor, s_pos: torch.Tensor, temperature: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eq. 3, symmetric: each of the 2N sequences is an anchor; its pair is the positive, the
    other 2N-2 are negatives. Returns the mean loss and the mean positive/negative cosines (Fig. 7a)."""
    N = s.shape[0]
    z = F.normalize(torch.cat([s, s_pos]).float(), dim=-1)  # (2N, H)
    cos = z @ z.T  # (2N, 2N)
    self_pair = torch.eye(2 * N, dtype=torch.bool, device=s.device)
    logits = (cos / temperature).masked_fill(self_pair, float("-inf"))
    positive = torch.cat([torch.arange(N, 2 * N), torch.arange(0, N)]).to(s.device)
    loss = F.cross_entropy(logits, positive)
    negative = ~(F.one_hot(positive, 2 * N).bool() | self_pair)
    metrics = {  # means without boolean indexing (a shape of the data's): the static step's too
        "scl_loss": loss.detach(),
        "scl_pos_cos": cos.gather(1, positive[:, None]).mean().detach(),
        "scl_neg_cos": ((cos * negative).sum() / negative.sum()).detach(),  # NaN with no negative (N = 1)
    }
    return loss, metrics


def lm_log_prob(
    lm_logits: torch.Tensor, copy_logit: torch.Tensor | None, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """log p_LM(target | h) per row; copy_logit=None means no copy mechanism (plain softmax)."""
    log_vocab = lm_logits.float().log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
    if copy_logit is None:
        return log_vocab
    c = copy_logit.float()
    copyable = torch.where(inputs == targets, F.logsigmoid(c), torch.full_like(c, float("-inf")))
    return torch.logaddexp(copyable, F.logsigmoid(-c) + log_vocab)


def lm_predict(lm_logits: torch.Tensor, copy_logit: torch.Tensor | None, inputs: torch.Tensor) -> torch.Tensor:
    """argmax_x p_LM(x | h): either the input token (copied) or the softmax's best token."""
    probs = lm_logits.float().softmax(-1)
    best = probs.argmax(-1)
    if copy_logit is None:
        return best
    p_copy = torch.sigmoid(copy_logit.float())
    p_input = p_copy + (1 - p_copy) * probs.gather(1, inputs[:, None]).squeeze(1)
    p_best = (1 - p_copy) * probs.gather(1, best[:, None]).squeeze(1)
    return torch.where(p_input >= p_best, inputs, best)


class CocoLM(Objective):
    Settings = Settings

    def __init__(self, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int, settings: Settings):
        super().__init__()
        self.settings = s = settings
        self.vocab_size = vocab_size
        self.tokens = make_token_embedding(vocab_size, model.embedding, model.initializer_range)
        if s.auxiliary == "shallow":
            self.auxiliary: MaskedLM | None = MaskedLM(sized(model, generators.cocolm), self.tokens)
        elif s.auxiliary == "electra":
            self.auxiliary = MaskedLM(sized(model, generators.electra), self.tokens)
        elif s.auxiliary == "converged":
            # Its own frozen copy of the token table: sharing the live one would keep changing it.
            self.auxiliary = MaskedLM(
                sized(model, generators.cocolm), make_token_embedding(vocab_size, model.embedding)
            )
            self._load_converged(Path(s.auxiliary_checkpoint))
        else:
            self.auxiliary = None
        self.main = Encoder(model, self.tokens)
        if s.share_embeddings == "all" and s.auxiliary in ("shallow", "electra"):
            share_embeddings(self.auxiliary.encoder.embeddings, self.main.embeddings)
        self.clm_head = LMHead(
            model.hidden, self.tokens, projection=False, eps=model.layer_norm_eps, std=model.initializer_range
        )
        replaced = replaced_prior(model, s.masking)  # the copy head's positive label is "original"
        self.copy_head = BinaryHead(
            model.hidden,
            detector_head(model, s.copy_head),
            model.initializer_range,
            prior=None if replaced is None else 1 - replaced,
        )
        self.scl_head: torch.nn.Module | None = None
        if s.scl and s.scl_projection:
            self.scl_head = dense_gelu_layernorm(
                model.hidden, model.hidden, model.layer_norm_eps, model.initializer_range
            )

    def _load_converged(self, path: Path) -> None:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            self.auxiliary.load_state_dict(state)
        except FileNotFoundError:
            raise ConfigError(
                f"auxiliary_checkpoint={str(path)!r}: no such file (train the run that produces it first)"
            ) from None
        except RuntimeError as e:
            raise ConfigError(f"auxiliary_checkpoint={str(path)!r} does not fit this auxiliary: {e}") from None
        self.auxiliary.requires_grad_(False)

    def train(self, mode: bool = True) -> "CocoLM":
        super().train(mode)
        if self.settings.auxiliary == "converged":
            self.auxiliary.eval()  # frozen: always in inference mode
        return self

    def corrupt(self, batch: Batch, masked: Positions) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """X^MLM (Eq. 1) and the auxiliary's MLM loss."""
        targets = masked.take(batch.input_ids)
        s, aux = self.settings, self.auxiliary
        if aux is None:  # Table 3 "w. Random Replacements"
            drawn = random_tokens(targets.numel(), self.vocab_size, targets.device)
            return masked.put(batch.input_ids, drawn), targets.float().sum() * 0, {}
        if s.auxiliary == "converged":
            with torch.no_grad():
                logits = aux(batch, masked)
            return (
                masked.put(batch.input_ids, sample(logits)),
                logits.sum() * 0,
                {"aux_acc": masked.accuracy(logits.argmax(-1), targets)},
            )
        logits = aux(batch, masked)  # (M, V), dropout on
        loss = mlm_loss(logits, targets, masked)
        sampling_logits = logits
        if s.sample_without_dropout and aux.training:
            with torch.no_grad():  # App. D: inference mode
                aux.eval()
                sampling_logits = aux(batch, masked)
                aux.train()
        replaced = masked.put(batch.input_ids, sample(sampling_logits))
        return replaced, loss, {"aux_loss": loss.detach(), "aux_acc": masked.accuracy(logits.argmax(-1), targets)}

    def forward(self, batch: Batch, progress: float = 0.0) -> Output:
        s = self.settings
        masked = self.masked(batch)
        x_mlm, aux_loss, metrics = self.corrupt(batch, masked)
        is_original = x_mlm == batch.input_ids  # (B, T)
        hidden = self.main(x_mlm, batch.attention_mask)[-1]  # (B, T, H)
        copy_logit = self.copy_head(hidden)  # (B, T): logit of p_copy(1|h)
        loss = aux_loss

        real = self.per_token(batch.attention_mask)
        copy_real, original_real = real.take(copy_logit).float(), real.take(is_original)
        if s.copy_loss:  # Eq. 2
            bce = F.binary_cross_entropy_with_logits(copy_real, original_real.float(), reduction="none")
            copy_loss = real.mean(bce, empty=0)
            loss = loss + s.copy_weight * copy_loss
            metrics["copy_loss"] = copy_loss.detach()
        copy_pred = copy_real > 0
        metrics["copy_acc_replaced"] = real.accuracy(copy_pred, original_real, ~original_real)
        metrics["copy_acc_original"] = real.accuracy(copy_pred, original_real, original_real)
        metrics["replaced_fraction"] = real.mean((~original_real).float())

        if s.lm != "none":
            where = masked if s.lm == "masked" else real
            c = where.take(copy_logit) if s.copy_mechanism else None
            if c is not None and s.stop_gradient:
                c = c.detach()
            lm_logits = self.clm_head(where.take(hidden))  # (N, V)
            originals = where.take(batch.input_ids)
            within = where.take(batch.masked_ids == MASK_ID) if s.lm_positions == "mask_token" else None
            if s.lm_form == "release" and c is not None:
                ce = F.cross_entropy(lm_logits.float(), originals, reduction="none")
                lm_loss = where.mean(torch.sigmoid(-c.float()) * ce, within, empty=0)  # p_copy(0|h) = sigmoid(-logit)
            else:
                lm_loss = -where.mean(lm_log_prob(lm_logits, c, where.take(x_mlm), originals), within, empty=0)
            loss = loss + lm_loss
            metrics["lm_loss"] = lm_loss.detach()
            metrics.update(self._clm_accuracy(hidden, copy_logit, x_mlm, batch, is_original, masked))

        if s.scl:
            x_crop, crop_mask = crop(batch.input_ids, batch.attention_mask, s.crop_fraction, self.static)
            s_crop = self.main(x_crop, crop_mask)[-1][:, 0]  # [CLS] of X^crop
            s_mlm = hidden[:, 0]
            if self.scl_head is not None:
                s_mlm, s_crop = self.scl_head(s_mlm), self.scl_head(s_crop)
            scl, scl_metrics = scl_loss(s_mlm, s_crop, s.scl_temperature)
            loss = loss + s.scl_weight * scl
            metrics.update(scl_metrics)
        return Output(loss, metrics)

    @torch.no_grad()
    def _clm_accuracy(self, hidden, copy_logit, x_mlm, batch, is_original, masked) -> dict[str, torch.Tensor]:
        """COCO-LM Fig. 8: accuracy of argmax p_LM on replaced tokens and on original tokens. Every replaced
        token is a masked one, so the masked positions hold them all; original tokens are many, and a fixed
        grid of positions (every k-th of a row, as many a row as the masked ones: no random numbers drawn)
        estimates theirs without a vocabulary projection on every token."""
        T = batch.mlm_mask.shape[1]
        per_row = predictions_per_row(self.settings.masking, T)
        stride = max(1, T // per_row)
        grid = torch.zeros_like(batch.mlm_mask)
        grid[:, ::stride] = True
        original = self.select(grid & batch.attention_mask & is_original, -(-T // stride))
        out = {}
        for name, where, within in (("replaced", masked, ~masked.take(is_original)), ("original", original, None)):
            c = where.take(copy_logit) if self.settings.copy_mechanism else None
            pred = lm_predict(self.clm_head(where.take(hidden)), c, where.take(x_mlm))
            out[f"clm_acc_{name}"] = where.accuracy(pred, where.take(batch.input_ids), within)
        return out

    def main_encoder(self) -> Encoder:
        return self.main

    def detect(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return -self.copy_head(self.main(ids, attention_mask)[-1])  # the copy head's logit is "original"

    def auxiliary_state(self) -> dict[str, torch.Tensor] | None:
        return None if self.auxiliary is None else self.auxiliary.state_dict()
