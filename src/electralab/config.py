"""Typed configuration loaded from params.yaml, the project's one place of configuration.

params.yaml has four top-level keys:

    preset:  which scale preset is active (tiny | small | base | base_pp | large_pp)
    presets: each preset's values, grouped by concern (corpus, vocab, shards, model, ...): only what
             differs from the dataclass defaults below, which are the papers' base setting
    methods: departures from each method's paper settings (its Settings defaults), at every scale
    runs:    the registry of named pretraining runs (one per row of the papers' tables)

Every value can be overridden with `dvc exp run -S presets.tiny.vocab.size=2000` and friends.

Loading turns the YAML into frozen dataclasses and checks it on the way: an unknown key, a value of the
wrong type or one out of range raises ConfigError naming the key path, the value and what is allowed.

    >>> from electralab.config import load_params
    >>> params = load_params("params.yaml")
    >>> params.active.vocab.size
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from electralab.errors import ConfigError

if TYPE_CHECKING:
    from electralab.finetune.tasks import Task


def _range(lo: float | None = None, hi: float | None = None) -> dict:
    return {"range": (lo, hi)}


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    lo: float | None = None,
    hi: float | None = None,
    factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with an inclusive [lo, hi] range checked at load time."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=_range(lo, hi))
    return field(default=default, metadata=_range(lo, hi))


# --------------------------------------------------------------------------------------------
# Data: corpus -> vocab -> shards
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSource:
    """One corpus on the Hugging Face hub, read with `datasets.load_dataset(path, name, split=...)`."""

    path: str
    name: str | None = None
    split: str = "train"
    text_field: str = "text"
    # How rows become documents: "document" = one row is one document (Wikipedia, OpenWebText);
    # "wikitext" = rows are lines of WikiText, whose " = Title = " headings start a new article;
    # "sentences" = rows are consecutive sentences with no document boundaries (BookCorpus on the
    # hub): every `sentences_per_document` of them form one document, so [SEP]s stay rare.
    format: Literal["document", "wikitext", "sentences"] = "document"
    sentences_per_document: int = bounded(256, lo=1)


@dataclass(frozen=True)
class MirrorSource:
    """One file under $ELECTRALAB_DATA/corpus/ (the offline mirror)."""

    file: str
    # "paragraphs": one paragraph per line, a blank line between documents (the mirror's format);
    # "wikitext": WikiText raw lines, articles start at " = Title = " headings.
    format: Literal["paragraphs", "wikitext"] = "paragraphs"


# The papers' base corpus (BERT's; COCO-LM and AMOS Sec. 4 "Wikipedia and BookCorpus", 16 GB).
BASE_CORPUS = (
    HubSource("wikimedia/wikipedia", "20231101.en", format="document"),
    HubSource("rojagtap/bookcorpus", format="sentences"),
)
# The offline mirror's English Wikipedia articles ($ELECTRALAB_DATA/corpus/, ../shared/data/SOURCES.md).
MIRROR_CORPUS = (MirrorSource("enwiki_featured_articles.txt"), MirrorSource("enwiki_good_articles_sample.txt"))


@dataclass(frozen=True)
class CorpusConfig:
    hub: tuple[HubSource, ...] = BASE_CORPUS  # read when ELECTRALAB_DATA is not set
    mirror: tuple[MirrorSource, ...] = MIRROR_CORPUS  # read when ELECTRALAB_DATA names a local mirror
    uncased: bool = True  # lowercase + strip accents, like BERT-uncased
    max_documents: int | None = bounded(None, lo=1)  # cap for quick presets; None = everything
    shard_documents: int = bounded(50_000, lo=1)  # documents per output Parquet file

    def check(self, where: str) -> None:
        if not self.hub and not self.mirror:
            raise ConfigError(f"{where}: name at least one corpus under hub or mirror")


@dataclass(frozen=True)
class VocabConfig:
    size: int = bounded(32768, lo=64, hi=1_000_000)
    model_type: Literal["bpe", "unigram"] = "bpe"
    character_coverage: float = bounded(0.9999, lo=0.5, hi=1.0)
    # sentencepiece samples this many sentences, so a 16 GB corpus trains in bounded memory/time.
    input_sentence_size: int = bounded(2_000_000, lo=1000)
    max_sentence_length: int = bounded(8192, lo=256)
    seed: int = 1
    threads: int = bounded(2, lo=1)


@dataclass(frozen=True)
class MaskingConfig:
    """What the loader does to X^orig to make the generator's/MLM's input X^mask."""

    mask_prob: float = bounded(0.15, lo=0.0, hi=1.0)  # 15% (BERT; all three papers)
    # Of the selected positions: share replaced by [MASK], by a random token; the rest kept.
    # BERT/RoBERTa: 0.8/0.1 (kept 0.1). ELECTRA's released code: 0.85/0.0 (kept 0.15).
    mask_token_prob: float = bounded(0.8, lo=0.0, hi=1.0)
    random_token_prob: float = bounded(0.1, lo=0.0, hi=1.0)
    # RoBERTa masks [CLS]/[SEP] too; COCO-LM App. D follows it. BERT masks only real tokens.
    mask_special_tokens: bool = True

    def check(self, where: str) -> None:
        if self.mask_token_prob + self.random_token_prob > 1.0:
            raise ConfigError(
                f"{where}: mask_token_prob + random_token_prob = "
                f"{self.mask_token_prob + self.random_token_prob} exceeds 1"
            )


@dataclass(frozen=True)
class StaticMaskingConfig:
    # TEAMS App. B: "duplicate training data 40 times so each sequence is masked in 40 different ways".
    duplication: int = bounded(0, lo=0, hi=1000)  # 0 = dynamic masking at load time (the default)
    masking: MaskingConfig = field(default_factory=MaskingConfig)


@dataclass(frozen=True)
class ShardsConfig:
    seq_len: int = bounded(512, lo=16, hi=8192)
    validation_fraction: float = bounded(0.01, lo=0.0, hi=0.5)
    blocks_per_shard: int = bounded(65536, lo=1)
    workers: int = bounded(2, lo=1, hi=256)
    static_masking: StaticMaskingConfig = field(default_factory=StaticMaskingConfig)
    seed: int = 1


# --------------------------------------------------------------------------------------------
# Model sizes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderConfig:
    """A BERT-style post-LayerNorm Transformer encoder."""

    hidden: int = bounded(768, lo=8)
    layers: int = bounded(12, lo=1, hi=128)
    heads: int = bounded(12, lo=1)
    ffn: int = bounded(3072, lo=8)
    embedding: int = bounded(768, lo=8)  # factorised token embedding size (ELECTRA-Small: 128)
    dropout: float = bounded(0.1, lo=0.0, hi=1.0)
    attention_dropout: float = bounded(0.1, lo=0.0, hi=1.0)
    max_positions: int = bounded(512, lo=16)
    absolute_positions: bool = True
    relative_positions: bool = True  # T5 bucketed relative position bias (COCO-LM Sec. 4)
    relative_buckets: int = bounded(32, lo=4)
    relative_max_distance: int = bounded(128, lo=2)
    layer_norm_eps: float = bounded(1e-5, lo=0.0, hi=1e-2)
    initializer_range: float = bounded(0.02, lo=0.0, hi=1.0)
    # The binary detectors' output bias at initialisation (the RTD heads, COCO-LM's copy head). "zero": the
    # papers' code. "base_rate": the log-odds of the share of tokens its positive label has under the run's
    # masking (the prior initialisation of Lin et al. 2017, Sec. 4.1), so the detector starts at the base rate
    # and its first, largest gradients (x50 in ELECTRA/COCO-LM/AMOS) do not push every token's vector toward
    # one constant: at the tiny preset that push collapsed ELECTRA's encoder (docs/training.md).
    detector_bias: Literal["zero", "base_rate"] = "zero"
    # The binary detectors' head (the RTD heads, COCO-LM's copy head): "method" = each method's own setting
    # (as its authors released it: ELECTRA's and TEAMS's dense -> GELU -> dense, COCO-LM's and AMOS's linear);
    # "linear" / "mlp" = that head for every method, so that the rows of a comparison do not differ in it.
    detector_head: Literal["method", "linear", "mlp"] = "method"
    # Candidates against the small-budget "dead phase" (docs/findings.md; bench/dead_phase.py measures them).
    # The papers' encoders are post-LN with BERT's init and plain attention logits: the defaults.
    # norm "pre": x + Attn(LN(x)), x + FFN(LN(x)), every returned layer state through one final LayerNorm
    # (Xiong et al. 2020; what lets cramming's small budget take a high learning rate).
    norm: Literal["post", "pre"] = "post"
    # qk_norm: LayerNorm on each head's queries and keys before the dot product (Dehghani et al. 2023):
    # the attention logits cannot grow or stay flat through the scale of q and k alone.
    qk_norm: bool = False
    # residual_init "depth_scaled": the attention output and FFN output projections at std / sqrt(2 x layers)
    # (GPT-2, Radford et al. 2019, Sec. 2.3), so each layer starts as a small change to its input.
    residual_init: Literal["uniform", "depth_scaled"] = "uniform"
    # relative_init: how the relative position bias starts, then it learns as before. "normal": N(0,
    # initializer_range), attention even over the row. "alibi": ALiBi's distance penalty, -slope_h x |i - j| with
    # its geometric slopes per head (Press et al. 2022, Sec. 3; symmetric in an encoder, as in MosaicBERT).
    # "previous_token": the map every finished tiny run holds, in every head: +2 toward the key before, -1 on the
    # token itself (they end at +1.4 to +2.7 and -0.4 to -1.9; mimetic initialisation's idea, Trockman and Kolter
    # 2023, for the position bias). Dead-phase candidates (docs/findings.md): under Adam a scalar bias moves at
    # most about one learning rate a step, so that map is learned slowly.
    relative_init: Literal["normal", "alibi", "previous_token"] = "normal"
    # alibi_heads: with relative_init "alibi", the slopes ALiBi gives the first heads of a model with this many
    # (None: the network's own count, the paper's). Locality as a knob: 2 heads get 1/16 and 1/256 (a distance of
    # 16 costs one logit in the steeper head), as if of 8 heads 1/2 and 1/4.
    alibi_heads: int | None = bounded(None, lo=1)
    # alibi_pick: which of that model's slopes: "first", its steepest ones (every head local at alibi_heads 8);
    # "spread", its steepest to its flattest evenly (2 heads of 8: 1/2 and 1/256, one local head, one that sees all).
    alibi_pick: Literal["first", "spread"] = "first"
    # untie_cls: [CLS] takes no distance-dependent bias, one learned scalar per head for its row and one for its
    # column instead, from 0 (TUPE, Ke et al. 2021, Sec. 3.2). With a local start (alibi_heads) the bias would
    # keep the token every sentence task reads to its first few neighbours. False: the papers' (T5's) bias.
    untie_cls: bool = False
    # same_piece_init: a prior for the head that sends a piece's attention to the same piece elsewhere in the input
    # (what STS-B reads at the tiny preset, and what forms only late; docs/findings.md, "What STS-B reads at this
    # scale"). Layer 1's query and key maps start as one map per head, scaled so that a token's logit on its own key
    # is about this value, and the relative bias's distance-0 bucket starts at minus it, so each token's attention
    # starts on its other occurrences (the query-key half of mimetic initialisation, Trockman and Kolter 2023, with
    # the token itself held back). 4: layer 1 starts with 0.18 of a piece's attention on its twin across an STS-B pair
    # (even: 0.03), inside the 0.13-0.31 of finished encoders with signal (results/pair_attention/). None: off.
    same_piece_init: float | None = bounded(None, lo=0.0)

    def check(self, where: str) -> None:
        if self.hidden % self.heads:
            raise ConfigError(f"{where}: hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.relative_max_distance <= self.relative_buckets // 4:
            raise ConfigError(
                f"{where}: relative_max_distance={self.relative_max_distance} must exceed "
                f"relative_buckets // 4 = {self.relative_buckets // 4} (T5 bucketing)"
            )
        if not (self.absolute_positions or self.relative_positions):
            raise ConfigError(f"{where}: enable absolute_positions or relative_positions (or both)")
        if self.relative_init != "normal" and not self.relative_positions:
            raise ConfigError(f"{where}: relative_init={self.relative_init} needs relative_positions: true")
        if self.alibi_heads is not None and self.relative_init != "alibi":
            raise ConfigError(f"{where}: alibi_heads={self.alibi_heads} needs relative_init: alibi")
        if self.alibi_pick != "first" and self.relative_init != "alibi":
            raise ConfigError(f"{where}: alibi_pick={self.alibi_pick} needs relative_init: alibi")
        if self.untie_cls and not self.relative_positions:
            raise ConfigError(f"{where}: untie_cls=true needs relative_positions: true")
        if self.same_piece_init is not None and not self.relative_positions:
            raise ConfigError(f"{where}: same_piece_init={self.same_piece_init} needs relative_positions: true")


@dataclass(frozen=True)
class GeneratorSize:
    """Size of an auxiliary network relative to the main model; None = same as the main model."""

    layers: int | None = bounded(None, lo=1, hi=128)
    hidden: int | None = bounded(None, lo=8)
    heads: int | None = bounded(None, lo=1)
    ffn: int | None = bounded(None, lo=8)


@dataclass(frozen=True)
class AmosGeneratorSize(GeneratorSize):
    """AMOS's generator also places its MLM exits (Sec. 4: layers 4, 6 and 8 of 8). A run's own
    `settings.exits` (Table 9's rows) take precedence; a shallower generator needs exits of its own."""

    exits: tuple[int, ...] = (4, 6, 8)

    def check(self, where: str) -> None:
        check_exits(self.exits, self.layers, f"{where}.exits")


def check_exits(exits: tuple[int, ...], layers: int | None, where: str) -> None:
    """MLM exits of a multi-exit generator: distinct positive layers in increasing order, none above
    the generator's `layers` (None: its depth is not known here)."""
    if not exits or list(exits) != sorted(set(exits)) or exits[0] < 1:
        raise ConfigError(f"{where}={list(exits)}: give distinct positive layers in increasing order")
    if layers is not None and exits[-1] > layers:
        raise ConfigError(f"{where}={list(exits)}: an exit above the generator's {layers} layers")


@dataclass(frozen=True)
class GeneratorSizes:
    """The auxiliary networks of each method at this scale. Unset, a size is the main model's (TEAMS: half
    its depth); every preset of params.yaml sets the paper's, which depends on the main model (ELECTRA: 1/3
    width at base, 1/4 at large), so it has no default of its own. The papers' sizes:"""

    electra: GeneratorSize = field(default_factory=GeneratorSize)  # same depth, 1/3 (base) or 1/4 width
    cocolm: GeneratorSize = field(default_factory=GeneratorSize)  # 4 layers base, 6 large, full width
    amos: AmosGeneratorSize = field(default_factory=AmosGeneratorSize)  # 8 layers, full width
    teams: GeneratorSize = field(default_factory=GeneratorSize)  # 1/2 depth, full width

    def check(self, where: str) -> None:
        t = self.teams
        if (t.hidden, t.heads, t.ffn) != (None, None, None):
            raise ConfigError(
                f"{where}.teams: set only `layers`: TEAMS's generator shares the discriminator's bottom layers "
                f"(Sec. 3.2), so it is as wide as the main model (hidden={t.hidden}, heads={t.heads}, ffn={t.ffn})"
            )


# --------------------------------------------------------------------------------------------
# Pretraining and fine-tuning schedules (the loops live in electralab.train / electralab.finetune)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardConfig:
    """The collapse guard (src/electralab/train/diagnostics.py, docs/training.md): held-out diagnostics
    every `every` steps and at the end; from `after` of training (never during the warm-up) a collapsed
    run stops with RepresentationCollapsed."""

    enabled: bool = True
    every: int = bounded(1000, lo=1)
    batches: int = bounded(4, lo=1)  # held-out micro-batches per check
    after: float = bounded(0.25, lo=0.0, hi=1.0)  # fraction of the steps before it judges
    max_token_cosine: float = bounded(0.99, lo=0.0, hi=1.0)
    min_base_rate_gain: float = bounded(0.02, lo=0.0, hi=1.0)


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = bounded(125_000, lo=1)
    batch_size: int = bounded(2048, lo=1)  # sequences per optimizer step (all ranks)
    micro_batch_size: int = bounded(32, lo=1)  # sequences per forward pass on one rank
    lr: float = bounded(5e-4, lo=0.0, hi=1.0)
    warmup_steps: int = bounded(10_000, lo=0)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = bounded(1e-6, lo=0.0, hi=1.0)
    weight_decay: float = bounded(0.01, lo=0.0, hi=1.0)
    clip_norm: float = bounded(2.0, lo=0.0)
    # Dropout (hidden and attention) while pretraining; None: the model's own. 0 is cramming's
    # small-budget practice (Geiping & Goldstein 2023, Sec. 4.3). Fine-tuning always uses the model's.
    dropout: float | None = bounded(None, lo=0.0, hi=1.0)
    # Short sequences first (Press et al. 2021, Shortformer's staged training; Li et al. 2022, sequence length
    # warm-up): for the first `short_seq_until` of the steps every packed row is cut into rows of
    # `short_seq_len` tokens, so a step holds the same tokens. 0: the full length throughout (the papers').
    short_seq_len: int = bounded(0, lo=0)
    short_seq_until: float = bounded(0.0, lo=0.0, hi=1.0)
    seed: int = 1
    num_workers: int = bounded(1, lo=1, hi=4096)  # data-parallel ranks; > 1 runs under Ray Train
    use_gpu: bool = False
    # bf16 autocast where the hardware computes bf16 natively (CUDA; CPUs with AVX512-BF16/AMX), else
    # fp32; "fp32" / "bf16" force one. Detected once at the start and logged (docs/findings.md, "Precision:
    # bf16 against fp32").
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # The training step: "dynamic" (eager; only the masked positions computed, the cheapest on a CPU), "static"
    # (objectives/positions.py: fixed shapes, compiled whole by torch.compile(fullgraph=True)), "cuda_graphs"
    # (static, replayed as CUDA graphs: one GPU). "auto": cuda_graphs on one GPU, else dynamic (docs/performance.md).
    step: Literal["auto", "dynamic", "static", "cuda_graphs"] = "auto"
    log_every: int = bounded(10, lo=1)
    checkpoint_every: int = bounded(1000, lo=1)
    # Also a checkpoint once this many minutes passed since the last one, so that a kill loses at most that
    # much work whatever a step costs on this machine (0: by steps only). Training is the same either way.
    checkpoint_minutes: float = bounded(5.0, lo=0.0)
    # Checkpoints kept at these fractions of training, with wall-clock and device hours
    # (COCO-LM Fig. 3 and AMOS Fig. 4 plot accuracy against pretraining hours).
    checkpoint_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    guard: GuardConfig = field(default_factory=GuardConfig)

    def check(self, where: str) -> None:
        if any(not 0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"{where}.adam_betas={list(self.adam_betas)}: betas must be in [0, 1)")
        if any(not 0 < f <= 1 for f in self.checkpoint_fractions):
            raise ConfigError(
                f"{where}.checkpoint_fractions={list(self.checkpoint_fractions)}: fractions of "
                f"training must be in (0, 1]"
            )
        if len(set(self.checkpoint_fractions)) != len(self.checkpoint_fractions):
            raise ConfigError(f"{where}.checkpoint_fractions={list(self.checkpoint_fractions)} repeats a value")
        if self.step == "cuda_graphs" and not self.use_gpu:
            raise ConfigError(f"{where}.step='cuda_graphs' replays the step on a GPU: it needs use_gpu=true")
        if self.step in ("static", "cuda_graphs") and self.short_seq_len:
            raise ConfigError(
                f"{where}.step={self.step!r} with short_seq_len={self.short_seq_len}: the short rows kept vary from "
                f"batch to batch (rows of [PAD] only are left out), a shape the static step cannot hold"
            )
        if self.step in ("static", "cuda_graphs") and self.num_workers > 1:
            raise ConfigError(
                f"{where}.step={self.step!r} with num_workers={self.num_workers}: the compiled step is not "
                f"measured under DDP yet; data-parallel runs take the dynamic step (step: dynamic or auto)"
            )


FINETUNE_TASKS = ("mnli", "qqp", "qnli", "sst2", "cola", "rte", "mrpc", "stsb", "squad2")


@dataclass(frozen=True)
class SearchSpace:
    """One fine-tuning grid: every combination of these values is a configuration."""

    lr: tuple[float, ...]  # peak learning rates
    epochs: tuple[int, ...]  # max epochs
    batch_size: tuple[int, ...]
    warmup: tuple[float, ...]  # warm-up proportion of the total steps (0.06 = 6%)

    def check(self, where: str) -> None:
        for name in ("lr", "epochs", "batch_size", "warmup"):
            values = getattr(self, name)
            if not values:
                raise ConfigError(f"{where}.{name}: empty; list at least one value")
            if len(set(values)) != len(values):
                raise ConfigError(f"{where}.{name}={list(values)} repeats a value")
        if any(not 0 < v <= 1 for v in self.lr):
            raise ConfigError(f"{where}.lr={list(self.lr)}: every learning rate must be in (0, 1]")
        if any(v < 1 for v in (*self.epochs, *self.batch_size)):
            raise ConfigError(f"{where}: epochs and batch_size must be >= 1")
        if any(not 0 <= v < 1 for v in self.warmup):
            raise ConfigError(f"{where}.warmup={list(self.warmup)}: proportions must be in [0, 1)")


@dataclass(frozen=True)
class FinetuneGrids:
    """COCO-LM Table 7 splits GLUE into small tasks (CoLA, RTE, MRPC, STS-B) and large ones (MNLI,
    QQP, QNLI, SST-2), each with its own grid; Table 8 is the SQuAD grid."""

    glue_small: SearchSpace
    glue_large: SearchSpace
    squad2: SearchSpace


@dataclass(frozen=True)
class SquadSettings:
    """SQuAD 2.0 windows and answer decoding (BERT's run_squad.py settings at base)."""

    doc_stride: int = bounded(128, lo=1)  # tokens between the starts of two context windows
    max_query_len: int = bounded(64, lo=1)  # question tokens kept
    max_answer_len: int = bounded(30, lo=1)  # longest answer span, in tokens
    n_best: int = bounded(20, lo=1)  # start/end candidates per window
    null_threshold: float = 0.0  # predict "" when null score - best span score > this
    # SQuAD caps in questions (a question is 2-4 windows, ~5x a GLUE pair); None: the general caps.
    max_train_questions: int | None = bounded(None, lo=1)
    max_eval_questions: int | None = bounded(None, lo=1)


@dataclass(frozen=True)
class TrialResources:
    """What one Tune trial asks for: CPUs locally, a GPU or a fraction of one on a cluster."""

    cpus: float = bounded(1.0, lo=0.0)
    gpus: float = bounded(0.0, lo=0.0)
    max_concurrent: int | None = bounded(None, lo=1)  # None: as many as the resources allow
    local_cpus: int | None = bounded(None, lo=1)  # CPUs of a local Ray; None: those this process may use
    # Grid trials one Tune trial trains together as one batched model (finetune/batched.py): up to this many of
    # one task that share a batch size and epochs. 1: each alone (finetune/trial.py). More fills a GPU with small
    # trials; on a CPU one at a time is faster (docs/finetuning.md, "Trials trained together (for GPUs)").
    trials_together: int = bounded(1, lo=1)


def base_grids() -> FinetuneGrids:
    """COCO-LM Table 7 (GLUE, base/base++) and Table 8 (SQuAD 2.0): the papers' fine-tuning search."""
    return FinetuneGrids(
        glue_small=SearchSpace(
            lr=(2e-5, 3e-5, 4e-5, 5e-5), epochs=(2, 3, 5, 10), batch_size=(16, 32), warmup=(0.06, 0.1)
        ),
        glue_large=SearchSpace(lr=(1e-5, 2e-5, 3e-5, 4e-5), epochs=(2, 3, 5), batch_size=(32,), warmup=(0.06,)),
        squad2=SearchSpace(lr=(2e-5, 3e-5, 4e-5, 5e-5), epochs=(2, 3), batch_size=(16, 32), warmup=(0.06, 0.1)),
    )


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning and evaluation (docs/finetuning.md): tasks, the grids, seeds, caps, extras."""

    grids: FinetuneGrids = field(default_factory=base_grids)
    tasks: tuple[str, ...] = FINETUNE_TASKS
    # The same seeds for every run and configuration; the median over them is reported.
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    max_seq_len: int = bounded(512, lo=8)
    squad: SquadSettings = field(default_factory=SquadSettings)
    # Caps for quick presets (a fixed random subset, the same for every run); None = everything.
    max_train_examples: int | None = bounded(None, lo=1)
    max_eval_examples: int | None = bounded(None, lo=1)
    # Per-task training caps; max_train_examples still binds when smaller (e.g. {sst2: 5000}: a label-scarce SST-2 whose
    # cost stays near the small tasks'; the same fixed sample for every run).
    train_caps: dict[str, int] = field(default_factory=dict)
    # Per-task max epochs in place of the task's grid's, e.g. ELECTRA's fine-tuning (google-research/electra,
    # configure_finetuning.py): 10 epochs for RTE and STS-B, 3 for the other GLUE tasks -> {stsb: [10], rte: [10]}.
    task_epochs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    eval_batch_size: int = bounded(128, lo=1)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # as pretrain.precision
    # Evaluate after every epoch (a child run's curve), or after the last one only (the result either way).
    eval_every_epoch: bool = True
    # Optimiser (COCO-LM Table 7): Adam (0.9, 0.98), eps 1e-6, weight decay 0.01, no clipping.
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = bounded(1e-6, lo=0.0, hi=1.0)
    weight_decay: float = bounded(0.01, lo=0.0, hi=1.0)
    clip_norm: float = bounded(0.0, lo=0.0)  # 0 = no clipping
    # Batches of similar lengths (fairseq's size-sorted batching); dynamic padding either way.
    group_by_length: bool = True
    # The step of grid trials trained together (resources.trials_together > 1; finetune/batched.py), as
    # pretrain.step: "dynamic" (eager; each batch as wide as its longest row), "static" (every batch full and as
    # wide as the task's longest training row, the step compiled whole), "cuda_graphs" (static, replayed as CUDA
    # graphs; static on a CPU); "auto": cuda_graphs on a GPU, else dynamic. A trial alone always runs dynamic.
    step: Literal["auto", "dynamic", "static", "cuda_graphs"] = "auto"
    # Per-run extras, driven by the run's tables: MNLI on the pretraining fraction checkpoints
    # (coco-lm/fig3, amos/fig4) and on a fraction of its labels (coco-lm/fig7).
    efficiency_tasks: tuple[str, ...] = ("mnli",)
    few_shot_tasks: tuple[str, ...] = ("mnli",)
    few_shot_fractions: tuple[float, ...] = (0.01, 0.1, 0.2)
    # "selected": the extras fine-tune with the configuration selected on the final checkpoint with
    # all labels (5 seeds); "grid": they search the task's whole grid.
    extras_grid: Literal["selected", "grid"] = "selected"
    resources: TrialResources = field(default_factory=TrialResources)
    max_failures: int = bounded(2, lo=0)  # retries of a failed trial

    def check(self, where: str) -> None:
        for key in ("tasks", "efficiency_tasks", "few_shot_tasks", "train_caps", "task_epochs"):
            unknown = [t for t in getattr(self, key) if t not in FINETUNE_TASKS]
            if unknown:
                raise ConfigError(f"{where}.{key}: {unknown[0]!r} is not a task; choose from {list(FINETUNE_TASKS)}")
        if any(cap < 1 for cap in self.train_caps.values()):
            raise ConfigError(f"{where}.train_caps={self.train_caps}: every cap must be at least 1")
        for task, epochs in self.task_epochs.items():
            if not epochs or len(set(epochs)) != len(epochs) or min(epochs) < 1:
                raise ConfigError(
                    f"{where}.task_epochs.{task}={list(epochs)}: list one or more distinct epoch counts, each >= 1"
                )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"{where}.seeds={list(self.seeds)}: list at least one seed, each once")
        if any(not 0 < f <= 1 for f in self.few_shot_fractions):
            raise ConfigError(
                f"{where}.few_shot_fractions={list(self.few_shot_fractions)}: fractions must be in (0, 1]"
            )
        if self.squad.max_query_len + 3 >= self.max_seq_len:
            raise ConfigError(
                f"{where}.squad.max_query_len={self.squad.max_query_len} leaves no room for the "
                f"context in max_seq_len={self.max_seq_len}"
            )
        context = self.max_seq_len - self.squad.max_query_len - 3
        if self.squad.doc_stride > context:
            raise ConfigError(
                f"{where}.squad.doc_stride={self.squad.doc_stride} exceeds the context window "
                f"({context} tokens = max_seq_len - max_query_len - 3): windows would skip text"
            )
        if any(not 0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"{where}.adam_betas={list(self.adam_betas)}: betas must be in [0, 1)")
        if self.resources.cpus == 0 and self.resources.gpus == 0:
            raise ConfigError(f"{where}.resources: a trial needs cpus > 0 or gpus > 0")

    def search_space(self, task: Task) -> SearchSpace:
        """The grid of `task`: its group's (task.grid: glue_small, glue_large, squad2), with its own epochs if any."""
        space = getattr(self.grids, task.grid)
        epochs = self.task_epochs.get(task.name)
        return dataclasses.replace(space, epochs=epochs) if epochs else space


@dataclass(frozen=True)
class Budget:
    """What a run trains at: the main model, its auxiliary networks and the pretraining schedule."""

    model: EncoderConfig
    generators: GeneratorSizes
    pretrain: PretrainConfig


BUDGET_PARTS = ("model", "generators", "pretrain")


@dataclass(frozen=True)
class Preset:
    corpus: CorpusConfig
    vocab: VocabConfig
    shards: ShardsConfig
    model: EncoderConfig
    generators: GeneratorSizes
    pretrain: PretrainConfig
    finetune: FinetuneConfig | None = None  # None: this preset does not fine-tune (the stage says so)
    # Named budgets besides the main one (`model`, `generators`, `pretrain`): each states what it changes
    # of those three, as deltas (`budgets.<name>.model`, `.generators`, `.pretrain`). A run with
    # `budget: ablation` trains at the main scale updated by `budgets.ablation`; a budget the preset does
    # not name is the main one. The tiny preset trains its main rows wide and shallow, where a CPU budget
    # carries signal, and its ablation tables at the papers' depths with a smaller budget of their own.
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The fine-tuning of `make first-look` (the first_look stage: the control and ELECTRA, minutes rather than
    # hours), as changes of `finetune`, e.g. {tasks: [stsb]}; None: this preset has none.
    first_look: dict[str, Any] | None = None

    def first_look_finetune(self, where: str = "first_look") -> FinetuneConfig:
        """`finetune` with the first look's changes, and without the per-run extras (fraction checkpoints, few
        labels), which belong to the figures."""
        if self.finetune is None or self.first_look is None:
            raise ConfigError(f"{where}: this preset has no first look (it needs `finetune` and `first_look`)")
        delta = {"efficiency_tasks": [], "few_shot_tasks": [], **self.first_look}
        return build(FinetuneConfig, deep_merge(to_dict(self.finetune), delta), where)

    def budget(self, name: str, where: str = "") -> Budget:
        """The model, generators and schedule of a budget (checked like the preset's own)."""
        if name not in self.budgets:
            return Budget(self.model, self.generators, self.pretrain)
        where = f"{where}.budgets.{name}" if where else f"budgets.{name}"
        delta = self.budgets[name]
        if not isinstance(delta, dict) or set(delta) - set(BUDGET_PARTS):
            unknown = sorted(set(delta) - set(BUDGET_PARTS)) if isinstance(delta, dict) else [delta]
            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}; a budget states changes of {', '.join(BUDGET_PARTS)} "
                f"(e.g. {where}.pretrain.steps)"
            )
        parts = {
            part: build(
                type(getattr(self, part)),
                deep_merge(to_dict(getattr(self, part)), delta.get(part) or {}),
                f"{where}.{part}",
            )
            for part in BUDGET_PARTS
        }
        return Budget(**parts)

    def check(self, where: str) -> None:
        if self.first_look is not None:
            self.first_look_finetune(f"{where}.first_look")
        if MAIN_BUDGET in self.budgets:
            raise ConfigError(f"{where}.budgets.{MAIN_BUDGET}: the main budget is the preset's own model and pretrain")
        for name in (MAIN_BUDGET, *self.budgets):
            model, at = (
                self.budget(name, where).model,
                f"{where}.budgets.{name}.model" if name in self.budgets else f"{where}.model",
            )
            if self.shards.seq_len > model.max_positions:
                raise ConfigError(
                    f"{where}.shards.seq_len={self.shards.seq_len} exceeds {at}.max_positions={model.max_positions}"
                )
            if self.finetune is not None and self.finetune.max_seq_len > model.max_positions:
                raise ConfigError(
                    f"{where}.finetune.max_seq_len={self.finetune.max_seq_len} exceeds "
                    f"{at}.max_positions={model.max_positions}"
                )


