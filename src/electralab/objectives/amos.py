"""AMOS (Meng et al. 2022): Adversarial Mixture Of training-Signal generators.

One 8-layer, full-width generator (dropout off) with MLM exits at layers D = {4, 6, 8}, one MLM
head shared by the exits and a stop-gradient between blocks, so each block learns only from its own
exit (Sec. 3.3, Eq. 2):
    L_GEN = -sum_{i in M} sum_{d in D} log p_MLM(x_i^orig | h_i^(d))
For each masked position the exits' embeddings are mixed (Eq. 3):
    gamma_i^(d) = softmax_d(v^T f_i^(d))        f = layer output before the projection head
    h_bar_i     = sum_d gamma_i^(d) h_i^(d)      h = after the projection head
    p_MLM(x | h_bar_i) = softmax(x^T h_bar_i)
and the replaced token is drawn with Gumbel-Softmax (tau = 0.3, App. B), straight-through, so the
discriminator's RTD loss reaches gamma. A gradient-reversal layer makes gamma (and through it v and
the generator) *maximise* the discriminator loss, while h^(d) gets no gradient from the
discriminator (Sec. 3.3, Eq. 4):
    theta_GEN, v <- argmin L_GEN - lambda L_DISC;  theta_DISC <- argmin L_DISC;  lambda = 50

Because sum_d gamma^(d) = 1, x^T h_bar + b = sum_d gamma^(d) (x^T h^(d) + b): the mixed logits are
the gamma-weighted exit logits, which the generator loss has already computed.
Every Table 2/8/9 ablation is a Settings switch; docs/methods.md maps rows to values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from electralab.batch import Batch
from electralab.config import EncoderConfig, GeneratorSize, GeneratorSizes, MaskingConfig, bounded, check_exits
from electralab.errors import ConfigError
from electralab.model.encoder import Encoder, make_token_embedding
from electralab.model.heads import BinaryHead, LMHead
from electralab.objectives.common import (
    Objective,
    Output,
    detector_head,
    grad_reverse,
    gumbel_noise,
    mlm_loss,
    replaced_prior,
    rtd,
    sized,
)
from electralab.objectives.positions import Positions


@dataclass(frozen=True)
class Settings:
    # 15% (App. B); the authors' fairseq code, as COCO-LM App. D: 80/10/10, [CLS]/[SEP] maskable (RoBERTa)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    generator_layers: int | None = bounded(None, lo=1, hi=128)  # None: the preset's (8)
    # MLM heads' layers (Table 9: (4,8), (2,4,6,8), 1..8); None: the preset's generators.amos.exits,
    # (4, 6, 8) at the papers' scales (Sec. 4)
    exits: tuple[int, ...] | None = None
    stop_gradient: bool = True  # between blocks; False = Table 2 "- stop grad."
    # How exits are combined: "adversarial" (AMOS); "uniform" ("- adv. train"); "random_layer" (one
    # exit per masked position, uniformly); "layer_switch" (4 -> 6 -> 8 at 1/3 and 2/3 of training);
    # "fixed" (constant weights, e.g. a finished AMOS run's: Table 8 "w. final mix weights").
    mixture: Literal["adversarial", "uniform", "random_layer", "layer_switch", "fixed"] = "adversarial"
    fixed_weights: tuple[float, ...] | None = None
    # ... or read them from a finished AMOS run's metrics file (its mix_weight_<exit> values).
    fixed_weights_from: str | None = None
    # "+ adv. MLM": the exits' embeddings h also get the reversed gradient, scaled (0.1 in Sec. 5.1).
    adversarial_mlm_multiplier: float = bounded(0.0, lo=0.0)
    # Separate generators of these depths instead of one multi-exit generator
    # (Table 2 "w. separate MLM gen." = [4, 6, 8]; Table 8 "w. three 4-layer gen." = [4, 4, 4]).
    separate_generators: tuple[int, ...] | None = None
    gumbel_temperature: float = bounded(0.3, lo=1e-4)  # tau (App. B)
    rtd_weight: float = bounded(50.0, lo=0.0)  # lambda (App. B)
    rtd_head: Literal["linear", "mlp"] = "linear"  # Eq. 1's sigmoid(w^T h); the release's BinaryHead is linear too
    generator_dropout: float = bounded(0.0, lo=0.0, hi=1.0)  # "we disable dropout in the generator"
    # v of Eq. 3 at initialisation (the paper is silent): "normal" = the release's N(0, initializer_range);
    # "zero" = an exactly uniform mixture at the first step.
    mixture_init: Literal["normal", "zero"] = "normal"

    def check(self, where: str) -> None:
        depths = self.separate_generators or self.exits  # None: the preset's exits, checked with it
        separate = self.separate_generators
        if separate is not None:
            if not separate or any(d < 1 for d in separate):
                raise ConfigError(
                    f"{where}.separate_generators={list(separate)}: give one or more positive layer counts"
                )
        elif self.exits is not None:
            check_exits(self.exits, self.generator_layers, f"{where}.exits")
        if self.mixture == "fixed" and self.fixed_weights_from is None:
            if self.fixed_weights is None or (depths is not None and len(self.fixed_weights) != len(depths)):
                count = f" ({len(depths)})" if depths is not None else ""
                raise ConfigError(f"{where}.fixed_weights: give one weight per exit{count} when mixture='fixed'")
            if any(w < 0 for w in self.fixed_weights) or sum(self.fixed_weights) <= 0:
                raise ConfigError(
                    f"{where}.fixed_weights={list(self.fixed_weights)}: weights must be >= 0 with a positive sum"
                )


def read_mixture_weights(path: str, exit_names: list[str]) -> tuple[float, ...]:
    """The final mixture weights a finished AMOS run logged (metrics/pretrain/<run>.json)."""
    try:
        metrics = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"fixed_weights_from={path!r}: no such file (train the AMOS run first)") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"fixed_weights_from={path!r}: not JSON ({e})") from None
    keys = [f"mix_weight_{name}" for name in exit_names]
    missing = [k for k in keys if k not in metrics]
    if missing:
        raise ConfigError(
            f"fixed_weights_from={path!r} has no {missing[0]!r}: it must be a metrics file "
            f"of an AMOS run with the same exits"
        )
    return tuple(float(metrics[k]) for k in keys)


class Amos(Objective):
    Settings = Settings

    def __init__(self, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int, settings: Settings):
        super().__init__()
        self.settings = s = settings
        self.tokens = make_token_embedding(vocab_size, model.embedding, model.initializer_range)
        no_dropout = dict(dropout=s.generator_dropout, attention_dropout=s.generator_dropout)
        if s.separate_generators is None:
            layers = s.generator_layers or generators.amos.layers or model.layers
            self.exit_layers = s.exits or generators.amos.exits
            check_exits(self.exit_layers, layers, "amos exits")
            cfg = sized(model, GeneratorSize(layers=layers), **no_dropout)
            self.generators = nn.ModuleList([Encoder(cfg, self.tokens)])
            self.heads = nn.ModuleList([self._head(cfg)])  # one head shared by the exits
            self.exit_names = [f"exit{d}" for d in self.exit_layers]
        else:
            cfgs = [sized(model, GeneratorSize(layers=d), **no_dropout) for d in s.separate_generators]
            self.generators = nn.ModuleList([Encoder(c, self.tokens) for c in cfgs])
            self.heads = nn.ModuleList([self._head(c) for c in cfgs])  # separate generators, own heads
            self.exit_names = [f"gen{i}" for i in range(1, len(cfgs) + 1)]
        self.fixed_weights = s.fixed_weights
        if s.mixture == "fixed" and s.fixed_weights_from is not None:
            self.fixed_weights = read_mixture_weights(s.fixed_weights_from, self.exit_names)
        if self.fixed_weights is not None and len(self.fixed_weights) != len(self.exit_names):
            raise ConfigError(
                f"amos fixed_weights={list(self.fixed_weights)}: give one weight per exit ({len(self.exit_names)})"
            )
        if s.mixture == "adversarial":  # v of Eq. 3
            self.mixture_v = nn.Parameter(torch.zeros(model.hidden))
            if s.mixture_init == "normal":
                nn.init.normal_(self.mixture_v, std=model.initializer_range)
        self.discriminator = Encoder(model, self.tokens)
        self.rtd_head = BinaryHead(
            model.hidden,
            detector_head(model, s.rtd_head),
            model.initializer_range,
            prior=replaced_prior(model, s.masking),
        )

    def _head(self, cfg: EncoderConfig) -> LMHead:
        return LMHead(cfg.hidden, self.tokens, projection=True, eps=cfg.layer_norm_eps, std=cfg.initializer_range)

    def exits(self, batch: Batch, masked: Positions) -> tuple[list[torch.Tensor], list[torch.Tensor], list[LMHead]]:
        """f^(d) (M, H) and h^(d) (M, E) at the masked positions for every exit, with its head."""
        s = self.settings
        if s.separate_generators is None:
            detach = set(self.exit_layers[:-1]) if s.stop_gradient else set()
            hidden = self.generators[0](batch.masked_ids, batch.attention_mask, detach_after=detach)
            f = [masked.take(hidden[d]) for d in self.exit_layers]
            heads = [self.heads[0]] * len(f)
        else:
            f = [masked.take(g(batch.masked_ids, batch.attention_mask)[-1]) for g in self.generators]
            heads = list(self.heads)
        return f, [head.project(x) for head, x in zip(heads, f)], heads

    def mixture(self, f: torch.Tensor, progress: float | torch.Tensor) -> torch.Tensor:
        """gamma (M, K): the weight of each exit at each masked position."""
        s, (M, K) = self.settings, f.shape[:2]
        if s.mixture == "adversarial":
            # Eq. 3, in fp32 whatever the autocast: a matmul would run in bf16 and the weights (logged,
            # and read back by the fixed-mixture ablation) would sum to 1 only within ~2e-3
            return (f.float() * self.mixture_v.float()).sum(-1).softmax(-1)
        if s.mixture == "uniform":
            return f.new_full((M, K), 1.0 / K)
        if s.mixture == "random_layer":
            return F.one_hot(torch.randint(K, (M,), device=f.device), K).to(f.dtype)
        if s.mixture == "layer_switch":  # shallow -> deep at equal thirds (AMOS Sec. 5.1)
            # progress may be a 0-d tensor (the static step's: a float would be a constant of the graph)
            layer = (torch.as_tensor(progress, device=f.device) * K).long().clamp(max=K - 1)
            return F.one_hot(layer.expand(M), K).to(f.dtype)
        w = torch.tensor(self.fixed_weights, dtype=f.dtype, device=f.device)
        return (w / w.sum()).expand(M, K)

    def forward(self, batch: Batch, progress: float = 0.0) -> Output:
        s = self.settings
        masked = self.masked(batch)
        targets = masked.take(batch.input_ids)  # (M,)
        f, h, heads = self.exits(batch, masked)
        logits = [head.logits(x) for head, x in zip(heads, h)]  # K x (M, V)
        metrics: dict[str, torch.Tensor] = {}
        gen_loss = 0.0
        for name, lg in zip(self.exit_names, logits):  # Eq. 2
            loss_d = mlm_loss(lg, targets, masked)
            gen_loss = gen_loss + loss_d
            metrics[f"gen_loss_{name}"] = loss_d.detach()
            metrics[f"gen_acc_{name}"] = masked.accuracy(lg.argmax(-1), targets)

        gamma = self.mixture(torch.stack(f, 1), progress)  # (M, K)
        for k, name in enumerate(self.exit_names):
            metrics[f"mix_weight_{name}"] = masked.mean(gamma[:, k]).detach()
        adversarial = s.mixture == "adversarial"
        if adversarial:
            gamma = grad_reverse(gamma)  # maximise L_DISC w.r.t. gamma
        if s.adversarial_mlm_multiplier > 0:  # "+ adv. MLM": h^(d) also gets the reversed gradient
            mixed = sum(
                gamma[:, k : k + 1]
                * F.linear(
                    grad_reverse(x, s.adversarial_mlm_multiplier), self.tokens.weight.detach(), head.bias.detach()
                )
                for k, (x, head) in enumerate(zip(h, heads))
            )
        else:  # h^(d) gets no gradient from the discriminator
            mixed = torch.einsum("mk,mkv->mv", gamma, torch.stack(logits, 1).detach())

        # Gumbel-Softmax over p_MLM(x | h_bar); the hard sample is an exact draw from p_MLM.
        log_p = mixed.float().log_softmax(-1)
        perturbed = log_p + gumbel_noise(log_p)
        drawn = perturbed.argmax(-1)  # (M,)
        replaced = masked.put(batch.input_ids, drawn)
        token_embeds = self.tokens(replaced)  # (B, T, E)
        if adversarial or s.adversarial_mlm_multiplier > 0:
            # Straight-through: forward uses the hard token's embedding, backward the soft sample's.
            soft = (perturbed / s.gumbel_temperature).softmax(-1)  # (M, V)
            through = (soft - soft.detach()) @ self.tokens.weight.detach()
            token_embeds = token_embeds + masked.spread(through.to(token_embeds.dtype), token_embeds.shape)
        hidden = self.discriminator(attention_mask=batch.attention_mask, token_embeds=token_embeds)[-1]
        real = self.per_token(batch.attention_mask)
        disc_loss, rtd_metrics = rtd(self.rtd_head(hidden), replaced != batch.input_ids, real)
        metrics.update(rtd_metrics, gen_loss=gen_loss.detach())
        return Output(gen_loss + s.rtd_weight * disc_loss, metrics)

    def main_encoder(self) -> Encoder:
        return self.discriminator

    def detect(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.rtd_head(self.discriminator(ids, attention_mask)[-1])
