"""TEAMS (Shen et al. 2021) against independent computations: multi-word selection over the original
plus K generator candidates (Eq. 7-8), RTD (Eq. 4/6), the total of Eq. 9 with lambda = (5, 2), the
candidate sampler, partial layer sharing (Sec. 3.2, Table 4, Fig. 4), attention task heads and
their ablations (Table 3), the exported encoder, settings errors, and training of every row."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import VOCAB, jitter, make_batch, tiny_generators, tiny_model, train_losses

from electralab.config import GeneratorSizes
from electralab.errors import ConfigError
from electralab.model.encoder import TransformerLayer, count_parameters
from electralab.objectives import method_settings
from electralab.objectives.teams import Teams, draw_candidates

pytestmark = pytest.mark.usefixtures("single_thread")


# --------------------------------------------------------------------------------------------
# Hand-written references
# --------------------------------------------------------------------------------------------


def gelu(t):
    return 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))


def layer_norm(x, ln):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def transform(h, head):
    """dense -> GELU -> LayerNorm (the MLM / MWS head's transform to the embedding size)."""
    dense, _, ln = head.transform
    return layer_norm(gelu(h @ dense.weight.T + dense.bias), ln)


def rtd_logits(h, head):
    """The RTD head's logit from its parameters: the release's dense -> GELU -> dense (the default), or Eq. 6's
    sigmoid argument w^T h + b (rtd_head: linear)."""
    net = head.net
    if isinstance(net, torch.nn.Sequential):
        first, _, net = net
        h = gelu(h @ first.weight.T + first.bias)
    return (h @ net.weight.T + net.bias)[..., 0]


def mean_ce(logits, targets):
    picked = logits.gather(1, targets[:, None])[:, 0]
    return (torch.logsumexp(logits, -1) - picked).mean()


def mean_bce(logits, labels):
    p = torch.sigmoid(logits.double())
    y = labels.double()
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def mws_loss(h_mws, candidates, obj, bias=None):
    """Eq. 7-8: -mean_j log( exp(s(x_j)) / sum_{x' in S_j} exp(s(x')) ), the original x_j in column 0
    of S_j, s(x) = e(x)^T z_j (no output bias: Eq. 7 and the authors' released head have none; `bias`
    adds one, to show the check would notice), z_j = the MWS transform of h_MWS at position j."""
    z = transform(h_mws, obj.mws_head)  # (M, E)
    E = obj.tokens.weight
    loss = 0.0
    for j in range(len(z)):
        scores = torch.stack([E[c] @ z[j] + (bias[c] if bias is not None else 0.0) for c in candidates[j].tolist()])
        loss = loss + (torch.log(torch.exp(scores).sum()) - scores[0])
    return loss / len(z)


def build(seed: int = 0, model=None, generators=None, **settings) -> Teams:
    torch.manual_seed(seed)
    return Teams(model or tiny_model(), generators or tiny_generators(), VOCAB, Teams.Settings(**settings))


class Spy:
    """Forward hooks (observation only): the discriminator's input x^R and the ids looked up in the
    shared token table (the last lookup of a forward is the candidate sets)."""

    def __init__(self, obj: Teams):
        self.disc_inputs, self.lookups = [], []
        obj.discriminator.register_forward_pre_hook(lambda m, a: self.disc_inputs.append(a[0].clone()))
        obj.tokens.register_forward_pre_hook(lambda m, a: self.lookups.append(a[0].clone()))


def run(obj: Teams, batch, seed: int = 0):
    spy = Spy(obj)
    torch.manual_seed(seed)
    out = obj(batch)
    return out, spy.disc_inputs[-1], spy.lookups[-1]


# --------------------------------------------------------------------------------------------
# The losses
# --------------------------------------------------------------------------------------------


def test_mws_loss_is_softmax_over_original_and_k_candidates():
    obj = jitter(build()).eval()
    batch = make_batch(pad_last=4, mask_prob=0.3)
    out, replaced, candidates = run(obj, batch)
    mlm = batch.mlm_mask
    targets = batch.input_ids[mlm]
    M, K = len(targets), obj.settings.candidates
    assert K == 5 and candidates.shape == (M, K + 1)
    assert torch.equal(candidates[:, 0], targets)  # the original first
    neg = candidates[:, 1:]
    assert not (neg == targets[:, None]).any()  # never the original
    assert all(len(set(row)) == K for row in neg.tolist())  # K distinct ones
    h_mws = obj.discriminator(replaced, batch.attention_mask)[-1][mlm]  # layer L (Sec. 3.2)
    want = mws_loss(h_mws, candidates, obj)
    torch.testing.assert_close(out.metrics["mws_loss"], want, atol=1e-5, rtol=1e-5)
    # h_MWS from layer L-1, or an output bias, would not match: the check can fail.
    wrong = mws_loss(obj.discriminator(replaced, batch.attention_mask)[-2][mlm], candidates, obj)
    assert not torch.isclose(out.metrics["mws_loss"], wrong, atol=1e-4)
    some_bias = torch.linspace(-1.0, 1.0, obj.tokens.weight.shape[0])
    assert obj.mws_head.bias is None
    assert not torch.isclose(out.metrics["mws_loss"], mws_loss(h_mws, candidates, obj, bias=some_bias), atol=1e-4)


def test_mws_with_every_other_token_as_candidate_is_the_full_softmax():
    """K = V - 1 (sampled): the candidate set is the whole vocabulary whatever the draw, so MWS is
    the full-vocabulary softmax of e(x)^T z (an order- and RNG-free reference)."""
    obj = jitter(build(candidates=VOCAB - 1)).eval()
    batch = make_batch()
    out, replaced, _ = run(obj, batch)
    z = transform(obj.discriminator(replaced, batch.attention_mask)[-1][batch.mlm_mask], obj.mws_head)
    want = mean_ce(z @ obj.tokens.weight.T, batch.input_ids[batch.mlm_mask])
    torch.testing.assert_close(out.metrics["mws_loss"], want, atol=1e-5, rtol=1e-5)


def test_total_is_mlm_plus_5_rtd_plus_2_mws():
    obj = jitter(build()).eval()
    batch = make_batch(pad_last=5, mask_prob=0.4)
    out, replaced, candidates = run(obj, batch)
    d, mask, mlm = obj.discriminator, batch.attention_mask, batch.mlm_mask
    targets = batch.input_ids[mlm]
    # Generator MLM (Eq. 1-2), recomputed from its last layer and the tied head.
    h_gen = obj.generator.encoder(batch.masked_ids, mask)[-1][mlm]
    gen = mean_ce(transform(h_gen, obj.generator.head) @ obj.tokens.weight.T + obj.generator.head.bias, targets)
    # RTD (Eq. 4, 6): the head (the release's MLP) on h_RTD, a separate layer on layer L-1's output.
    hidden = d(replaced, mask)
    bias = d.attention_bias(mask, mask.shape[1], mask.device)
    h_rtd = obj.rtd_layer(hidden[-2], bias)
    logits = rtd_logits(h_rtd, obj.rtd_head)
    labels = replaced != batch.input_ids
    assert torch.equal(replaced[~mlm], batch.input_ids[~mlm]) and labels.any()
    rtd = mean_bce(logits[mask], labels[mask])
    mws = mws_loss(hidden[-1][mlm], candidates, obj)
    torch.testing.assert_close(out.metrics["gen_loss"], gen, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.metrics["rtd_loss"].double(), rtd, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.metrics["mws_loss"], mws, atol=1e-5, rtol=1e-5)
    total = 1 * gen.double() + 5 * rtd + 2 * mws.double()
    torch.testing.assert_close(out.loss.double(), total, atol=1e-4, rtol=1e-5)
    s = obj.settings
    assert (s.mlm_weight, s.rtd_weight, s.mws_weight, s.candidates) == (1.0, 5.0, 2.0, 5)  # App. B, Sec. 4.1


def test_rtd_labels_a_sample_equal_to_the_original_as_original():
    obj = build().eval()
    batch = make_batch(mask_prob=0.5)
    mlm = batch.mlm_mask
    n = int(mlm.sum())
    originals = torch.tensor([7, 8]).repeat(n)[:n]
    batch.input_ids[mlm] = originals
    with torch.no_grad():
        obj.generator.head.bias[7] = 1e4  # the generator samples 7 with probability ~1
    out, replaced, candidates = run(obj, batch)
    assert torch.equal(replaced[mlm], torch.full_like(originals, 7))
    assert out.metrics["replaced_fraction"] == (originals == 8).sum() / batch.num_tokens
    # The candidates still exclude each position's own original (7 where 7 was the original).
    assert not (candidates[:, 1:] == originals[:, None]).any()


# --------------------------------------------------------------------------------------------
# The candidate sampler
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sampled", "hardest"])
@pytest.mark.parametrize("k", [1, 3, 5, 10, 39])
def test_candidates_are_k_distinct_non_original_tokens(how, k):
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(300, 40, generator=g) * 3
    original = torch.randint(0, 40, (300,), generator=g)
    original[:50] = logits[:50].argmax(-1)  # the original is the generator's favourite
    torch.manual_seed(0)
    c = draw_candidates(logits, original, k, how)
    assert c.shape == (300, k)
    assert not (c == original[:, None]).any()
    assert all(len(set(row)) == k for row in c.tolist())


def test_hardest_are_the_top_k_non_original_tokens():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 20, generator=g)
    original = torch.randint(0, 20, (50,), generator=g)
    c = draw_candidates(logits, original, 4, "hardest")
    for row, o, got in zip(logits.tolist(), original.tolist(), c.tolist()):
        ranked = sorted((t for t in range(20) if t != o), key=lambda t: -row[t])
        assert set(got) == set(ranked[:4])