PRESETS = ("tiny", "small", "base", "base_pp", "large_pp")
MAIN_BUDGET = "main"


def deep_merge(base: dict, update: dict) -> dict:
    """`base` with `update` applied, nested mappings merged key by key."""
    out = dict(base)
    for k, v in update.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# --------------------------------------------------------------------------------------------
# Loading with checks
# --------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _build(tp: Any, value: Any, where: str) -> Any:
    """Convert `value` (parsed YAML) into type `tp`, raising ConfigError naming `where`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _build(inner[0], value, where)
        errors = []
        for a in inner:
            try:
                return _build(a, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} is none of {[_type_name(a) for a in inner]}")

    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not allowed; choose one of {list(args)}")
        return value

    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_build(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))

    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _build(args[1], v, f"{where}.{k}") for k, v in value.items()}

    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, where)

    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            # YAML reads 5e-4 (no dot) as a string; accept numeric strings.
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {where}")


def _build_dataclass(cls: type, value: Any, where: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} settings, got {value!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        path = f"{where}.{name}" if where else name
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{path}: missing (a {_type_name(hints[name])} is required)")
            continue
        v = _build(hints[name], value[name], path)
        lo, hi = f.metadata.get("range", (None, None))
        if v is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                allowed = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
                raise ConfigError(f"{path}={v!r} is out of range: allowed {allowed}")
        kwargs[name] = v
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(where)
    return obj


def build(cls: type, value: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a parsed-YAML mapping, checking keys, types and ranges."""
    return _build_dataclass(cls, value, where)


