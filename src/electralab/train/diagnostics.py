"""Held-out diagnostics and the collapse guard: a run that has stopped learning fails, by name.

    probe = HeldOut.from_shards(shards_dir, masking, batches=4, micro_batch_size=32, device=device)
    diagnostics = probe.measure(objective, precision)   # {"token_cosine": 0.41, "rtd_loss": ..., ...}
    problem = collapse(diagnostics, guard)              # None, or what is wrong, in words

At small scale ELECTRA-style pretraining can collapse without a single NaN: the discriminator settles
on "original" for every token (its loss sits at the entropy of the replacement rate, its accuracy on
replaced tokens at 0) and its final layer gives the same vector for every token of every input. Fine-
tuning such an encoder lands below a randomly initialised one. Transformers' own ELECTRA collapses the
same way in that regime (docs/training.md), silently. The guard measures, on the same held-out blocks
every time (the shards' validation split, in eval mode, with fixed random numbers):

- `token_cosine`: the mean cosine similarity between the main encoder's final-layer vectors of
  different real tokens of X^orig (1.0: one vector for everything);
- every metric the objective reports (rtd_loss, rtd_acc_replaced, copy_loss, mlm_acc, gen_acc, ...);
- `*_base_rate_gain`: 1 - detector loss / binary entropy of the replaced fraction, for every binary
  detector (ELECTRA/AMOS/TEAMS's RTD, COCO-LM's copy head): 0 means it predicts only the base rate;
- `mlm_unigram_gain`: the main MLM's accuracy minus the accuracy of always guessing the most frequent
  masked token (MLM runs): 0 means the MLM learned no more than unigram statistics;
- `attention_entropy_<layer>` and their mean `attention_entropy`: how evenly the main encoder's real tokens
  attend, per layer, as the mean entropy of their attention distributions over the entropy of the uniform
  one over the real keys (1.0: every token attends evenly to all). The dead phase of small ELECTRA-style
  runs (docs/findings.md, "The dead phase across methods") looks like the plateau that Gopalani and Hu
  (NeurIPS 2025, arXiv 2506.13688) trace to slowly learned attention; this is the probe that says whether ours
  is one.
- `position_bias_previous`, `_self`, `_next`: the main encoder's relative position bias (shared by its layers)
  toward the previous token, the token itself and the next one, the largest over heads (absent without relative
  positions). Every finished run so far holds the previous token up (+1.4 to +2.7) and itself down; how fast it
  grows is what the `relative_init` candidate changes (docs/findings.md).
- `detector_unigram_gain`: the detector's gain over the base rate on a task that never changes: the same
  masked positions holding tokens drawn from the held-out text's own unigram distribution (a fixed draw).
  A detector that reads context finds random words in a sentence easy; one that only learned which tokens
  its generator proposes does not, and can sit below 0 (it calls the corpus's rarer words "original").
  Not a rule of the guard: it says *why* a detector's gain on its generator's samples moves
  (docs/training.md, "What a small discriminator learns").

From `guard.after` of training (never before the warm-up ends) a run is collapsed when the final layer
is one vector (token_cosine >= max_token_cosine), or a detector does not beat its base rate
(gain < min_base_rate_gain), or the MLM does not beat the unigram guess (gain <= 0). The loop then
raises RepresentationCollapsed: the stage fails like a diverged run, MLflow marks the run FAILED, and no
table shows its numbers.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

from electralab import SPECIAL_TOKENS
from electralab.batch import Batch
from electralab.config import GuardConfig, MaskingConfig
from electralab.data.loader import PretrainLoader
from electralab.model.encoder import Encoder, SelfAttention
from electralab.objectives.common import Objective, rtd
from electralab.objectives.positions import Positions
from electralab.train.common import autocast

DETECTORS = ("rtd", "copy")  # binary heads whose loss is read against the base rate


def binary_entropy(p: float) -> float:
    """Entropy (nats) of a Bernoulli(p): the BCE of a detector that predicts p for every token."""
    if not 0.0 < p < 1.0:
        return 0.0
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def token_cosine(hidden: torch.Tensor, attention_mask: torch.Tensor) -> float:
    """Mean cosine similarity over all pairs of different real tokens of the batch.

    With unit vectors u_i: sum_{i != j} u_i . u_j = |sum_i u_i|^2 - n, so no n x n matrix is needed."""
    u = F.normalize(hidden[attention_mask].detach().float(), dim=-1)  # (n, H)
    n = u.shape[0]
    if n < 2:
        return float("nan")
    total = u.sum(0)
    return float((total @ total - n) / (n * (n - 1)))


def position_bias(encoder: Encoder) -> dict[str, float]:
    """The relative bias a query puts on the key before it, on itself and on the key after it, the largest over
    heads: {} without relative positions."""
    if encoder.relative_bias is None:
        return {}
    bias = encoder.relative_bias(3, encoder.relative_bias.bias.weight.device)[0, :, 1, :]  # (heads, 3) at the middle
    return {f"position_bias_{name}": float(bias[:, i].max()) for i, name in enumerate(("previous", "self", "next"))}


@contextmanager
def attention_inputs(encoder: Encoder) -> Iterator[list[tuple[SelfAttention, torch.Tensor, torch.Tensor | None]]]:
    """While open, every self-attention call of `encoder` is recorded as (module, input, additive bias)."""
    calls: list[tuple[SelfAttention, torch.Tensor, torch.Tensor | None]] = []
    hooks = [
        layer.attention.register_forward_pre_hook(lambda module, args: calls.append((module, *args[:2])))
        for layer in encoder.layers
    ]
    try:
        yield calls
    finally:
        for hook in hooks:
            hook.remove()


def attention_probs(attention: SelfAttention, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The attention probabilities (B, heads, T, T) of one recorded call (attention_inputs), recomputed from q
    and k in fp32 as the module computes them (its qk_norm included): SDPA returns no weights."""
    B, T, H = x.shape
    q, k, _ = attention.qkv(x.float()).view(B, T, 3, attention.heads, H // attention.heads).permute(2, 0, 3, 1, 4)
    if attention.q_norm is not None:
        q, k = attention.q_norm(q), attention.k_norm(k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(H // attention.heads)  # (B, heads, T, T)
    if bias is not None:
        scores = scores + bias.float()
    return scores.softmax(-1)


def attention_entropy(
    attention: SelfAttention, x: torch.Tensor, bias: torch.Tensor | None, attention_mask: torch.Tensor
) -> float:
    """The mean entropy of the attention distributions of the real tokens (over heads and queries), each
    over the entropy of the uniform distribution on its input's real keys: 1.0 when every token attends
    evenly to all, lower as attention picks."""
    p = attention_probs(attention, x, bias)
    entropy = -(p * p.clamp_min(torch.finfo(p.dtype).tiny).log()).sum(-1).mean(1)  # (B, T): mean over heads
    uniform = attention_mask.sum(-1, keepdim=True).float().log().clamp_min(1e-6)  # (B, 1); one key: 0 / 0
    return float((entropy / uniform)[attention_mask].mean())


@dataclass
class HeldOut:
    """Fixed held-out micro-batches (the validation split, masked as the run masks) and what a unigram
    guess scores on them."""

    batches: list[Batch]
    unigram_accuracy: float
    unigram_corrupted: list[torch.Tensor]  # per batch: its masked positions hold unigram draws

    @classmethod
    def from_shards(
        cls,
        shards_dir: Path,
        masking: MaskingConfig,
        batches: int,
        micro_batch_size: int,
        seed: int,
        device: torch.device,
    ) -> "HeldOut":
        loader = PretrainLoader(
            shards_dir, "validation", micro_batch_size=micro_batch_size, seed=seed, masking=masking, verify=False
        )
        chosen = [b for _, b in zip(range(batches), loader)]
        if not chosen:  # no validation blocks (validation_fraction 0): a fixed draw of training blocks
            loader = PretrainLoader(
                shards_dir, "train", micro_batch_size=micro_batch_size, seed=seed + 7919, masking=masking, verify=False
            )
            chosen = [b for _, b in zip(range(batches), loader)]
        targets = torch.cat([b.input_ids[b.mlm_mask] for b in chosen])
        unigram = float(torch.bincount(targets).max() / max(1, targets.numel()))
        words = torch.cat([b.input_ids[b.attention_mask & (b.input_ids >= len(SPECIAL_TOKENS))] for b in chosen])
        draw = torch.Generator().manual_seed(seed)
        corrupted = []
        for b in chosen:
            ids = b.input_ids.clone()
            if len(words):
                ids[b.mlm_mask] = words[torch.randint(len(words), (int(b.mlm_mask.sum()),), generator=draw)]
            corrupted.append(ids.to(device))
        return cls([b.to(device) for b in chosen], unigram, corrupted)

    @torch.no_grad()
    def measure(self, objective: Objective, precision: str) -> dict[str, float]:
        """The diagnostics above, averaged over the held-out batches; the objective's train/eval mode
        and the global random state are restored afterwards (a resumed run stays bit-identical)."""
        was_training = objective.training
        objective.eval()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(name: str, value: float) -> None:
            if math.isfinite(value):
                sums[name] = sums.get(name, 0.0) + value
                counts[name] = counts.get(name, 0) + 1

        devices = [b.input_ids.device for b in self.batches[:1] if b.input_ids.is_cuda]
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)  # the same generator samples at every check
            for batch, corrupted in zip(self.batches, self.unigram_corrupted):
                encoder = objective.main_encoder()
                with autocast(batch.input_ids.device, precision):
                    out = objective(batch, progress=1.0)
                    with attention_inputs(encoder) as attention_calls:
                        hidden = encoder(batch.input_ids, batch.attention_mask)[-1]
                    detected = objective.detect(corrupted, batch.attention_mask)
                add("token_cosine", token_cosine(hidden, batch.attention_mask))
                entropies = [attention_entropy(*call, batch.attention_mask) for call in attention_calls]
                for layer, entropy in enumerate(entropies, start=1):
                    add(f"attention_entropy_{layer}", entropy)
                add("attention_entropy", sum(entropies) / len(entropies))
                for name, value in out.metrics.items():
                    add(name, float(value))
                if detected is not None:
                    _, fixed = rtd(
                        detected, corrupted != batch.input_ids, Positions(batch.attention_mask), prefix="detector"
                    )
                    entropy = binary_entropy(float(fixed["replaced_fraction"]))
                    add("detector_unigram_gain", 1.0 - float(fixed["detector_loss"]) / entropy if entropy else math.nan)
        objective.train(was_training)
        means = {k: sums[k] / counts[k] for k in sums}
        means.update(position_bias(objective.main_encoder()))
        for prefix in DETECTORS:
            loss, fraction = means.get(f"{prefix}_loss"), means.get("replaced_fraction")
            if loss is not None and fraction:
                means[f"{prefix}_base_rate_gain"] = 1.0 - loss / binary_entropy(fraction)
        if "mlm_acc" in means:
            means["mlm_unigram_gain"] = means["mlm_acc"] - self.unigram_accuracy
        return means


def collapse(diagnostics: dict[str, float], guard: GuardConfig) -> str | None:
    """What is collapsed, in words (None when the run is healthy)."""
    problems = []
    cosine = diagnostics.get("token_cosine")
    if cosine is not None and cosine >= guard.max_token_cosine:
        problems.append(
            f"the final layer gives one vector for every token (mean cosine between tokens "
            f"{cosine:.4f} >= {guard.max_token_cosine})"
        )
    for prefix in DETECTORS:
        gain = diagnostics.get(f"{prefix}_base_rate_gain")
        if gain is not None and gain < guard.min_base_rate_gain:
            problems.append(
                f"the {prefix} detector predicts only the base rate (its held-out loss is "
                f"{gain:.1%} below the entropy of the replaced fraction, need "
                f"{guard.min_base_rate_gain:.0%}; accuracy on replaced tokens "
                f"{diagnostics.get(f'{prefix}_acc_replaced', float('nan')):.3f})"
            )
    gain = diagnostics.get("mlm_unigram_gain")
    if gain is not None and gain <= 0:
        problems.append(
            f"the MLM is no better than guessing the most frequent token (accuracy "
            f"{diagnostics['mlm_acc']:.3f}, unigram guess {diagnostics['mlm_acc'] - gain:.3f})"
        )
    return "; ".join(problems) or None


def guard_active(step: int, steps: int, warmup_steps: int, guard: GuardConfig) -> bool:
    """The guard judges from `after` of training, and never during the warm-up."""
    return guard.enabled and step >= max(warmup_steps, math.ceil(guard.after * steps))


__all__ = [
    "HeldOut",
    "attention_entropy",
    "attention_inputs",
    "binary_entropy",
    "collapse",
    "guard_active",
    "token_cosine",
]
