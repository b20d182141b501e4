"""The Transformer encoder every method shares: BERT-style post-LayerNorm layers (pre-LayerNorm with
`norm: pre`), GELU FFN,
absolute position embeddings and/or a T5 bucketed relative position bias, attention through
`F.scaled_dot_product_attention` (fused kernels on CUDA; the bias rides along as an additive mask), written
out in training on CPU so that its dropout uses `dropout`'s cheaper mask (SDPA's CPU path with dropout is the
same math).

The encoder returns every layer's output (AMOS reads exits at layers 4/6/8, TEAMS reads layer L-1).
Token embeddings are one `nn.Embedding` passed in from outside so that the auxiliary and main
models (and every LM head) share the same Parameter.

    tokens = nn.Embedding(vocab_size, cfg.embedding)
    encoder = Encoder(cfg, tokens)
    hidden = encoder(input_ids, attention_mask)   # list of L+1 tensors (B, T, H); [0] = embeddings
"""

from __future__ import annotations

import dataclasses
import math
from typing import Collection, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from electralab.config import EncoderConfig


def init_weights(module: nn.Module, std: float) -> None:
    """BERT initialisation: N(0, std) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bidirectional bucketing (Raffel et al. 2020): half the buckets per direction, exact
    buckets for small distances, logarithmically wider ones up to max_distance, then one bucket."""
    num_buckets //= 2
    buckets = (relative_position > 0).long() * num_buckets
    distance = relative_position.abs()
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


