"""The shared encoder against hand-written references: T5 relative buckets, SDPA attention with an
additive bias and [PAD] mask, the post-LayerNorm layer order, the layer outputs, stop-gradients,
shared parts, the papers' parameter counts, the last layer at [CLS] only, and the CPU dropout mask."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import VOCAB, jitter, tiny_model

from electralab.config import EncoderConfig, load_params
from electralab.errors import ConfigError
from electralab.model.encoder import (
    Dropout,
    Encoder,
    RelativePositionBias,
    SelfAttention,
    TransformerLayer,
    alibi_slopes,
    count_parameters,
    dropout,
    make_token_embedding,
    relative_position_bucket,
)

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# Hand-written references (no code under test)
# --------------------------------------------------------------------------------------------


def t5_bucket(rel: int, num_buckets: int, max_distance: int) -> int:
    """T5's bidirectional relative-position bucket of one distance rel = key - query, written
    from Raffel et al. (2020) / mesh-tensorflow `_relative_position_bucket`: half of the buckets for
    keys after the query; in each half, exact buckets below num_buckets/4, then log-spaced buckets up
    to max_distance, everything farther in the last bucket."""
    half = num_buckets // 2
    offset = half if rel > 0 else 0
    n = abs(rel)
    exact = half // 2
    if n < exact:
        return offset + n
    log_bucket = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return offset + min(log_bucket, half - 1)


def layer_norm(x, ln):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def manual_attention(x, attn: SelfAttention, bias):
    """softmax(Q K^T / sqrt(d) + bias) V per head, heads concatenated, then the output projection.
    qkv's rows are [W_q; W_k; W_v], head h owning rows h*d..(h+1)*d of each."""
    B, T, H = x.shape
    nh = attn.heads
    d = H // nh
    W, b = attn.qkv.weight, attn.qkv.bias
    q = x @ W[:H].T + b[:H]
    k = x @ W[H : 2 * H].T + b[H : 2 * H]
    v = x @ W[2 * H :].T + b[2 * H :]
    heads = []
    for h in range(nh):
        sl = slice(h * d, (h + 1) * d)
        scores = q[..., sl] @ k[..., sl].transpose(-1, -2) / math.sqrt(d)  # (B, T, T)
        if bias is not None:
            scores = scores + bias[:, h if bias.shape[1] > 1 else 0]
        heads.append(torch.softmax(scores, -1) @ v[..., sl])
    y = torch.cat(heads, -1)
    return y @ attn.out.weight.T + attn.out.bias


def manual_layer(x, layer: TransformerLayer, bias):
    """BERT's post-LN layer: x = LN(x + Attn(x)); x = LN(x + W2 GELU(W1 x))."""
    x = layer_norm(x + manual_attention(x, layer.attention, bias), layer.attention_norm)
    erf_gelu = lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))
    ffn = erf_gelu(x @ layer.ffn_in.weight.T + layer.ffn_in.bias) @ layer.ffn_out.weight.T + layer.ffn_out.bias
    return layer_norm(x + ffn, layer.ffn_norm)


def pad_bias(attention_mask):
    return torch.zeros(attention_mask.shape).masked_fill(~attention_mask, float("-inf"))[:, None, None, :]


