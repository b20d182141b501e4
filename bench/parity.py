"""Parity with transformers: our ELECTRA and MLM train like transformers' ElectraForMaskedLM +
ElectraForPreTraining and BertForMaskedLM, from identical weights on identical batches.

    python bench/parity.py                              # the active preset's shape, 300 steps, ELECTRA and MLM
    python bench/parity.py --methods electra --lr 2e-4 --noise-floor   # + ours vs ours, other sampler numbers
    python bench/parity.py --shards data/shards         # reuse shards the pipeline built (same vocabulary)

Both sides: the active preset's model and ELECTRA generator (params.yaml), with absolute positions only
(transformers has no T5 relative bias) and dropout 0 (so a step is a deterministic function of weights,
batch and the sampler's random numbers). Our initial weights are copied into the peer through the Hugging
Face export mapping (electralab.export.huggingface_state_dict) plus the heads; the peer's token-type table
is zero and frozen (we have no segment embeddings). Both take the same real batches (PretrainLoader over
shards of the preset's corpus), the same AdamW groups (make_adamw: decay on >= 2-d weights only), clip
norm and linear schedule, fp32. ELECTRA's replaced tokens: each side draws them from its own generator's
logits with the same function (electralab.objectives.common.sample, one uniform per masked position)
after the global RNG is seeded with the same value, so they agree as long as the two generators agree.

Printed and written to bench/out/parity_<preset>_lr<lr>_w<warm-up>_s<steps>.json: the losses (total,
generator, RTD) of both sides at checkpoints, their largest relative deviation per step and on a moving
average against TOLERANCE, and held-out collapse diagnostics of both (final-layer token cosine, RTD
accuracy on replaced tokens).
tests/test_parity.py runs the same functions at MINI size. docs/training.md, "Parity with transformers".
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from electralab.batch import Batch  # noqa: E402
from electralab.config import EncoderConfig, GeneratorSizes, PretrainConfig, load_params, to_dict  # noqa: E402
from electralab.data.loader import PretrainLoader  # noqa: E402
from electralab.export import huggingface_fields, huggingface_state_dict  # noqa: E402
from electralab.objectives import Objective, Output, build_objective, method_settings  # noqa: E402
from electralab.objectives.common import MaskedLM, sample  # noqa: E402
from electralab.objectives.electra import Electra  # noqa: E402
from electralab.objectives.mlm import MLM  # noqa: E402
from electralab.objectives.positions import Positions  # noqa: E402
from electralab.train.common import linear_schedule, make_adamw  # noqa: E402
from electralab.train.diagnostics import token_cosine  # noqa: E402

# The first forward: same weights, same batch, fp32 (measured: bit-identical outputs).
INITIAL_TOLERANCE = 1e-5
# Training curves: the largest relative deviation of the losses' moving average over SMOOTHING steps.
# MLM has no random numbers in a step: the sides differ only in floating-point operation order (measured
# <= 3e-7 for hundreds of steps). ELECTRA is as exact until the samplers part: rounding eventually moves
# one generator's CDF across a uniform draw, one token is replaced differently, and from then on the two
# runs are different sample paths of the same training. That is the noise floor, measured as our ELECTRA
# against itself with other sampler random numbers (docs/training.md); the tolerance sits above it and
# below what a 20% different learning rate gives.
TOLERANCE = {"mlm": 1e-4, "electra": 2e-2}
EXACT_TOLERANCE = 1e-4  # ELECTRA's steps before the samplers part
SMOOTHING = 10


def absolute(cfg: EncoderConfig) -> EncoderConfig:
    """The configuration both sides express: absolute positions only, no dropout."""
    return dataclasses.replace(
        cfg, absolute_positions=True, relative_positions=False, dropout=0.0, attention_dropout=0.0
    )


def hf_config(cfg: EncoderConfig, vocab_size: int, config_class):
    """transformers' config of an encoder of ours (ElectraConfig or BertConfig)."""
    fields = huggingface_fields(cfg, vocab_size)
    if config_class.model_type != "electra":
        del fields["embedding_size"]
    return config_class(**fields)