P = torch.tensor([0.30, 0.22, 0.16, 0.12, 0.09, 0.06, 0.03, 0.02])  # a hand-made generator distribution
ORIGINAL = 1  # the original token (not the mode)


def draws(k: int, n: int = 40_000) -> torch.Tensor:
    torch.manual_seed(1234)
    logits = P.log().expand(n, -1).clone()
    return draw_candidates(logits, torch.full((n,), ORIGINAL), k, "sampled")


def test_sampled_k1_frequencies_are_p_renormalised_without_the_original():
    c = draws(1)[:, 0]
    freq = torch.bincount(c, minlength=len(P)).double() / len(c)
    q = P.double().clone()
    q[ORIGINAL] = 0
    q /= q.sum()
    assert freq[ORIGINAL] == 0
    assert (freq - q).abs().max() < 0.01  # ~4 standard errors at n = 40,000


def test_sampled_k2_inclusion_is_sampling_without_replacement():
    """P(t in S) for two draws without replacement from q: q_t + sum_{u != t} q_u q_t / (1 - q_u)."""
    c = draws(2)
    inc = torch.zeros(len(P), dtype=torch.float64)
    for t in range(len(P)):
        inc[t] = (c == t).any(-1).double().mean()
    q = P.double().clone()
    q[ORIGINAL] = 0
    q /= q.sum()
    want = torch.tensor([q[t] + sum(q[u] * q[t] / (1 - q[u]) for u in range(len(P)) if u != t) for t in range(len(P))])
    assert (inc - want).abs().max() < 0.012
    # With replacement (two independent draws) the inclusion would be 1 - (1 - q)^2: distinguishable.
    with_repl = 1 - (1 - q) ** 2
    assert (with_repl - want).abs().max() > 0.03