def build(cfg: EncoderConfig, seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder(cfg, make_token_embedding(VOCAB, cfg.embedding)).eval()


# --------------------------------------------------------------------------------------------
# Relative position bias
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("buckets,max_distance", [(32, 128), (64, 128), (128, 256), (8, 16), (4, 8), (16, 20)])
def test_relative_bucket_matches_scalar_t5(buckets, max_distance):
    rel = torch.arange(-200, 201)
    got = relative_position_bucket(rel, buckets, max_distance).tolist()
    want = [t5_bucket(r, buckets, max_distance) for r in rel.tolist()]
    assert got == want
    assert got[200] == 0 and got[201] == buckets // 2 + 1  # rel 0 and +1 (keys after the query)
    far = relative_position_bucket(torch.tensor([-10 * max_distance, 10 * max_distance]), buckets, max_distance)
    assert far.tolist() == [buckets // 2 - 1, buckets - 1]  # beyond max_distance: the last bucket


def test_relative_bias_is_one_scalar_per_bucket_and_head_shared_by_layers():
    torch.manual_seed(0)
    rb = RelativePositionBias(heads=3, num_buckets=8, max_distance=16)
    T = 20
    out = rb(T, torch.device("cpu"))
    assert out.shape == (1, 3, T, T)
    for i in range(T):  # query i, key j, rel = j - i
        for j in range(T):
            want = rb.bias.weight[t5_bucket(j - i, 8, 16)]
            assert torch.equal(out[0, :, i, j], want)
    enc = build(tiny_model())
    assert sum(isinstance(m, RelativePositionBias) for m in enc.modules()) == 1  # one, for all layers


def test_relative_bias_rejects_too_few_buckets():
    with pytest.raises(ValueError, match="relative_buckets"):
        RelativePositionBias(heads=2, num_buckets=2, max_distance=8)


# --------------------------------------------------------------------------------------------
# Attention and the post-LN layer
# --------------------------------------------------------------------------------------------


def test_sdpa_attention_equals_manual_softmax_with_bias_and_pad_mask():
    torch.manual_seed(0)
    cfg = tiny_model(hidden=8, heads=2)
    attn = SelfAttention(cfg).eval()
    B, T = 2, 5
    x = torch.randn(B, T, 8)
    rel = torch.randn(1, 2, T, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 3:] = False  # two [PAD] keys in row 0
    bias = rel + pad_bias(mask)
    got = attn(x, bias)
    want = manual_attention(x, attn, rel + pad_bias(mask))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # [PAD] keys are masked: changing them moves nothing at the real positions.
    x2 = x.clone()
    x2[0, 3:] = torch.randn(2, 8) * 10
    torch.testing.assert_close(attn(x2, bias)[0, :3], got[0, :3], atol=1e-5, rtol=1e-5)
    # ...and without the mask they would (the check can fail).
    assert not torch.allclose(attn(x2, rel)[0, :3], attn(x, rel)[0, :3], atol=1e-3)
    # The bias matters: without it the output differs.
    assert not torch.allclose(attn(x, None), got, atol=1e-3)


def test_encoder_attention_bias_is_relative_plus_pad_mask():
    enc = build(tiny_model())
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    bias = enc.attention_bias(mask, 6, torch.device("cpu"))
    rel = enc.relative_bias(6, torch.device("cpu"))
    torch.testing.assert_close(bias[0], rel[0])
    assert torch.all(bias[1, :, :, 4:] < -1e30) and torch.equal(bias[1, :, :, :4], rel[0, :, :, :4])
    assert enc.attention_bias(None, 6, torch.device("cpu")) is not None  # relative bias alone
    no_rel = build(tiny_model(relative_positions=False))
    assert no_rel.attention_bias(None, 6, torch.device("cpu")) is None


def test_transformer_layer_is_post_layernorm():
    torch.manual_seed(0)
    cfg = tiny_model(hidden=8, heads=2, ffn=16)
    layer = TransformerLayer(cfg).eval()
    for p in layer.parameters():  # non-trivial LayerNorm affine params too
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 5, 8)
    bias = torch.randn(1, 2, 5, 5)
    torch.testing.assert_close(layer(x, bias), manual_layer(x, layer, bias), atol=1e-5, rtol=1e-5)
    # A pre-LN layer would differ (the check can fail).
    pre = x + manual_attention(layer_norm(x, layer.attention_norm), layer.attention, bias)
    assert not torch.allclose(layer(x, bias), pre, atol=1e-2)


def test_pre_layernorm_layer_normalises_each_sublayers_input_and_keeps_the_raw_residual():
    torch.manual_seed(0)
    cfg = tiny_model(hidden=8, heads=2, ffn=16, norm="pre")
    layer = TransformerLayer(cfg).eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 5, 8) * 3  # a residual stream far from unit scale: pre-LN leaves it so
    bias = torch.randn(1, 2, 5, 5)
    erf_gelu = lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))
    h = x + manual_attention(layer_norm(x, layer.attention_norm), layer.attention, bias)
    u = layer_norm(h, layer.ffn_norm)
    want = h + erf_gelu(u @ layer.ffn_in.weight.T + layer.ffn_in.bias) @ layer.ffn_out.weight.T + layer.ffn_out.bias
    torch.testing.assert_close(layer(x, bias), want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(layer(x, bias), manual_layer(x, layer, bias), atol=1e-2)  # not the post-LN one


def test_pre_layernorm_encoder_returns_every_layer_through_its_final_norm():
    enc = jitter(build(tiny_model(layers=3, norm="pre")))
    ids, mask = torch.randint(5, VOCAB, (2, 9)), torch.ones(2, 9, dtype=torch.bool)
    hidden = enc(ids, mask)
    bias = enc.attention_bias(mask, 9, torch.device("cpu"))
    x = hidden[0]
    for i, layer in enumerate(enc.layers, start=1):
        x = layer(x, bias)  # the raw stream: each layer reads the last one's un-normalised output
        torch.testing.assert_close(hidden[i], layer_norm(x, enc.final_norm))
    raw = enc(ids, mask, raw=True)
    for h, r in zip(hidden[1:], raw[1:]):
        torch.testing.assert_close(h, layer_norm(r, enc.final_norm))
    extra = jitter(TransformerLayer(enc.cfg).eval(), seed=3)
    torch.testing.assert_close(enc.run_layer(extra, raw[2], mask), layer_norm(extra(raw[2], bias), enc.final_norm))
    # a view over the same parts shares the final norm, so the exported branch computes what trained
    view = Encoder.from_parts(enc.cfg, enc.embeddings, enc.relative_bias, [*enc.layers[:2], extra], enc.final_norm)
    assert view.final_norm is enc.final_norm
    torch.testing.assert_close(view(ids, mask)[-1], enc.run_layer(extra, raw[2], mask))
    assert build(tiny_model()).final_norm is None  # post-LN: every layer ends in its own norm


def test_qk_norm_normalises_each_heads_queries_and_keys():
    torch.manual_seed(0)
    cfg = tiny_model(hidden=8, heads=2, qk_norm=True, attention_dropout=0.0)
    attn = jitter(SelfAttention(cfg).eval())
    x, bias = torch.randn(2, 5, 8), torch.randn(1, 2, 5, 5)
    W, b, d = attn.qkv.weight, attn.qkv.bias, 4
    q, k, v = (x @ W[i * 8 : (i + 1) * 8].T + b[i * 8 : (i + 1) * 8] for i in range(3))
    heads = []
    for h in range(2):
        sl = slice(h * d, (h + 1) * d)
        qh, kh = layer_norm(q[..., sl], attn.q_norm), layer_norm(k[..., sl], attn.k_norm)
        heads.append(torch.softmax(qh @ kh.transpose(-1, -2) / math.sqrt(d) + bias[:, h], -1) @ v[..., sl])
    want = torch.cat(heads, -1) @ attn.out.weight.T + attn.out.bias
    torch.testing.assert_close(attn(x, bias), want, atol=1e-5, rtol=1e-5)
    assert SelfAttention(tiny_model()).q_norm is None


def test_depth_scaled_init_shrinks_only_the_residual_projections():
    cfg = tiny_model(hidden=64, ffn=256, layers=8, residual_init="depth_scaled")
    enc, plain = build(cfg), build(tiny_model(hidden=64, ffn=256, layers=8))
    want = cfg.initializer_range / math.sqrt(2 * 8)
    for layer, ref in zip(enc.layers, plain.layers):
        assert float(layer.attention.out.weight.std()) == pytest.approx(want, rel=0.1)
        assert float(layer.ffn_out.weight.std()) == pytest.approx(want, rel=0.1)
        assert float(layer.ffn_in.weight.std()) == pytest.approx(cfg.initializer_range, rel=0.1)
        assert float(ref.ffn_out.weight.std()) == pytest.approx(cfg.initializer_range, rel=0.1)


def test_alibi_slopes_are_the_papers():
    # Press et al. 2022's get_slopes: 2^(-8/n) to the powers 1..n; 12 heads: the 8's, then every other of 16's.
    assert alibi_slopes(2) == [2**-4, 2**-8] and alibi_slopes(1) == [2**-8]
    assert alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    assert alibi_slopes(12) == pytest.approx([2.0**-i for i in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5])


def test_relative_inits_start_the_bias_at_alibi_or_the_previous_token_map_and_leave_the_rest_as_it_was():
    shape = dict(layers=2, relative_buckets=32, relative_max_distance=128)  # the presets' buckets
    plain = build(tiny_model(**shape))
    enc = build(tiny_model(**shape, relative_init="alibi"))
    bias = enc.relative_bias(40, torch.device("cpu"))[0]  # (heads, T, T)
    distance = (torch.arange(40)[None, :] - torch.arange(40)[:, None]).abs()
    for h, slope in enumerate(alibi_slopes(2)):
        exact = distance < 8  # T5 gives the distances below num_buckets // 4 a bucket each
        torch.testing.assert_close(bias[h][exact], -slope * distance[exact].float())
        assert bool((bias[h][~exact] <= -slope * 8).all())  # farther buckets: at least the penalty of 8
        assert torch.equal(bias[h], bias[h].T)  # symmetric: an encoder looks both ways
    # Only the bias differs: the same random stream drew every other weight.
    others = {k: v for k, v in plain.state_dict().items() if "relative_bias" not in k}
    assert all(torch.equal(v, enc.state_dict()[k]) for k, v in others.items())
    previous = build(tiny_model(**shape, relative_init="previous_token")).relative_bias(40, torch.device("cpu"))[0]
    offset = torch.arange(40)[None, :] - torch.arange(40)[:, None]  # key - query
    assert bool((previous[:, offset == -1] == 2.0).all()) and bool((previous[:, offset == 0] == -1.0).all())
    torch.testing.assert_close(
        previous[:, offset == 1], plain.relative_bias(40, torch.device("cpu"))[0][:, offset == 1]
    )
    with pytest.raises(ConfigError, match="relative_init=alibi needs relative_positions"):
        tiny_model(relative_init="alibi", relative_positions=False).check("model")


def test_alibi_heads_gives_the_steeper_slopes_of_a_model_with_more_heads():
    shape = dict(layers=1, relative_buckets=32, relative_max_distance=128, relative_init="alibi")  # the presets'
    steep = build(tiny_model(**shape, alibi_heads=8)).relative_bias(4, torch.device("cpu"))[0]
    torch.testing.assert_close(steep[:, 0, 1], torch.tensor([-0.5, -0.25]))  # 8 heads' first two slopes, distance 1
    torch.testing.assert_close(steep[:, 0, 3], torch.tensor([-1.5, -0.75]))
    own = build(tiny_model(**shape, alibi_heads=1)).relative_bias(4, torch.device("cpu"))[0]
    torch.testing.assert_close(own[:, 0, 1], -torch.tensor(alibi_slopes(2)))  # fewer than its own: its own
    with pytest.raises(ConfigError, match="alibi_heads=8 needs relative_init: alibi"):
        tiny_model(alibi_heads=8).check("model")
    spread = build(tiny_model(**shape, alibi_heads=8, alibi_pick="spread")).relative_bias(4, torch.device("cpu"))[0]
    torch.testing.assert_close(spread[:, 0, 2], torch.tensor([-1.0, -2 / 256]))  # 8 heads' steepest and flattest
    twelve = build(tiny_model(**shape, alibi_heads=12)).relative_bias(2, torch.device("cpu"))[0, :, 0, 1]
    torch.testing.assert_close(twelve, -torch.tensor(alibi_slopes(12)[:2]))  # "first": ALiBi's own order
    one = build(tiny_model(**{**shape, "hidden": 16, "heads": 1}, alibi_heads=8, alibi_pick="spread"))
    torch.testing.assert_close(one.relative_bias(2, torch.device("cpu"))[0, :, 0, 1], torch.tensor([-0.5]))  # steepest
    with pytest.raises(ConfigError, match="alibi_pick=spread needs relative_init: alibi"):
        tiny_model(alibi_pick="spread").check("model")


def test_untie_cls_gives_cls_a_learned_row_and_column_and_leaves_the_rest_and_the_random_stream():
    shape = dict(layers=2, relative_buckets=32, relative_max_distance=128, relative_init="alibi", alibi_heads=8)
    tied, untied = build(tiny_model(**shape)), build(tiny_model(**shape, untie_cls=True))
    for name, p in tied.named_parameters():  # the same draws: the two scalars per head draw nothing
        torch.testing.assert_close(untied.get_parameter(name), p)
    T, cpu = 40, torch.device("cpu")
    with torch.no_grad():
        untied.relative_bias.cls.copy_(torch.tensor([[0.5, -0.5], [1.0, 2.0]]))
    local, free = tied.relative_bias(T, cpu)[0], untied.relative_bias(T, cpu)[0]
    assert local[0, 0, T - 1] < -10  # the steep start keeps [CLS] to its neighbours...
    assert torch.equal(free[:, 0, :], torch.tensor([0.5, -0.5])[:, None].expand(2, T))  # ...untied: its row
    assert torch.equal(free[:, 1:, 0], torch.tensor([1.0, 2.0])[:, None].expand(2, T - 1))  # and its column
    assert torch.equal(free[:, 1:, 1:], local[:, 1:, 1:])  # every other pair: the bias
    ids = torch.randint(5, VOCAB, (3, T))
    untied(ids)[-1][:, 0].sum().backward()  # [CLS]'s output learns its row's scalars
    assert untied.relative_bias.cls.grad[0].abs().min() > 0
    with pytest.raises(ConfigError, match="untie_cls=true needs relative_positions"):
        tiny_model(untie_cls=True, relative_positions=False).check("model")


# --------------------------------------------------------------------------------------------
# The encoder
# --------------------------------------------------------------------------------------------


def test_encoder_returns_embeddings_plus_every_layer_output():
    cfg = tiny_model(embedding=16)  # factorised: 16-d embeddings projected to 32
    enc = jitter(build(cfg))
    torch.manual_seed(1)
    ids = torch.randint(5, VOCAB, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, 8:] = False
    hidden = enc(ids, mask)
    assert len(hidden) == cfg.layers + 1 and all(h.shape == (2, 10, 32) for h in hidden)
    e = enc.embeddings
    want0 = layer_norm(e.tokens.weight[ids] + e.positions.weight[:10], e.norm) @ e.project.weight.T + e.project.bias
    torch.testing.assert_close(hidden[0], want0, atol=1e-5, rtol=1e-5)
    bias = enc.relative_bias(10, torch.device("cpu")) + pad_bias(mask)
    x = want0
    for i, layer in enumerate(enc.layers, start=1):
        x = manual_layer(x, layer, bias)
        torch.testing.assert_close(hidden[i], x, atol=1e-4, rtol=1e-4)


def test_relative_bias_off_has_no_bias_module():
    enc = build(tiny_model(relative_positions=False))
    assert enc.relative_bias is None
    assert not any(isinstance(m, RelativePositionBias) for m in enc.modules())
    assert not any("relative" in n for n, _ in enc.named_parameters())
    ids = torch.randint(5, VOCAB, (1, 8))
    assert len(enc(ids)) == 13


def test_absolute_positions_on_and_off():
    ids = torch.full((1, 6), 7)  # the same token everywhere
    on = build(tiny_model(relative_positions=False))
    assert on.embeddings.positions is not None
    emb = on(ids)[0][0]
    assert not torch.allclose(emb[0], emb[1])  # positions distinguish equal tokens
    off = build(tiny_model(absolute_positions=False))
    assert off.embeddings.positions is None
    assert not any("positions.weight" in n for n, _ in off.named_parameters())
    emb = off(ids)[0][0]
    torch.testing.assert_close(emb[0], emb[1])  # no absolute position information in the embeddings
    # Without any position information the encoder is permutation-equivariant; either kind of
    # position information breaks that.
    torch.manual_seed(3)
    ids = torch.randint(5, VOCAB, (1, 8))
    perm = torch.randperm(8)
    nopos = build(tiny_model(absolute_positions=False, relative_positions=False))
    torch.testing.assert_close(nopos(ids[:, perm])[-1], nopos(ids)[-1][:, perm], atol=1e-5, rtol=1e-5)
    torch.nn.init.normal_(off.relative_bias.bias.weight, std=1.0)  # a trained-size bias, not 0.02
    for enc in (on, off):
        assert not torch.allclose(enc(ids[:, perm])[-1], enc(ids)[-1][:, perm], atol=1e-3)


def test_detach_after_blocks_gradients_below():
    enc = build(tiny_model(relative_positions=False))
    ids = torch.randint(5, VOCAB, (2, 8))
    hidden = enc(ids, detach_after={4, 8})
    hidden[-1].pow(2).sum().backward()  # the top block's exit
    for n, layer in enumerate(enc.layers, start=1):
        grads = [p.grad for p in layer.parameters()]
        if n <= 8:
            assert all(g is None for g in grads), n
        else:
            assert all(g is not None and g.abs().sum() > 0 for g in grads), n
    assert all(p.grad is None for p in enc.embeddings.parameters())
    enc.zero_grad(set_to_none=True)
    hidden = enc(ids, detach_after={4, 8})
    hidden[6].pow(2).sum().backward()  # the middle block's exit: layers 5-6 only
    got = {n for n, layer in enumerate(enc.layers, start=1) if layer.ffn_in.weight.grad is not None}
    assert got == {5, 6}
    enc.zero_grad(set_to_none=True)
    enc(ids)[-1].pow(2).sum().backward()  # no detach: everything learns from the top
    assert all(p.grad is not None for p in enc.parameters())
    # The outputs themselves are unchanged by detaching.
    torch.testing.assert_close(enc(ids, detach_after={4})[-1], enc(ids)[-1])


def test_from_parts_reuses_the_same_parameters():
    enc = build(tiny_model())
    extra = TransformerLayer(enc.cfg)
    view = Encoder.from_parts(enc.cfg, enc.embeddings, enc.relative_bias, [*enc.layers[:-1], extra])
    assert view.embeddings is enc.embeddings and view.relative_bias is enc.relative_bias
    assert view.cfg.layers == 12 and len(view.layers) == 12
    assert all(a is b for a, b in zip(view.layers[:-1], enc.layers[:-1])) and view.layers[-1] is extra
    own = {id(p) for p in enc.parameters()} | {id(p) for p in extra.parameters()}
    assert {id(p) for p in view.parameters()} <= own
    ids = torch.randint(5, VOCAB, (2, 8))
    view.eval(), extra.eval()
    h_enc = enc(ids)
    torch.testing.assert_close(view(ids)[-1], extra(h_enc[-2], enc.relative_bias(8, ids.device)))


# --------------------------------------------------------------------------------------------
# Parameter counts of the papers' configurations (built on the meta device: no memory, instant)
# --------------------------------------------------------------------------------------------

# (preset, the paper's main-model size, relative tolerance, source)
PAPER_SIZES = [
    ("base", 110e6, 0.01, "BERT-base size, 32,768 vocab (COCO-LM Table 1; TEAMS Table 1)"),
    ("base_pp", 134e6, 0.01, "COCO-LM base++ Table 1 (64,000 vocab)"),
    ("large_pp", 367e6, 0.01, "COCO-LM large++ Table 1 (64,000 vocab)"),
    # TEAMS Table 1 reports small as "14M", two significant digits: ELECTRA-Small's 13.5M with a
    # 30,522 vocab, 13.8M with ours; the check is to the paper's precision (+-0.5M).
    ("small", 14e6, 0.5 / 14, "TEAMS/ELECTRA-Small Table 1, rounded to 14M"),
]


@pytest.mark.parametrize("preset,paper,tol,source", PAPER_SIZES, ids=[p[0] for p in PAPER_SIZES])
def test_parameter_counts_match_the_papers(preset, paper, tol, source):
    pr = load_params(ROOT / "params.yaml").presets[preset]
    with torch.device("meta"):
        enc = Encoder(pr.model, make_token_embedding(pr.vocab.size, pr.model.embedding))
    n = count_parameters(enc)
    print(
        f"\n{preset}: {n:,} parameters ({n / 1e6:.2f}M) vs {paper / 1e6:.0f}M [{source}]; "
        f"off by {100 * (n - paper) / paper:+.2f}%"
    )
    assert abs(n - paper) <= tol * paper


def test_count_parameters_counts_shared_once():
    tokens = make_token_embedding(VOCAB, 32)
    a = Encoder(tiny_model(), tokens)
    b = Encoder(
        tiny_model(), tokens, embeddings=a.embeddings, relative_bias=a.relative_bias, shared_layers=a.layers[:3]
    )
    both = torch.nn.ModuleList([a, b])
    own_b = sum(p.numel() for layer in b.layers[3:] for p in layer.parameters())
    assert count_parameters(both) == count_parameters(a) + own_b


# --------------------------------------------------------------------------------------------
# bf16 autocast (the CUDA path): the bias is cast to q's dtype
# --------------------------------------------------------------------------------------------


def test_bf16_autocast_runs_and_matches_fp32_loosely():
    enc = build(tiny_model(layers=2))
    ids = torch.randint(5, VOCAB, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 9:] = False
    want = enc(ids, mask)[-1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = enc(ids, mask)[-1]
    assert got.dtype in (torch.bfloat16, torch.float32) and torch.isfinite(got.float()).all()
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.05)


# --------------------------------------------------------------------------------------------
# Speed paths: the last layer at the first positions only, the CPU dropout mask
# --------------------------------------------------------------------------------------------


def test_last_layer_queries_give_the_full_layers_first_rows_and_gradients():
    cfg = tiny_model(embedding=16)
    enc = jitter(build(cfg))
    torch.manual_seed(2)
    ids = torch.randint(5, VOCAB, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False

    def run(queries):
        enc.zero_grad()
        hidden = enc(ids, mask, last_layer_queries=queries)
        hidden[-1][:, 0].pow(2).sum().backward()
        return hidden, {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}

    full, full_grads = run(None)
    fast, fast_grads = run(1)
    assert fast[-1].shape == (3, 1, 32) and all(f.shape == (3, 9, 32) for f in fast[:-1])
    torch.testing.assert_close(fast[-1][:, 0], full[-1][:, 0], atol=1e-5, rtol=1e-5)
    assert full_grads.keys() == fast_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)
    # Two queries: the first two rows; the other rows' outputs are not the first one's (the check can fail).
    torch.testing.assert_close(enc(ids, mask, last_layer_queries=2)[-1], full[-1][:, :2], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(full[-1][:, 1], full[-1][:, 0], atol=1e-3)


def test_cpu_dropout_keeps_one_minus_p_scaled_and_follows_the_seed():
    x = torch.ones(1000, 1000)
    torch.manual_seed(0)
    y = dropout(x, 0.1)
    kept = y != 0
    # p rounded to a multiple of 2^-15: 3277 / 32768 = 0.100006; 1e6 draws: the rate's sd is 0.0003.
    assert abs(kept.float().mean().item() - (1 - 3277 / 32768)) < 0.0015
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.9))
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.1), y)  # the global generator decides it, as it decides bernoulli_
    assert not torch.equal(dropout(x, 0.1), y)
    # Both 15-bit halves of a draw are used and independent: neighbours are dropped together only by chance.
    both = (~kept[:, 0::2] & ~kept[:, 1::2]).float().mean().item()
    assert abs(both - 0.1**2) < 0.002
    for p in (0.5, 0.25):
        assert abs((dropout(x, p) != 0).float().mean().item() - (1 - p)) < 0.0015
    assert torch.equal(dropout(x, 0.1, training=False), x) and torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    odd = torch.ones(3, 5, 7, dtype=torch.bfloat16)  # an odd number of elements, bf16 under autocast
    assert dropout(odd, 0.1).shape == odd.shape and dropout(odd, 0.1).dtype == torch.bfloat16