def prefixed(prefix: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in state.items()}


def lm_head_state(masked_lm: MaskedLM, dense: str, norm: str, decoder: str) -> dict[str, torch.Tensor]:
    """Our LMHead (dense -> GELU -> LayerNorm -> tied table + bias) under transformers' names."""
    lin, _, ln = masked_lm.head.transform
    return {
        f"{dense}.weight": lin.weight,
        f"{dense}.bias": lin.bias,
        f"{norm}.weight": ln.weight,
        f"{norm}.bias": ln.bias,
        f"{decoder}.weight": masked_lm.head.tokens.weight,
        f"{decoder}.bias": masked_lm.head.bias,
    }


def load_exactly(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every parameter of `model` from `state` (strict: a name left out or unknown is an error)."""
    model.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)


def freeze_token_types(embeddings: nn.Module) -> None:
    # We train without segment embeddings: the exported table is zeros and must stay zeros, or the
    # token-type-0 row would learn a bias that our model does not have.
    embeddings.token_type_embeddings.weight.requires_grad_(False)


class ElectraPeer(nn.Module):
    """transformers' ELECTRA pair, built as bench/train_step.py builds it, with our weights."""

    def __init__(self, ours: Electra):
        super().__init__()
        from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

        if ours.settings.rtd_head != "mlp":
            raise ValueError("the peer's discriminator head is dense -> GELU -> dense: use rtd_head=mlp")
        disc_cfg, gen_cfg = ours.discriminator.cfg, ours.generator.encoder.cfg
        vocab = ours.tokens.num_embeddings
        self.rtd_weight = ours.settings.rtd_weight
        self.disc = ElectraForPreTraining(hf_config(disc_cfg, vocab, ElectraConfig))
        self.gen = ElectraForMaskedLM(hf_config(gen_cfg, vocab, ElectraConfig))
        # ELECTRA shares the embedding scope (tokens, positions, LayerNorm); each model keeps its own
        # projection to its hidden size, and the generator's LM head is the token table.
        self.gen.electra.embeddings = self.disc.electra.embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight
        head = ours.rtd_head.net
        load_exactly(
            self.disc,
            {
                **prefixed("electra.", huggingface_state_dict(ours.discriminator)),
                "discriminator_predictions.dense.weight": head[0].weight,
                "discriminator_predictions.dense.bias": head[0].bias,
                "discriminator_predictions.dense_prediction.weight": head[2].weight,
                "discriminator_predictions.dense_prediction.bias": head[2].bias,
            },
        )
        load_exactly(
            self.gen,
            {
                **prefixed("electra.", huggingface_state_dict(ours.generator.encoder)),
                **lm_head_state(
                    ours.generator,
                    "generator_predictions.dense",
                    "generator_predictions.LayerNorm",
                    "generator_lm_head",
                ),
            },
        )
        freeze_token_types(self.disc.electra.embeddings)

    def forward(self, batch: Batch) -> Output:
        mask = batch.attention_mask.long()
        labels = batch.input_ids.masked_fill(~batch.mlm_mask, -100)
        gen = self.gen(input_ids=batch.masked_ids, attention_mask=mask, labels=labels)
        masked = Positions(batch.mlm_mask)
        logits = masked.take(gen.logits)
        replaced = masked.put(batch.input_ids, sample(logits))  # the same sampler as ours
        is_replaced = replaced != batch.input_ids
        disc = self.disc(input_ids=replaced, attention_mask=mask, labels=is_replaced.long())
        real = Positions(batch.attention_mask)
        predicted, target = real.take(disc.logits) > 0, real.take(is_replaced)
        metrics = {
            "gen_loss": gen.loss.detach(),
            "rtd_loss": disc.loss.detach(),
            "gen_acc": masked.accuracy(logits.argmax(-1), masked.take(batch.input_ids)),
            "rtd_acc_replaced": real.accuracy(predicted, target, target),
            "replaced_fraction": real.mean(target.float()),
        }
        return Output(gen.loss + self.rtd_weight * disc.loss, metrics)

    def head_outputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        mask = batch.attention_mask.long()
        return {
            "gen_logits": self.gen(input_ids=batch.masked_ids, attention_mask=mask).logits[batch.mlm_mask],
            "rtd_logits": self.disc(input_ids=batch.input_ids, attention_mask=mask).logits,
        }

    def final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.disc.electra(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state


class MLMPeer(nn.Module):
    """transformers' BertForMaskedLM with our weights (ElectraForMaskedLM where the embedding size
    differs from the hidden size: BERT has no factorised embeddings; its head is the same)."""

    def __init__(self, ours: MLM):
        super().__init__()
        from transformers import BertConfig, BertForMaskedLM, ElectraConfig, ElectraForMaskedLM

        cfg, vocab = ours.mlm.encoder.cfg, ours.tokens.num_embeddings
        encoder = huggingface_state_dict(ours.mlm.encoder)
        if cfg.embedding == cfg.hidden:
            self.model = BertForMaskedLM(hf_config(cfg, vocab, BertConfig))
            self.base = self.model.bert
            state = {
                **prefixed("bert.", encoder),
                "cls.predictions.bias": ours.mlm.head.bias,
                **lm_head_state(
                    ours.mlm,
                    "cls.predictions.transform.dense",
                    "cls.predictions.transform.LayerNorm",
                    "cls.predictions.decoder",
                ),
            }
        else:
            self.model = ElectraForMaskedLM(hf_config(cfg, vocab, ElectraConfig))
            self.base = self.model.electra
            state = {
                **prefixed("electra.", encoder),
                **lm_head_state(
                    ours.mlm, "generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head"
                ),
            }
        load_exactly(self.model, state)
        if self.model.get_output_embeddings().weight is not self.base.embeddings.word_embeddings.weight:
            raise AssertionError("transformers did not tie the MLM decoder to the token table")
        freeze_token_types(self.base.embeddings)

    def forward(self, batch: Batch) -> Output:
        labels = batch.input_ids.masked_fill(~batch.mlm_mask, -100)
        out = self.model(input_ids=batch.masked_ids, attention_mask=batch.attention_mask.long(), labels=labels)
        masked = Positions(batch.mlm_mask)
        acc = masked.accuracy(masked.take(out.logits).argmax(-1), masked.take(batch.input_ids))
        return Output(out.loss, {"mlm_loss": out.loss.detach(), "mlm_acc": acc})

    def head_outputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        out = self.model(input_ids=batch.masked_ids, attention_mask=batch.attention_mask.long())
        return {"mlm_logits": out.logits[batch.mlm_mask]}

    def final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.base(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state


PEERS = {"electra": ElectraPeer, "mlm": MLMPeer}
PARTS = {"electra": ("loss", "gen_loss", "rtd_loss"), "mlm": ("loss",)}


def build_pair(
    method: str, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int, settings=None, seed: int = 1
) -> tuple[Objective, nn.Module]:
    """Our objective (absolute positions, dropout 0, seeded init) and transformers' peer with its weights."""
    torch.manual_seed(seed)
    settings = settings or method_settings(method, None)  # None: the method's defaults
    ours = build_objective(method, settings, absolute(model), generators, vocab_size)
    return ours, PEERS[method](ours)


def trainable(module: nn.Module) -> list[torch.Tensor]:
    return [p for p in module.parameters() if p.requires_grad]  # parameters() lists a shared one once


def count_trainable(module: nn.Module) -> int:
    return sum(p.numel() for p in trainable(module))


def step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def watch_replacements(side: nn.Module) -> dict[str, torch.Tensor]:
    """ELECTRA: the token ids (X^rep) each discriminator forward of `side` receives, kept under "ids"."""
    seen: dict[str, torch.Tensor] = {}

    def keep(_module, args, kwargs):
        seen["ids"] = kwargs["input_ids"] if "input_ids" in kwargs else args[0]

    (side.discriminator if isinstance(side, Electra) else side.disc).register_forward_pre_hook(keep, with_kwargs=True)
    return seen


def checksum(ids: torch.Tensor) -> float:
    """Position-weighted sum of token ids: equal on both sides when every sampled token is (exact in fp64)."""
    weights = torch.arange(1, ids.numel() + 1, dtype=torch.int64).view_as(ids)
    return float((ids * weights).sum())


def final_hidden(side: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    if isinstance(side, Objective):
        return side.main_encoder()(input_ids, attention_mask)[-1]
    return side.final_hidden(input_ids, attention_mask)


def head_outputs(side: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    """Every head's output on `batch`, no sampling: LM logits at the masked positions and, for ELECTRA,
    the discriminator's logits on X^orig. At initialisation the losses sit near ln(V) and log 2 whatever
    the weights, so only the outputs themselves show a wrong mapping."""
    if isinstance(side, Electra):
        hidden = side.discriminator(batch.input_ids, batch.attention_mask)[-1]
        return {"gen_logits": side.generator(batch), "rtd_logits": side.rtd_head(hidden)}
    if isinstance(side, MLM):
        return {"mlm_logits": side.mlm(batch)}
    return side.head_outputs(batch)


@torch.no_grad()
def initial_outputs(ours: Objective, peer: nn.Module, batch: Batch, seed: int = 1) -> dict[str, dict[str, float]]:
    """One forward of each side from the same random state: losses and metrics, and per head output
    the largest difference relative to the peer's largest value (under "outputs")."""
    out, heads = {}, {}
    for name, side in (("electralab", ours), ("transformers", peer)):
        side.eval()
        torch.manual_seed(seed)
        o = side(batch)
        out[name] = {"loss": float(o.loss), **{k: float(v) for k, v in o.metrics.items()}}
        heads[name] = head_outputs(side, batch)
    out["outputs"] = {
        k: float((heads["electralab"][k] - v).abs().max() / v.abs().max()) for k, v in heads["transformers"].items()
    }
    return out


def max_relative(a: dict[str, float], b: dict[str, float], keys) -> float:
    return max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-12) for k in keys)


def first_forward_deviation(initial: dict[str, dict[str, float]], method: str) -> float:
    """The largest relative difference of the first forward: losses and every head's outputs."""
    return max(
        max_relative(initial["electralab"], initial["transformers"], PARTS[method]), *initial["outputs"].values()
    )


@dataclass(frozen=True)
class Schedule:
    """The optimisation both sides share (the preset's pretrain settings over `steps`)."""

    steps: int
    lr: float
    warmup_steps: int
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-6
    weight_decay: float = 0.01
    clip_norm: float = 2.0
    seed: int = 1

    @classmethod
    def from_pretrain(cls, cfg: PretrainConfig, steps: int, **overrides) -> "Schedule":
        values = dict(
            steps=steps,
            lr=cfg.lr,
            warmup_steps=cfg.warmup_steps,
            adam_betas=tuple(cfg.adam_betas),
            adam_eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            clip_norm=cfg.clip_norm,
            seed=cfg.seed,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def train_side_by_side(
    ours: Objective,
    peer: nn.Module,
    batches,
    schedule: Schedule,
    probe: Batch | None = None,
    probe_every: int = 50,
    peer_lr: float | None = None,
    peer_seed: int | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Train both sides in lock-step on the same batches; per side and metric, one value per step.

    Before each side's step the global RNG is seeded with the same (seed, step) value: with dropout 0 the
    only random numbers of a step are the sampler's, so both draw the same uniforms. `probe` (held-out)
    gives token_cosine every `probe_every` steps. `peer_lr` gives the peer another learning rate (the
    comparison must fail), `peer_seed` other random numbers for its sampler (the noise floor of ELECTRA)."""
    sides = {"electralab": ours, "transformers": peer}
    curves: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
    electra = isinstance(ours, Electra)
    replacements = {name: watch_replacements(side) for name, side in sides.items()} if electra else {}
    optimisers, schedules = {}, {}
    for name, side in sides.items():
        lr = peer_lr if name == "transformers" and peer_lr else schedule.lr
        optimisers[name] = make_adamw(
            side, lr=lr, betas=schedule.adam_betas, eps=schedule.adam_eps, weight_decay=schedule.weight_decay
        )
        schedules[name] = linear_schedule(optimisers[name], schedule.warmup_steps, schedule.steps)
        side.train()
    for step, batch in zip(range(schedule.steps), batches):
        for name, side in sides.items():
            seed = peer_seed if name == "transformers" and peer_seed is not None else schedule.seed
            torch.manual_seed(step_seed(seed, step))
            started = time.perf_counter()
            out = side(batch)
            out.loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable(side), schedule.clip_norm)
            optimisers[name].step()
            schedules[name].step()
            optimisers[name].zero_grad(set_to_none=True)
            values = {
                "step_s": time.perf_counter() - started,
                "loss": float(out.loss.detach()),
                "grad_norm": float(grad_norm),
                **{k: float(v) for k, v in out.metrics.items()},
            }
            if replacements:
                values["replaced_checksum"] = checksum(replacements[name]["ids"])
            if probe is not None and ((step + 1) % probe_every == 0 or step + 1 == schedule.steps):
                with torch.no_grad():
                    values["token_cosine"] = token_cosine(
                        final_hidden(side, probe.input_ids, probe.attention_mask), probe.attention_mask
                    )
            for k, v in values.items():
                curves[name].setdefault(k, []).append(v)
    return curves


def moving_average(x: np.ndarray, window: int) -> np.ndarray:
    window = max(1, min(window, len(x)))
    return np.convolve(x, np.ones(window) / window, mode="valid")


def deviation(curves: dict[str, dict[str, list[float]]], key: str, window: int = SMOOTHING) -> dict[str, float]:
    """How far our curve of `key` is from the peer's: largest relative deviation per step and of the
    moving average over `window` steps (with the step where it occurs)."""
    ours, ref = np.array(curves["electralab"][key]), np.array(curves["transformers"][key])
    per_step = np.abs(ours - ref) / np.abs(ref)
    a, b = moving_average(ours, window), moving_average(ref, window)
    smoothed = np.abs(a - b) / np.abs(b)
    return {
        "max_step": float(per_step.max()),
        "max_step_at": int(per_step.argmax()) + 1,
        "max_smoothed": float(smoothed.max()),
        "max_smoothed_at": int(smoothed.argmax()) + window,
        "final_smoothed": float(smoothed[-1]),
    }


def samplers_part(curves: dict[str, dict[str, list[float]]], keys) -> dict[str, float | int | None]:
    """ELECTRA: the first step at which the two discriminators saw different tokens (a sampled token
    differs), and the largest relative per-step deviation of `keys` before it (floating point only)."""
    ours, ref = curves["electralab"], curves["transformers"]
    differ = np.array(ours["replaced_checksum"]) != np.array(ref["replaced_checksum"])
    parted = int(differ.argmax()) + 1 if differ.any() else None
    end = parted - 1 if parted else len(differ)
    before = (
        max(float(np.max(np.abs(np.array(ours[k][:end]) - ref[k][:end]) / np.abs(ref[k][:end]))) for k in keys)
        if end
        else 0.0
    )
    return {"parted_at": parted, "max_step_before": before}


def within_tolerance(devs: dict[str, dict[str, float]], method: str) -> bool:
    return all(d["max_smoothed"] <= TOLERANCE[method] for d in devs.values())


def compare(curves: dict[str, dict[str, list[float]]], method: str) -> dict:
    """What the test and the bench judge: per loss part its deviation, ELECTRA's samplers, the verdict."""
    devs = {k: deviation(curves, k) for k in PARTS[method]}
    result = {"deviation": devs, "within_tolerance": within_tolerance(devs, method)}
    if method == "electra":
        result["samplers"] = samplers_part(curves, PARTS[method])
        result["within_tolerance"] &= result["samplers"]["max_step_before"] <= EXACT_TOLERANCE
    return result


# --------------------------------------------------------------------------------------------
# The bench: the active preset's shape on shards of its corpus
# --------------------------------------------------------------------------------------------


def preset_shards(preset, out_root: Path) -> Path:
    """Shards of the preset's corpus, vocabulary and block length, built once under bench/out/."""
    from electralab.data.corpus import build_corpus
    from electralab.data.shards import build_shards
    from electralab.data.vocab import train_vocab
    from electralab.env import data_root

    recipe = json.dumps([to_dict(preset.corpus), to_dict(preset.vocab), to_dict(preset.shards)], sort_keys=True)
    base = out_root / f"parity-data-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if not (base / "shards" / "manifest.json").exists():
        mirror = data_root() or (ROOT / ".." / "shared" / "data").resolve()
        build_corpus(preset.corpus, base / "corpus", mirror)
        train_vocab(base / "corpus", base / "vocab", preset.vocab)
        build_shards(base / "corpus", base / "vocab", base / "shards", preset.shards)
    return base / "shards"


def checkpoints(steps: int) -> list[int]:
    marks = [1, 10, 25, 50, 100, 200, 300, 400, 600, 800, 1000]
    return sorted({s for s in marks if s <= steps} | {steps})


PROBE_EVERY = 25


def run_method(
    method: str, preset, settings, shards: Path, schedule: Schedule, batch_size: int, noise_floor: bool = False
) -> dict:
    loader = PretrainLoader(shards, "train", micro_batch_size=batch_size, seed=schedule.seed, masking=settings.masking)
    vocab = loader.vocab_size
    probe = next(
        iter(
            PretrainLoader(
                shards,
                "validation",
                micro_batch_size=batch_size,
                seed=schedule.seed,
                masking=settings.masking,
                verify=False,
            )
        )
    )
    ours, peer = build_pair(method, preset.model, preset.generators, vocab, settings, schedule.seed)
    twins = (copy.deepcopy(ours), copy.deepcopy(ours)) if noise_floor else None  # before any step
    first = next(
        iter(PretrainLoader(shards, "train", micro_batch_size=batch_size, seed=schedule.seed, masking=settings.masking))
    )
    initial = initial_outputs(ours, peer, first, schedule.seed)
    started, cpu = time.perf_counter(), time.process_time()
    curves = train_side_by_side(ours, peer, iter(loader), schedule, probe=probe, probe_every=PROBE_EVERY)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    extra = {}
    if twins:  # ours against ours with other sampler random numbers: how far sampling alone moves the curves
        loader = PretrainLoader(
            shards, "train", micro_batch_size=batch_size, seed=schedule.seed, masking=settings.masking
        )
        floor = train_side_by_side(*twins, iter(loader), schedule, peer_seed=schedule.seed + 1)
        extra["noise_floor"] = {k: deviation(floor, k) for k in PARTS[method]}
    return {
        "initial": initial,
        "initial_max_relative": first_forward_deviation(initial, method),
        **compare(curves, method),
        **extra,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peer": peer_name(peer),
        "curves": curves,
    }


def peer_name(peer: nn.Module) -> str:
    models = [peer.model] if isinstance(peer, MLMPeer) else [peer.gen, peer.disc]
    return " + ".join(type(m).__name__ for m in models)


def report(method: str, result: dict, steps: int) -> None:
    c, parts = result["curves"], PARTS[method]
    step_s = {side: np.median(c[side]["step_s"]) for side in c}
    print(
        f"\n{method}: peer {result['peer']}, {result['seconds']:.0f} s, {result['cpu_seconds']:.0f} CPU-s (median "
        f"step: ours {step_s['electralab']:.3f} s, transformers {step_s['transformers']:.3f} s), first forward "
        f"max rel. diff {result['initial_max_relative']:.1e}"
    )
    print(f"{'step':>6}" + "".join(f"{p + ' ours':>14}{p + ' hf':>14}" for p in parts))
    for s in checkpoints(steps):
        print(
            f"{s:>6}"
            + "".join(f"{c['electralab'][p][s - 1]:>14.5f}{c['transformers'][p][s - 1]:>14.5f}" for p in parts)
        )
    for p, d in result["deviation"].items():
        print(
            f"  {p:<9} max rel. deviation per step {d['max_step']:.2e} (step {d['max_step_at']}), {SMOOTHING}-step "
            f"mean {d['max_smoothed']:.2e} (step {d['max_smoothed_at']}), final {d['final_smoothed']:.2e}"
        )
    for p, d in result.get("noise_floor", {}).items():
        print(
            f"  noise floor {p:<9} (ours vs ours, other sampler numbers) per step {d['max_step']:.2e}, "
            f"{SMOOTHING}-step mean {d['max_smoothed']:.2e} (step {d['max_smoothed_at']})"
        )
    if "samplers" in result:
        sp = result["samplers"]
        print(
            f"  samplers parted at step {sp['parted_at']}; before it max rel. deviation per step "
            f"{sp['max_step_before']:.2e} (tolerance {EXACT_TOLERANCE:.0e})"
        )
    verdict = "within" if result["within_tolerance"] else "EXCEEDS"
    print(f"  {verdict} the tolerance ({TOLERANCE[method]:.0e} on the {SMOOTHING}-step mean)")
    probed = [s for s in range(1, steps + 1) if s % PROBE_EVERY == 0 or s == steps]
    print(f"  held-out token cosine at steps {probed}")
    for side in ("electralab", "transformers"):
        cos = c[side]["token_cosine"]
        extra = ""
        if method == "electra":
            acc = moving_average(np.nan_to_num(np.array(c[side]["rtd_acc_replaced"])), SMOOTHING)[-1]
            extra = f", RTD accuracy on replaced tokens (last {SMOOTHING} steps) {acc:.3f}"
        print(f"  {side:<12} " + " ".join(f"{v:.3f}" for v in cos) + extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--methods", nargs="+", default=["electra", "mlm"], choices=sorted(PEERS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, help="default: the preset's pretrain.lr")
    ap.add_argument("--warmup-steps", type=int, help="default: the preset's pretrain.warmup_steps")
    ap.add_argument("--batch-size", type=int, help="default: the preset's pretrain.batch_size")
    ap.add_argument(
        "--noise-floor",
        action="store_true",
        help="also train ours against ours with other sampler random numbers (ELECTRA)",
    )
    ap.add_argument("--shards", type=Path, help="shards of the preset's vocabulary (default: built under bench/out)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    params = load_params(args.params)
    preset = params.active
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    shards = args.shards or preset_shards(preset, out)
    schedule = Schedule.from_pretrain(preset.pretrain, args.steps, lr=args.lr, warmup_steps=args.warmup_steps)
    batch_size = args.batch_size or preset.pretrain.batch_size
    model = absolute(preset.model)
    print(
        f"preset={params.preset} model {model.layers}x{model.hidden} (embedding {model.embedding}, ffn "
        f"{model.ffn}), ELECTRA generator {to_dict(preset.generators.electra)}, batch {batch_size}, "
        f"steps {schedule.steps}, lr {schedule.lr}, warm-up {schedule.warmup_steps}, threads "
        f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}"
    )
    results = {
        "preset": params.preset,
        "model": to_dict(model),
        "generators": to_dict(preset.generators),
        "schedule": dataclasses.asdict(schedule),
        "batch_size": batch_size,
        "tolerance": TOLERANCE,
        "smoothing": SMOOTHING,
        "load_average": os.getloadavg()[0],
        "threads": torch.get_num_threads(),
        "methods": {},
    }
    for method in args.methods:
        settings = method_settings(method, params.methods.get(method))
        results["methods"][method] = run_method(
            method, preset, settings, shards, schedule, batch_size, args.noise_floor and method == "electra"
        )
        report(method, results["methods"][method], schedule.steps)
    name = f"parity_{params.preset}_lr{schedule.lr:g}_w{schedule.warmup_steps}_s{schedule.steps}.json"
    (out / name).write_text(json.dumps(results, indent=1))
    print(f"\nwrote bench/out/{name}")


if __name__ == "__main__":
    main()