def traced(x: torch.Tensor) -> bool:
    """Whether `x` is being traced, by torch.compile or by vmap (batched fine-tuning trials): then only plain torch
    operators, none of the CPU's hand-made fast paths (their in-place `random_` breaks a graph and has no batching
    rule)."""
    return torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(x)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout, with a cheaper mask on CPU. torch's CPU bernoulli_ draws one 32-bit number per element in a
    serial loop (15% of a 4 x 128 fine-tuning step on the AMD EPYC, docs/performance.md); here each 31-bit draw of
    the same generator gives two elements 15 random bits each, so p is rounded to a multiple of 2^-15 (0.1 ->
    0.100006). torch.manual_seed and the checkpointed RNG state govern it as they govern bernoulli_. Under
    torch.compile or vmap (batched fine-tuning trials), F.dropout: the compiler draws its own mask in the graph
    (`random_` would break it), vmap one mask a trial."""
    if not training or p == 0.0 or p == 1.0 or x.device.type != "cpu" or traced(x):
        return F.dropout(x, p, training)
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int32).random_()  # uniform on [0, 2^31)
    halves = bits.view(torch.int16)[:n].view(x.shape) & 0x7FFF  # two uniform 15-bit numbers per draw
    # The comparison written straight into x's dtype: converting a bool mask took longer than the comparison itself.
    keep = torch.ge(halves, round(p * 32768), out=torch.empty(x.shape, dtype=x.dtype))
    return x * keep.mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """nn.Dropout through `dropout` (the same p, the same place in set_dropout and state dicts)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class RelativePositionBias(nn.Module):
    """One learned scalar per (bucket, head), shared by all layers of an encoder (as in T5).

    untie_cls: [CLS] (position 0) takes no distance-dependent bias: its row (what it attends to) is one learned
    scalar per head, its column (what attends to it) another, both starting at 0 (TUPE's untied [CLS], Ke et al.
    2021, Sec. 3.2), so a local bias (ALiBi's start) leaves the sentence heads' token free to read the whole input."""

    def __init__(self, heads: int, num_buckets: int, max_distance: int, untie_cls: bool = False):
        super().__init__()
        # T5's formula needs >= 1 exact bucket per direction (num_buckets // 4) and a log range
        # beyond it; fewer buckets divide by log(1) = 0 (or by zero) in relative_position_bucket.
        if num_buckets < 4 or max_distance <= num_buckets // 4:
            raise ValueError(
                f"relative_buckets={num_buckets}, relative_max_distance={max_distance}: "
                f"T5 bucketing needs relative_buckets >= 4 and relative_max_distance > "
                f"relative_buckets // 4"
            )
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bias = nn.Embedding(num_buckets, heads)
        # (2, heads): [CLS]'s row, then its column; zeros draw nothing, so the random stream is the same either way
        self.cls = nn.Parameter(torch.zeros(2, heads)) if untie_cls else None
        self._buckets: dict[tuple[int, torch.device], torch.Tensor] = {}

    def buckets(self, length: int, device: torch.device) -> torch.Tensor:
        """The (T, T) bucket map, computed once per length: it depends on nothing else. Inside a compiled graph it
        is computed in the graph (a few elementwise operators) and never cached: a map cached while torch.compile
        traces changes the module's state under the graph's guards, and the step would compile twice."""
        if torch.compiler.is_compiling():
            return self._bucket_map(length, device)
        key = (length, device)
        if key not in self._buckets:
            self._buckets[key] = self._bucket_map(length, device)
        return self._buckets[key]

    def _bucket_map(self, length: int, device: torch.device) -> torch.Tensor:
        pos = torch.arange(length, device=device)
        return relative_position_bucket(pos[None, :] - pos[:, None], self.num_buckets, self.max_distance)

    def forward(self, length: int, device: torch.device) -> torch.Tensor:
        bias = self.bias(self.buckets(length, device)).permute(2, 0, 1)  # (heads, T, T)
        if self.cls is not None:
            heads = bias.shape[0]
            column = self.cls[1][:, None, None].expand(heads, length - 1, 1)
            row = self.cls[0][:, None, None].expand(heads, 1, length)
            bias = torch.cat([row, torch.cat([column, bias[:, 1:, 1:]], dim=2)], dim=1)
        return bias.unsqueeze(0)  # (1, heads, T, T)


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al. 2022, Sec. 3 and their code): for 2^k heads the geometric sequence
    starting at 2^(-8/heads); otherwise those of the largest power of two below, then every other slope of twice
    as many heads."""
    if math.log2(heads).is_integer():
        start = 2 ** (-8 / heads)
        return [start ** (i + 1) for i in range(heads)]
    closest = 2 ** math.floor(math.log2(heads))
    return alibi_slopes(closest) + alibi_slopes(2 * closest)[0::2][: heads - closest]


def alibi_init(
    relative_bias: RelativePositionBias, as_heads: int | None = None, pick: Literal["first", "spread"] = "first"
) -> None:
    """Start a T5 bucketed bias as ALiBi's symmetric penalty: each bucket at -slope x the smallest distance it holds
    (exact for the small distances, where T5 gives each its own bucket; a bucket no offset reaches stays at 0).
    The slopes are those of an ALiBi model with `as_heads` heads (at least the bias's own): its first (steepest) ones,
    or with `pick="spread"` its steepest to its flattest, evenly over the model's slopes (2 heads of 8: 1/2, 1/256)."""
    max_distance = relative_bias.max_distance
    offsets = torch.arange(-max_distance, max_distance + 1)
    buckets = relative_position_bucket(offsets, relative_bias.num_buckets, max_distance)
    distance = torch.zeros(relative_bias.num_buckets)
    distance = distance.scatter_reduce(0, buckets, offsets.abs().float(), "amin", include_self=False)
    heads = relative_bias.bias.embedding_dim  # one column a head
    model = alibi_slopes(max(heads, as_heads or heads))  # ALiBi's order (not monotone unless a power of two)
    if pick == "spread":
        model = sorted(model, reverse=True)
        model = [model[round(i * (len(model) - 1) / max(heads - 1, 1))] for i in range(heads)]
    slopes = torch.tensor(model[:heads])
    with torch.no_grad():
        relative_bias.bias.weight.copy_(-distance[:, None] * slopes[None, :])


def previous_token_init(relative_bias: RelativePositionBias) -> None:
    """Start every head at +2 toward the key before and -1 on the token itself (the other buckets as drawn)."""
    before, itself = relative_position_bucket(
        torch.tensor([-1, 0]), relative_bias.num_buckets, relative_bias.max_distance
    )
    with torch.no_grad():
        relative_bias.bias.weight[before] = 2.0
        relative_bias.bias.weight[itself] = -1.0


def same_piece_init(attention: SelfAttention, logit: float) -> None:
    """Start each head's key map as its query map, both made orthonormal (from the query weights as drawn, so the
    random stream is unchanged) and scaled so that a token's logit on its own key is about `logit`: for a normalised
    input (unit variance per feature) |U x|^2 is about the head's width d, and the logit is s^2 d / sqrt(d)."""
    hidden = attention.qkv.in_features
    d = hidden // attention.heads
    scale = (logit / math.sqrt(d)) ** 0.5
    with torch.no_grad():
        for head in range(attention.heads):
            query, key = slice(head * d, (head + 1) * d), slice(hidden + head * d, hidden + (head + 1) * d)
            orthonormal = torch.linalg.qr(attention.qkv.weight[query].T).Q.T  # (d, hidden)
            attention.qkv.weight[query] = scale * orthonormal
            attention.qkv.weight[key] = scale * orthonormal
        attention.qkv.bias[: 2 * hidden].zero_()


class Embeddings(nn.Module):
    """Shared token table (+ absolute positions) -> LayerNorm -> dropout -> projection to hidden."""

    def __init__(self, cfg: EncoderConfig, tokens: nn.Embedding):
        super().__init__()
        self.tokens = tokens
        self.positions = nn.Embedding(cfg.max_positions, cfg.embedding) if cfg.absolute_positions else None
        self.norm = nn.LayerNorm(cfg.embedding, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)
        # Factorised embeddings (ELECTRA-Small: 128-d) or a narrower generator sharing a wider table.
        self.project = nn.Linear(cfg.embedding, cfg.hidden) if cfg.embedding != cfg.hidden else None

    def forward(self, input_ids: torch.Tensor | None, token_embeds: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tokens(input_ids) if token_embeds is None else token_embeds  # (B, T, E)
        if self.positions is not None:
            x = x + self.positions.weight[: x.shape[1]]
        x = self.dropout(self.norm(x))
        return self.project(x) if self.project is not None else x  # (B, T, H)


class SelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)  # one matmul for q, k, v
        self.out = nn.Linear(cfg.hidden, cfg.hidden)
        self.dropout_p = cfg.attention_dropout
        d = cfg.hidden // cfg.heads
        # qk_norm: one LayerNorm over each head's query (and key) vector, shared by the heads
        self.q_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.qk_norm else None
        self.k_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, queries: int | None = None) -> torch.Tensor:
        """(B, T, H) -> (B, T, H); with `queries`, only the first `queries` positions attend (every position is
        still a key and a value): (B, queries, H)."""
        B, T, H = x.shape
        d = H // self.heads
        if queries is None:
            q, k, v = self.qkv(x).view(B, T, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        else:  # the same weights, split: queries from the first positions, keys and values from all
            w, b = self.qkv.weight, self.qkv.bias
            q = F.linear(x[:, :queries], w[:H], b[:H]).view(B, queries, self.heads, d).transpose(1, 2)
            k, v = F.linear(x, w[H:], b[H:]).view(B, T, 2, self.heads, d).permute(2, 0, 3, 1, 4)
            bias = bias[..., :queries, :] if bias is not None else None
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if bias is not None and bias.dtype != q.dtype:  # autocast: the mask must match q's dtype
            bias = bias.to(q.dtype)
        cpu_dropout = self.training and self.dropout_p > 0 and q.device.type == "cpu"
        if torch._C._functorch.is_batchedtensor(q) or (cpu_dropout and not traced(q)):
            # SDPA with dropout on CPU is its math path with bernoulli_ masks: the same math, with `dropout`. Under
            # vmap (batched fine-tuning trials) SDPA has no batching rule: written out too.
            scores = (q * d**-0.5) @ k.transpose(-1, -2)
            probs = (scores if bias is None else scores + bias).softmax(dim=-1)
            y = dropout(probs, self.dropout_p, self.training) @ v
        else:
            dropout_p = self.dropout_p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        return self.out(y.transpose(1, 2).reshape(B, q.shape[2], H))  # (B, T or queries, H)


class TransformerLayer(nn.Module):
    """Post-LayerNorm (BERT): x = LN(x + Attn(x)); x = LN(x + FFN(x)).
    Pre-LayerNorm (`norm: pre`): x = x + Attn(LN(x)); x = x + FFN(LN(x)); the Encoder normalises what it returns."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.ffn_out = nn.Linear(cfg.ffn, cfg.hidden)
        self.ffn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, queries: int | None = None) -> torch.Tensor:
        """queries: compute the output at the first `queries` positions only (see SelfAttention)."""
        residual = x if queries is None else x[:, :queries]
        if self.pre_norm:
            x = residual + self.dropout(self.attention(self.attention_norm(x), bias, queries))
            return x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(self.ffn_norm(x)))))
        x = self.attention_norm(residual + self.dropout(self.attention(x, bias, queries)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


def init_layer(layer: TransformerLayer, cfg: EncoderConfig) -> None:
    """BERT's initialisation; with `residual_init: depth_scaled` the two projections that write into the
    residual stream at std / sqrt(2 x layers) (GPT-2)."""
    init_weights(layer, cfg.initializer_range)
    if cfg.residual_init == "depth_scaled":
        std = cfg.initializer_range / math.sqrt(2 * cfg.layers)
        nn.init.normal_(layer.attention.out.weight, std=std)
        nn.init.normal_(layer.ffn_out.weight, std=std)


class Encoder(nn.Module):
    """A stack of TransformerLayers over shared token embeddings.

    `embeddings`, `relative_bias`, `shared_layers` and `final_norm` let another encoder's modules be reused
    as the same Parameters (TEAMS ties its generator's bottom layers to the discriminator's).

    Pre-LN (`norm: pre`): each layer reads and writes the raw residual stream, and every state the encoder
    returns (the outputs of layers 1..L, and of `run_layer`) goes through one final LayerNorm, so AMOS's
    exits, TEAMS's task layers and every head read normalised states as they do post-LN.
    """

    static = False  # a [PAD] mask whether or not the batch holds [PAD]: no host sync (objectives.common.set_static)

    def __init__(
        self,
        cfg: EncoderConfig,
        tokens: nn.Embedding,
        *,
        embeddings: Embeddings | None = None,
        relative_bias: RelativePositionBias | None = None,
        shared_layers: Sequence[TransformerLayer] = (),
        final_norm: nn.LayerNorm | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        own = cfg.layers - len(shared_layers)
        if own < 0:
            raise ValueError(f"cannot share {len(shared_layers)} layers with a {cfg.layers}-layer encoder")
        if embeddings is None:
            embeddings = Embeddings(cfg, tokens)
            for name, m in embeddings.named_children():
                if name != "tokens":  # the shared token table is initialised by its owner
                    init_weights(m, cfg.initializer_range)
        self.embeddings = embeddings
        if relative_bias is None and cfg.relative_positions:
            relative_bias = RelativePositionBias(
                cfg.heads, cfg.relative_buckets, cfg.relative_max_distance, untie_cls=cfg.untie_cls
            )
            init_weights(relative_bias, cfg.initializer_range)  # drawn whatever the init: the same random stream
            if cfg.relative_init == "alibi":
                alibi_init(relative_bias, cfg.alibi_heads, cfg.alibi_pick)
            elif cfg.relative_init == "previous_token":
                previous_token_init(relative_bias)
            if cfg.same_piece_init is not None:  # the token itself held back (same_piece_init, below)
                zero = torch.tensor(0, device="cpu")  # an index, also where the model is built on the meta device
                itself = int(relative_position_bucket(zero, cfg.relative_buckets, cfg.relative_max_distance))
                with torch.no_grad():
                    relative_bias.bias.weight[itself] = -cfg.same_piece_init
        self.relative_bias = relative_bias if cfg.relative_positions else None
        new_layers = [TransformerLayer(cfg) for _ in range(own)]
        for layer in new_layers:
            init_layer(layer, cfg)
        if cfg.same_piece_init is not None and new_layers and not shared_layers:  # layer 1 is this encoder's own
            same_piece_init(new_layers[0].attention, cfg.same_piece_init)
        self.layers = nn.ModuleList([*shared_layers, *new_layers])
        if final_norm is None and cfg.norm == "pre":
            final_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.final_norm = final_norm if cfg.norm == "pre" else None

    @classmethod
    def from_parts(
        cls,
        cfg: EncoderConfig,
        embeddings: Embeddings,
        relative_bias: RelativePositionBias | None,
        layers: Sequence[TransformerLayer],
        final_norm: nn.LayerNorm | None = None,
    ) -> "Encoder":
        """An encoder view over existing modules (same Parameters): TEAMS exports its MWS branch so."""
        return cls(
            dataclasses.replace(cfg, layers=len(layers)),
            embeddings.tokens,
            embeddings=embeddings,
            relative_bias=relative_bias,
            shared_layers=layers,
            final_norm=final_norm,
        )

    def attention_bias(
        self, attention_mask: torch.Tensor | None, length: int, device: torch.device
    ) -> torch.Tensor | None:
        """Additive attention mask (B or 1, heads or 1, T, T): relative bias + -inf on [PAD] keys."""
        bias = self.relative_bias(length, device) if self.relative_bias is not None else None
        # Packed pretraining blocks rarely hold [PAD]: without one, keep the bias (1, heads, T, T)
        # rather than (B, heads, T, T), and with no relative bias either, let SDPA pick its fused
        # mask-free kernels (flash attention on CUDA).
        if attention_mask is not None and (self.static or not bool(attention_mask.all())):
            pad = torch.zeros(attention_mask.shape, dtype=torch.float32, device=device)
            pad = pad.masked_fill(~attention_mask, torch.finfo(torch.float32).min)[:, None, None, :]
            bias = pad if bias is None else bias + pad
        return bias

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        token_embeds: torch.Tensor | None = None,
        detach_after: Collection[int] = (),
        last_layer_queries: int | None = None,
        raw: bool = False,
    ) -> list[torch.Tensor]:
        """Returns [embeddings, layer 1, ..., layer L] outputs, each (B, T, H).

        detach_after: layer numbers after which the next layer sees a stop-gradient copy
        (AMOS partitions its generator into blocks that learn only from their own MLM exit).
        last_layer_queries: the last layer's output at the first positions only, (B, n, H): a sentence
        head reads [CLS] alone, and the rest of the last layer (its queries, attention output, FFN) would be
        computed for nothing. The same values as the full layer's first rows.
        raw: pre-LN, the residual stream itself (before the final norm), what a layer stacked on top reads
        (TEAMS's task layers, through `run_layer`); post-LN it is the same list.
        """
        x = self.embeddings(input_ids, token_embeds)  # (B, T, H)
        bias = self.attention_bias(attention_mask, x.shape[1], x.device)
        hidden = [x]
        for number, layer in enumerate(self.layers, start=1):
            x = layer(x, bias, last_layer_queries if number == len(self.layers) else None)
            hidden.append(x if raw else self.normalize(x))
            if number in detach_after:
                x = x.detach()
        return hidden

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """A raw state as the encoder returns it: through the final norm (pre-LN), unchanged (post-LN)."""
        return x if self.final_norm is None else self.final_norm(x)

    def run_layer(self, layer: TransformerLayer, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Apply an extra layer (a TEAMS task head) to a raw state (forward(raw=True)) with this encoder's
        attention bias; its output as the encoder returns a layer's, so a view ending in it (from_parts)
        computes the same."""
        return self.normalize(layer(x, self.attention_bias(attention_mask, x.shape[1], x.device)))


def set_dropout(module: nn.Module, p: float) -> None:
    """Every dropout of `module` that is on (hidden and attention probabilities) to p, in place: the
    pretraining override (pretrain.dropout). One a method turned off stays off (AMOS's generator).
    Configs are untouched, so an exported encoder keeps its own dropout for fine-tuning."""
    for m in module.modules():
        if isinstance(m, nn.Dropout) and m.p > 0:
            m.p = p
        elif isinstance(m, SelfAttention) and m.dropout_p > 0:
            m.dropout_p = p


def make_token_embedding(vocab_size: int, dim: int, std: float = 0.02) -> nn.Embedding:
    tokens = nn.Embedding(vocab_size, dim)
    nn.init.normal_(tokens.weight, std=std)
    return tokens


def count_parameters(module: nn.Module) -> int:
    """Distinct parameters (a shared Parameter counts once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