def test_cpu_dropout_mask_is_the_documented_function_of_the_draws():
    """The mask for a generator state is fixed (a seed's results and a resumed run depend on it): element i is
    kept where the low 15 bits of the i-th int16 half of the int32 draws reach round(p * 2^15)."""
    x = torch.randn(5, 7, dtype=torch.bfloat16)  # 35 elements: 18 draws, the last half unused
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    torch.manual_seed(3)
    bits = torch.empty(18, dtype=torch.int32).random_()
    keep = (bits.view(torch.int16)[:35].view(5, 7) & 0x7FFF) >= 3277
    assert keep.any() and not keep.all()
    assert torch.equal(y, torch.where(keep, x * torch.tensor(1 / 0.9, dtype=torch.bfloat16), 0))


def test_cpu_dropout_gradient_is_the_same_mask():
    x = torch.randn(64, 32, requires_grad=True)
    module = Dropout(0.3).train()
    y = module(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() / 0.7)
    assert torch.equal(module.eval()(x), x)


def test_cpu_training_attention_is_sdpa_when_nothing_is_dropped():
    """Training on CPU with attention dropout takes the explicit softmax path (dropout's cheaper mask); with a
    dropout too small to drop anything it must give SDPA's result."""
    torch.manual_seed(0)
    attn = SelfAttention(tiny_model(hidden=8, heads=2)).eval()
    x = torch.randn(2, 5, 8)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, 3:] = False
    bias = torch.randn(1, 2, 5, 5) + pad_bias(mask)
    want = attn(x, bias)
    attn.train()
    attn.dropout_p = 1e-9  # rounds to a threshold of 0: every probability kept, scaled by 1 / (1 - 1e-9)
    torch.testing.assert_close(attn(x, bias), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attn(x, None), attn.eval()(x, None), atol=1e-5, rtol=1e-5)
    attn.train().dropout_p = 0.5  # and it does drop (the check can fail)
    assert not torch.allclose(attn(x, bias), want, atol=1e-3)