def test_sampled_inclusion_frequencies_are_ordered_like_p():
    for k in (3, 5):
        c = draws(k, n=20_000)
        inc = [(c == t).any(-1).double().mean().item() for t in range(len(P)) if t != ORIGINAL]
        assert inc == sorted(inc, reverse=True), (k, inc)
        assert inc[-1] > 0  # not the hardest: all reachable
    hardest = draw_candidates(P.log()[None], torch.tensor([ORIGINAL]), 3, "hardest")
    assert set(hardest[0].tolist()) == {0, 2, 3}


def test_replacements_and_candidates_come_from_the_generator():
    """End to end: with the generator head's LayerNorm zeroed its logits are its output bias; set to
    log p over ids 5..12 (original 6 at every masked position), the replacements follow p and the
    K = 1 candidates follow p renormalised without the original."""
    obj = build(candidates=1).eval()
    with torch.no_grad():
        ln = obj.generator.head.transform[2]
        ln.weight.zero_(), ln.bias.zero_()
        obj.generator.head.bias.fill_(-30.0)
        obj.generator.head.bias[5:13] = P.log()
    spy = Spy(obj)
    batch = make_batch(batch_size=16, mask_prob=0.9, seed=3)
    batch.input_ids[batch.mlm_mask] = 5 + ORIGINAL
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(20):
            obj(batch)
    replaced = torch.cat([r[batch.mlm_mask] for r in spy.disc_inputs]) - 5
    cands = torch.cat([c for c in spy.lookups if c.dim() == 2 and c.shape[1] == 2])
    assert (cands[:, 0] == 5 + ORIGINAL).all()
    cands = cands[:, 1] - 5
    n = len(replaced)
    assert n > 5000 and len(cands) == n
    q = P.double().clone()
    q[ORIGINAL] = 0
    q /= q.sum()
    assert (torch.bincount(replaced, minlength=8).double() / n - P.double()).abs().max() < 0.025
    assert (torch.bincount(cands, minlength=8).double() / n - q).abs().max() < 0.025