@dataclass(frozen=True)
class Params:
    """Everything in params.yaml, checked. `active` is the selected preset."""

    preset: str
    presets: dict[str, Preset]
    methods: dict[str, Any]  # checked by electralab.objectives (each method owns its settings)
    runs: dict[str, Any]  # checked by electralab.runs
    raw: dict[str, Any]

    @property
    def active(self) -> Preset:
        return self.presets[self.preset]


TOP_LEVEL = ("preset", "presets", "methods", "runs")

# Keys every preset sets itself: their defaults are the base setting, so a preset that lost one (a deleted
# line) would silently train at another scale (125,000 steps on a laptop).
REQUIRED_PRESET_KEYS = {
    "vocab": ("size",),
    "shards": ("seq_len",),
    "model": ("hidden", "layers", "heads", "ffn", "embedding"),
    "pretrain": ("steps", "batch_size", "micro_batch_size", "lr", "warmup_steps", "checkpoint_every"),
}


def _check_required(name: str, preset: Any) -> None:
    for section, keys in REQUIRED_PRESET_KEYS.items():
        values = preset.get(section) if isinstance(preset, dict) else None
        for key in keys:
            if not isinstance(values, dict) or key not in values:
                raise ConfigError(
                    f"presets.{name}.{section}.{key}: missing; every preset sets it (its default is "
                    f"the base setting, not this preset's)"
                )