def test_same_piece_init_starts_a_token_looking_at_its_other_occurrences_not_itself():
    from electralab.train.diagnostics import attention_inputs, attention_probs

    # the tiny preset's width: at 2 heads of 64 a token's own logit stands well above the random ones
    shape = dict(layers=2, hidden=128, embedding=128, ffn=256, relative_buckets=32, relative_max_distance=128)
    plain, prior = build(tiny_model(**shape)), build(tiny_model(**shape, same_piece_init=4.0))
    first = prior.layers[0].attention.qkv.weight
    assert torch.equal(first[:128], first[128:256])  # one map for queries and keys
    own = prior.relative_bias(3, torch.device("cpu"))[0]
    assert bool((own[:, [0, 1, 2], [0, 1, 2]] == -4.0).all())  # the token itself held back
    # Only layer 1's queries and keys and the bias's distance 0 differ: the same random stream drew the rest.
    moved = ("layers.0.attention.qkv", "relative_bias")
    others = {k: v for k, v in plain.state_dict().items() if not k.startswith(moved)}
    assert all(torch.equal(v, prior.state_dict()[k]) for k, v in others.items())
    # Pairs [CLS] a [SEP] b [SEP] of random pieces, one piece in both (at 3 and 12): the share layer 1 sends from
    # the first to the second, against even attention's 1/16.
    torch.manual_seed(1)
    ids = torch.randint(5, VOCAB, (64, 16))
    ids[:, 0], ids[:, 8], ids[:, 15], ids[:, 12] = 1, 2, 2, ids[:, 3]
    mask = torch.ones_like(ids, dtype=torch.bool)
    share = {}
    for name, encoder in (("plain", plain), ("prior", prior)):
        with attention_inputs(encoder) as calls:
            encoder(ids, mask)
        share[name] = float(attention_probs(*calls[0])[:, :, 3, 12].mean())
    assert share["plain"] < 2 / 16 and share["prior"] > 4 / 16, share
    with pytest.raises(ConfigError, match="same_piece_init=4.0 needs relative_positions"):
        tiny_model(same_piece_init=4.0, relative_positions=False).check("model")