# --------------------------------------------------------------------------------------------
# Partial layer sharing (Sec. 3.2; Table 4; Fig. 4)
# --------------------------------------------------------------------------------------------


def shared_layers(obj: Teams) -> list[bool]:
    d_ids = {id(p) for p in obj.discriminator.layers.parameters()}
    return [all(id(p) in d_ids for p in layer.parameters()) for layer in obj.generator.encoder.layers]


def test_generator_is_half_deep_and_its_bottom_half_is_the_discriminators():
    obj = build()
    g, d = obj.generator.encoder, obj.discriminator
    assert len(g.layers) == 6 and len(d.layers) == 12
    assert (g.cfg.hidden, g.cfg.heads, g.cfg.ffn) == (d.cfg.hidden, d.cfg.heads, d.cfg.ffn)  # same width
    assert [g.layers[i] is d.layers[i] for i in range(6)] == [True] * 3 + [False] * 3
    assert shared_layers(obj) == [True] * 3 + [False] * 3  # not just the module: the Parameters
    assert obj.tied_layers == 3
    assert g.embeddings is d.embeddings and g.relative_bias is d.relative_bias
    assert g.embeddings.tokens.weight is obj.generator.head.tokens.weight is obj.mws_head.tokens.weight
    # With no preset size the generator is half the discriminator's depth.
    assert len(build(generators=GeneratorSizes()).generator.encoder.layers) == 6
    small = build(model=tiny_model(layers=8), generators=GeneratorSizes())
    assert len(small.generator.encoder.layers) == 4 and shared_layers(small) == [True] * 2 + [False] * 2
    # Shared layers count once.
    own = sum(p.numel() for layer in g.layers[3:] for p in layer.parameters())
    assert (
        count_parameters(obj)
        == count_parameters(d)
        + own
        + count_parameters(obj.generator.head)
        - obj.tokens.weight.numel()
        + count_parameters(obj.rtd_layer)
        + count_parameters(obj.rtd_head)
        + count_parameters(obj.mws_head)
        - obj.tokens.weight.numel()
    )