def parse_params(raw: Any, source: str = "params.yaml") -> Params:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (allowed: {', '.join(TOP_LEVEL)})")
    preset = raw.get("preset", "tiny")
    if preset not in PRESETS:
        raise ConfigError(f"{source}: preset={preset!r} is not a preset; choose one of {list(PRESETS)}")
    presets_raw = raw.get("presets") or {}
    if not isinstance(presets_raw, dict):
        raise ConfigError(f"{source}: presets must be a mapping of preset name to settings")
    unknown = sorted(set(presets_raw) - set(PRESETS))
    if unknown:
        raise ConfigError(f"{source}: unknown preset presets.{unknown[0]} (allowed: {', '.join(PRESETS)})")
    if preset not in presets_raw:
        raise ConfigError(f"{source}: preset={preset!r} has no settings under presets.{preset}")
    for name, value in presets_raw.items():
        _check_required(name, value)
    presets = {name: build(Preset, value, f"presets.{name}") for name, value in presets_raw.items()}
    for key in ("methods", "runs"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ConfigError(f"{source}: {key} must be a mapping")
    return Params(
        preset=preset,
        presets=presets,
        methods=dict(raw.get("methods") or {}),
        runs=dict(raw.get("runs") or {}),
        raw=raw,
    )


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (run from the project root, or pass --params)") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return parse_params(raw, str(path))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last one silently,
    DVC refuses the file, so a direct stage run would train with a value `dvc repro` never sees."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"key {key!r} appears twice in one mapping (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one"
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def main(argv: list[str] | None = None) -> None:
    """`python -m electralab.config [PRESET]`: a preset with every value resolved, the code defaults
    included (params.yaml states only what differs from them)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m electralab.config", description=main.__doc__)
    parser.add_argument("preset", nargs="?", help="default: params.yaml's active preset")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        name = args.preset or params.preset
        if name not in params.presets:
            raise ConfigError(f"{args.params}: no preset {name!r}; choose one of {list(params.presets)}")
    except ConfigError as e:
        sys.exit(f"error: {e}")
    print(f"# presets.{name} as resolved from {args.params} and the code defaults")
    yaml.safe_dump({name: to_dict(params.presets[name])}, sys.stdout, sort_keys=False, width=110)


def to_dict(obj: Any) -> Any:
    """A dataclass config back to plain YAML/JSON-able values (for MLflow params and hashes)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


if __name__ == "__main__":
    main()