@pytest.mark.parametrize(
    "settings,depth,shared",
    [
        ({"tied_layers": "all"}, 6, 6),  # Table 4 "Full Tie"
        ({"tied_layers": 6}, 6, 6),
        ({"tied_layers": 0}, 6, 0),  # Table 4 "No Tie"
        ({"generator_layers": 2}, 2, 1),  # Fig. 4: bottom half tied at every depth
        ({"generator_layers": 4}, 4, 2),
        ({"generator_layers": 8}, 8, 4),
        ({"generator_layers": 12}, 12, 6),
        ({"generator_layers": 12, "tied_layers": 12}, 12, 12),
        # large_pp's generator is 12 deep: Full Tie is all 12 there, not base's 6 (params.yaml teams_full_tie).
        ({"generator_layers": 12, "tied_layers": "all"}, 12, 12),
    ],
    ids=["full_tie", "tied_6", "no_tie", "gen2", "gen4", "gen8", "gen12", "gen12_tied_12", "gen12_full_tie"],
)
def test_tie_variants_and_generator_depths(settings, depth, shared):
    obj = build(**settings)
    assert len(obj.generator.encoder.layers) == depth
    assert shared_layers(obj) == [True] * shared + [False] * (depth - shared)
    assert all(obj.generator.encoder.layers[i] is obj.discriminator.layers[i] for i in range(shared))


def test_shared_layers_learn_from_both_generator_and_discriminator():
    obj = build().eval()
    batch = make_batch()
    d, g = obj.discriminator, obj.generator.encoder
    # The generator's MLM alone reaches the shared bottom layers, not the discriminator's others.
    torch.nn.functional.cross_entropy(obj.generator(batch), batch.input_ids[batch.mlm_mask]).backward()
    assert d.layers[0].ffn_in.weight.grad is not None and d.layers[2].ffn_in.weight.grad is not None
    assert d.layers[3].ffn_in.weight.grad is None and d.layers[11].ffn_in.weight.grad is None
    from_gen = d.layers[0].ffn_in.weight.grad.clone()
    # The discriminator alone reaches the same Parameter, not the generator's own layers.
    obj.zero_grad(set_to_none=True)
    obj.discriminator(batch.input_ids, batch.attention_mask)[-1].pow(2).sum().backward()
    assert d.layers[0].ffn_in.weight.grad is not None and g.layers[3].ffn_in.weight.grad is None
    assert not torch.allclose(d.layers[0].ffn_in.weight.grad, from_gen)


# --------------------------------------------------------------------------------------------
# Task heads (Sec. 3.2, Table 3) and the exported encoder
# --------------------------------------------------------------------------------------------


def states(obj: Teams, seed: int = 0):
    batch = make_batch(pad_last=3)
    torch.manual_seed(seed)
    ids = batch.input_ids
    hidden = obj.discriminator(ids, batch.attention_mask)
    bias = obj.discriminator.attention_bias(batch.attention_mask, ids.shape[1], ids.device)
    return batch, hidden, bias, obj.task_states(hidden, batch.attention_mask)


def test_attention_heads_rtd_on_layer_l_minus_1_mws_on_layer_l():
    obj = jitter(build()).eval()
    assert isinstance(obj.rtd_layer, TransformerLayer) and obj.mws_layer is None
    assert all(obj.rtd_layer is not layer for layer in obj.discriminator.layers)
    # the release's head: Dense(gelu) -> Dense(1); Eq. 6 as printed (sigmoid(w^T h)) is rtd_head: linear
    assert [type(m) for m in obj.rtd_head.net] == [torch.nn.Linear, torch.nn.GELU, torch.nn.Linear]
    assert isinstance(build(rtd_head="linear").rtd_head.net, torch.nn.Linear)
    _, hidden, bias, (h_rtd, h_mws) = states(obj)
    torch.testing.assert_close(h_rtd, obj.rtd_layer(hidden[11], bias))
    torch.testing.assert_close(h_mws, hidden[12])
    assert not torch.allclose(h_rtd, obj.rtd_layer(hidden[12], bias), atol=1e-4)  # not layer L


def test_heads_on_top_both_read_layer_l():
    obj = build(heads_on_top=True).eval()
    assert isinstance(obj.mws_layer, TransformerLayer) and obj.mws_layer is not obj.rtd_layer
    _, hidden, bias, (h_rtd, h_mws) = states(obj)
    torch.testing.assert_close(h_rtd, obj.rtd_layer(hidden[12], bias))
    torch.testing.assert_close(h_mws, obj.mws_layer(hidden[12], bias))


def test_ffn_heads_are_per_token_on_layer_l():
    obj = build(task_heads="ffn").eval()
    assert obj.rtd_layer is None and obj.mws_layer is None
    assert isinstance(obj.rtd_head.net, torch.nn.Sequential)  # dense -> GELU -> dense
    _, hidden, _, (h_rtd, h_mws) = states(obj)
    torch.testing.assert_close(h_rtd, hidden[12])
    torch.testing.assert_close(h_mws, hidden[12])
    assert not any(
        isinstance(m, TransformerLayer)
        for n, m in obj.named_modules()
        if not n.startswith(("discriminator", "generator"))
    )


EXPORTS = [
    # (id, settings, expected layers as (source, index) pairs, which task state it must equal)
    ("mws", {}, "d12", "mws"),
    ("rtd", {"export": "rtd"}, "d11+rtd", "rtd"),
    ("top_mws", {"heads_on_top": True}, "d12+mws", "mws"),
    ("top_rtd", {"heads_on_top": True, "export": "rtd"}, "d12+rtd", "rtd"),
    ("ffn", {"task_heads": "ffn"}, "d12", "mws"),
    ("only_mws", {"rtd_weight": 0}, "d12", "mws"),
    ("only_rtd", {"mws_weight": 0, "export": "rtd"}, "d12", "rtd"),
]


@pytest.mark.parametrize("settings,layers,task", [e[1:] for e in EXPORTS], ids=[e[0] for e in EXPORTS])
def test_exported_encoder_is_the_fine_tuned_branch(settings, layers, task):
    obj = jitter(build(**settings)).eval()
    d = obj.discriminator
    want = list(d.layers[:12] if layers.startswith("d12") else d.layers[:11])
    if layers.endswith("+rtd"):
        want.append(obj.rtd_layer)
    if layers.endswith("+mws"):
        want.append(obj.mws_layer)
    enc = obj.main_encoder()
    assert len(enc.layers) == len(want) and all(a is b for a, b in zip(enc.layers, want))
    assert enc.embeddings is d.embeddings and enc.relative_bias is d.relative_bias
    assert {id(p) for p in enc.parameters()} <= {id(p) for p in obj.parameters()}
    batch, _, _, (h_rtd, h_mws) = states(obj)
    torch.testing.assert_close(enc(batch.input_ids, batch.attention_mask)[-1], h_rtd if task == "rtd" else h_mws)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_exported_encoder_output_is_what_the_mws_loss_used(norm):
    for settings in ({}, {"heads_on_top": True}):
        obj = jitter(build(model=tiny_model(norm=norm), **settings)).eval()
        batch = make_batch()
        out, replaced, candidates = run(obj, batch)
        h = obj.main_encoder()(replaced, batch.attention_mask)[-1][batch.mlm_mask]
        torch.testing.assert_close(out.metrics["mws_loss"], mws_loss(h, candidates, obj), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])  # pre-LN: the task layers read the raw stream, as the export
def test_exported_rtd_encoder_output_is_what_the_rtd_loss_used(norm):
    for settings in ({"export": "rtd"}, {"heads_on_top": True, "export": "rtd"}, {"mws_weight": 0, "export": "rtd"}):
        obj = jitter(build(model=tiny_model(norm=norm), **settings)).eval()
        batch = make_batch(pad_last=2)
        out, replaced, _ = run(obj, batch)
        mask = batch.attention_mask
        h = obj.main_encoder()(replaced, mask)[-1]
        want = mean_bce(rtd_logits(h, obj.rtd_head)[mask], (replaced != batch.input_ids)[mask])
        torch.testing.assert_close(out.metrics["rtd_loss"].double(), want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Settings validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values,key",
    [
        ({"candidates": 0}, r"methods\.teams\.candidates"),
        ({"candidate_sampling": "random"}, r"methods\.teams\.candidate_sampling"),
        ({"task_heads": "mlp"}, r"methods\.teams\.task_heads"),
        ({"export": "mlm"}, r"methods\.teams\.export"),
        ({"rtd_weight": -1.0}, r"methods\.teams\.rtd_weight"),
        ({"rtd_weight": 0, "mws_weight": 0}, r"rtd_weight and mws_weight"),
        ({"task_heads": "ffn", "heads_on_top": True}, r"heads_on_top"),
        ({"task_heads": "ffn", "export": "rtd"}, r"export='rtd'"),
        ({"mws_weight": 0}, r"mws_weight=0.*export='rtd'"),
        ({"generator_layers": 4, "tied_layers": 5}, r"methods\.teams\.tied_layers=5"),
        ({"tied_layers": "half"}, r"methods\.teams\.tied_layers: 'half' is none of"),
        ({"candiates": 5}, r"methods\.teams.*'candiates'"),
    ],
)
def test_settings_errors_name_the_key(values, key):
    with pytest.raises(ConfigError, match=key):
        method_settings("teams", values)


def test_build_time_errors_name_the_key():
    with pytest.raises(ConfigError, match="tied_layers=7"):
        build(tied_layers=7)  # the 6-layer preset generator
    with pytest.raises(ConfigError, match="candidates=97"):
        build(candidates=VOCAB)  # only V - 1 non-original tokens


# --------------------------------------------------------------------------------------------
# Every Table 2-4 / Fig. 4-5 row: every Parameter learns, AdamW lowers the loss, same seed same numbers
# --------------------------------------------------------------------------------------------

ROWS = {
    "teams": {},
    "only_mws": {"rtd_weight": 0},  # Table 2
    "only_rtd": {"mws_weight": 0, "export": "rtd"},  # Table 2 (also the electra method)
    "ffn_heads": {"task_heads": "ffn"},  # Table 3
    "heads_on_12th": {"heads_on_top": True},  # Table 3
    "export_rtd": {"export": "rtd"},  # Table 3
    "full_tie": {"tied_layers": "all"},  # Table 4
    "no_tie": {"tied_layers": 0},  # Table 4
    **{f"gen_layers_{n}": {"generator_layers": n} for n in (2, 4, 6, 8, 12)},  # Fig. 4
    "hardest": {"candidate_sampling": "hardest"},  # Fig. 5
    **{f"k_{k}": {"candidates": k} for k in (1, 3, 5, 10, 50)},  # Fig. 5
}


@pytest.mark.parametrize("row", list(ROWS))
def test_every_parameter_gets_a_gradient(row):
    obj = build(**ROWS[row])
    obj(make_batch()).loss.backward()
    missing = [n for n, p in obj.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


@pytest.mark.parametrize("row", list(ROWS))
def test_adamw_lowers_the_loss_and_same_seed_same_numbers(row):
    batch = make_batch()
    make = lambda: Teams(tiny_model(), tiny_generators(), VOCAB, method_settings("teams", ROWS[row]))
    first = train_losses(make, batch, steps=6)
    assert all(b < a for a, b in zip(first, first[1:])), first  # every step lowers it
    assert train_losses(make, batch, steps=6) == first
