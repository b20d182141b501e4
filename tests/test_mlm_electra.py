"""MLM and ELECTRA against independent computations on tiny tensors: the MLM head math, the mean CE
over masked positions only, the RTD binary cross-entropy with "a sample equal to the original is
original", the ELECTRA total and its weight sharing, masking settings, training and determinism."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from helpers import VOCAB, jitter, make_batch, tiny_generators, tiny_model, train_losses
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from electralab.config import AmosGeneratorSize, GeneratorSize, load_params
from electralab.model.encoder import Encoder, alibi_slopes, count_parameters
from electralab.objectives import build_objective, method_settings
from electralab.objectives.common import sample
from electralab.objectives.electra import Electra
from electralab.objectives.mlm import MLM

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# Hand-written references
# --------------------------------------------------------------------------------------------


def gelu(t):
    return 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))


def layer_norm(x, ln):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def lm_logits(h, head):
    """BERT's MLM head: z = LN(GELU(W h + b)); logits = E z + b_out, E the shared token table."""
    dense, _, ln = head.transform
    z = layer_norm(gelu(h @ dense.weight.T + dense.bias), ln)
    return z @ head.tokens.weight.T + head.bias


def mean_ce(logits, targets):
    """-mean_i log softmax(logits_i)[target_i]."""
    picked = logits.gather(1, targets[:, None])[:, 0]
    return (torch.logsumexp(logits, -1) - picked).mean()


def mean_bce(logits, labels):
    """-mean[y log sigmoid(l) + (1 - y) log(1 - sigmoid(l))]; y = 1 means "replaced"."""
    p = torch.sigmoid(logits.double())
    y = labels.double()
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def electra_rtd_logits(h, head):
    """ELECTRA's released discriminator head: dense -> GELU -> dense(1)."""
    d1, _, d2 = head.net
    return (gelu(h @ d1.weight.T + d1.bias) @ d2.weight.T + d2.bias)[..., 0]


def capture_input(module):
    """Record the first positional argument each call of `module` receives (a forward pre-hook)."""
    seen = []
    module.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    return seen


def build_mlm(**settings):
    return MLM(tiny_model(), tiny_generators(), VOCAB, MLM.Settings(**settings))


def build_electra(**settings):
    return Electra(tiny_model(), tiny_generators(), VOCAB, Electra.Settings(**settings))


# --------------------------------------------------------------------------------------------
# MLM
# --------------------------------------------------------------------------------------------


def test_mlm_loss_is_mean_ce_over_masked_positions_of_the_tied_head():
    torch.manual_seed(0)
    obj = jitter(build_mlm()).eval()
    batch = make_batch(pad_last=5)
    out = obj(batch)
    h = obj.mlm.encoder(batch.masked_ids, batch.attention_mask)[-1]  # (B, T, H)
    logits = lm_logits(h[batch.mlm_mask], obj.mlm.head)
    targets = batch.input_ids[batch.mlm_mask]
    torch.testing.assert_close(out.loss, mean_ce(logits, targets), atol=1e-5, rtol=1e-5)
    # Not a mean over all tokens (the check can fail): the full-sequence CE differs.
    all_logits = lm_logits(h[batch.attention_mask], obj.mlm.head)
    assert not torch.allclose(out.loss, mean_ce(all_logits, batch.input_ids[batch.attention_mask]), atol=1e-4)
    assert out.metrics["mlm_acc"] == (logits.argmax(-1) == targets).float().mean()


def test_mlm_head_uses_the_one_token_parameter():
    obj = build_mlm()
    assert obj.mlm.head.tokens.weight is obj.mlm.encoder.embeddings.tokens.weight is obj.tokens.weight
    table = [p for p in obj.parameters() if p.shape == (VOCAB, 32)]
    assert len(table) == 1


class ShapeLog(TorchDispatchMode):
    """Records the shape of every tensor any aten op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out


@pytest.mark.parametrize("build", [build_mlm, build_electra], ids=["mlm", "electra"])
def test_vocabulary_logits_only_at_masked_positions(build):
    torch.manual_seed(0)
    obj = build()
    batch = make_batch(batch_size=4, length=24)
    M = int(batch.mlm_mask.sum())
    assert M < 4 * 24
    with ShapeLog() as log:
        obj(batch).loss.backward()
    vocab_sized = [s for s in log.shapes if VOCAB in s]
    assert (M, VOCAB) in vocab_sized
    assert max(math.prod(s) for s in vocab_sized) <= M * VOCAB, "a (B, T, V) tensor was built"
    head = obj.mlm.head if isinstance(obj, MLM) else obj.generator.head
    assert head(torch.zeros(M, head.transform[0].in_features)).shape == (M, VOCAB)


# --------------------------------------------------------------------------------------------
# ELECTRA
# --------------------------------------------------------------------------------------------


def test_electra_generator_size_and_shared_embeddings():
    obj = build_electra()
    g, d = obj.generator.encoder, obj.discriminator
    sizes = tiny_generators().electra
    assert len(g.layers) == len(d.layers) == 12  # same depth
    assert (g.cfg.hidden, g.cfg.heads, g.cfg.ffn) == (sizes.hidden, sizes.heads, sizes.ffn)
    assert g.layers[0].ffn_in.weight.shape == (sizes.ffn, sizes.hidden)
    assert g.embeddings.project is not None and g.embeddings.project.weight.shape == (16, 32)
    # One token Parameter: generator input, discriminator input, generator LM head.
    assert g.embeddings.tokens.weight is d.embeddings.tokens.weight is obj.generator.head.tokens.weight
    assert len([p for p in obj.parameters() if p.shape == (VOCAB, 32)]) == 1
    # ELECTRA Sec. 3.2: token AND positional embeddings shared (released code: with their LayerNorm).
    assert g.embeddings.positions is d.embeddings.positions
    assert g.embeddings.norm is d.embeddings.norm
    assert count_parameters(obj) == sum(p.numel() for p in obj.parameters())  # parameters() dedups


def test_electra_preset_generators_are_a_third_or_a_quarter_wide():
    presets = load_params(ROOT / "params.yaml").presets
    for name, ratio in [("base", 3), ("base_pp", 3), ("small", 4)]:
        p = presets[name]
        gen = p.generators.electra
        assert gen.layers is None  # the main model's depth
        assert gen.hidden * ratio == p.model.hidden, name
        assert gen.hidden // gen.heads == 64 and gen.ffn == 4 * gen.hidden, name  # ELECTRA's generator


def test_electra_token_gradient_comes_from_generator_and_discriminator():
    torch.manual_seed(0)
    obj = build_electra().eval()
    batch = make_batch()
    obj.tokens.weight.grad = None
    logits = obj.generator(batch)
    torch.nn.functional.cross_entropy(logits, batch.input_ids[batch.mlm_mask]).backward()
    from_gen = obj.tokens.weight.grad.clone()
    obj.zero_grad(set_to_none=True)
    obj.rtd_head(obj.discriminator(batch.input_ids, batch.attention_mask)[-1]).sum().backward()
    from_disc = obj.tokens.weight.grad.clone()
    assert from_gen.abs().sum() > 0 and from_disc.abs().sum() > 0


def test_electra_loss_is_mlm_plus_50_rtd_with_independent_bce():
    torch.manual_seed(0)
    obj = jitter(build_electra()).eval()  # no dropout: everything but the sampling is fixed
    batch = make_batch(pad_last=6, mask_prob=0.4)
    disc_inputs = capture_input(obj.discriminator)
    out = obj(batch)
    (replaced,) = disc_inputs
    mask, mlm = batch.attention_mask, batch.mlm_mask
    # The corrupted input: originals outside M, generator samples inside M.
    assert torch.equal(replaced[~mlm], batch.input_ids[~mlm])
    # Generator MLM loss, recomputed.
    h_gen = obj.generator.encoder(batch.masked_ids, mask)[-1]
    gen_loss = mean_ce(lm_logits(h_gen[mlm], obj.generator.head), batch.input_ids[mlm])
    # RTD over all real tokens, label "replaced" = (x^R != x^orig); [PAD] excluded.
    h_disc = obj.discriminator(replaced, mask)[-1]
    rtd_logits = electra_rtd_logits(h_disc, obj.rtd_head)
    labels = replaced != batch.input_ids
    assert labels.any() and not labels[~mlm].any()
    rtd_loss = mean_bce(rtd_logits[mask], labels[mask])
    torch.testing.assert_close(out.metrics["gen_loss"].double(), gen_loss.double(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.metrics["rtd_loss"].double(), rtd_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss.double(), gen_loss.double() + 50 * rtd_loss, atol=1e-4, rtol=1e-5)
    # Including [PAD] would change it (the check can fail).
    assert not torch.isclose(mean_bce(rtd_logits.flatten(), labels.flatten()), rtd_loss, atol=1e-5)
    assert out.metrics["replaced_fraction"] == labels[mask].float().mean()


def test_electra_sample_equal_to_original_is_labelled_original():
    torch.manual_seed(0)
    obj = jitter(build_electra()).eval()
    batch = make_batch(mask_prob=0.5)
    mlm = batch.mlm_mask
    originals = torch.tensor([7, 8]).repeat(int(mlm.sum()))[: int(mlm.sum())]
    batch.input_ids[mlm] = originals  # masked originals alternate 7, 8
    with torch.no_grad():
        obj.generator.head.bias[7] = 1e4  # the generator samples 7 with probability ~1
    disc_inputs = capture_input(obj.discriminator)
    out = obj(batch)
    (replaced,) = disc_inputs
    assert torch.equal(replaced[mlm], torch.full_like(originals, 7))
    labels = replaced != batch.input_ids
    assert torch.equal(labels[mlm], originals == 8)  # sampled 7 over an original 7: "original"
    assert out.metrics["replaced_fraction"] == (originals == 8).sum() / batch.num_tokens
    h = obj.discriminator(replaced, batch.attention_mask)[-1]
    want = mean_bce(electra_rtd_logits(h, obj.rtd_head)[batch.attention_mask], labels[batch.attention_mask])
    torch.testing.assert_close(out.metrics["rtd_loss"].double(), want, atol=1e-5, rtol=1e-5)
    assert out.metrics["rtd_acc_original"] >= 0 and out.metrics["rtd_acc_replaced"] >= 0


P = torch.tensor([0.40, 0.30, 0.15, 0.10, 0.05])  # a hand-made generator distribution over ids 5..9


def test_sample_draws_from_the_softmax():
    torch.manual_seed(0)
    logits = P.log().expand(40_000, -1)
    freq = torch.bincount(sample(logits), minlength=5).double() / 40_000
    assert (freq - P.double()).abs().max() < 0.01  # ~4 standard errors


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_electra_replacements_are_sampled_from_the_generator(temperature):
    """With the generator head's LayerNorm zeroed its logits are its output bias alone: set that to
    log p and the replaced tokens at masked positions must have frequencies p, or p^(1/T) normalised at the
    release's sampling temperature T."""
    obj = build_electra(temperature=temperature).eval()
    with torch.no_grad():
        ln = obj.generator.head.transform[2]
        ln.weight.zero_(), ln.bias.zero_()
        obj.generator.head.bias.fill_(-30.0)
        obj.generator.head.bias[5:10] = P.log()
    disc_inputs = capture_input(obj.discriminator)
    batch = make_batch(batch_size=16, mask_prob=0.9, seed=3)
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(20):
            obj(batch)
    drawn = torch.cat([r[batch.mlm_mask] for r in disc_inputs])
    assert len(drawn) > 5000 and drawn.min() >= 5 and drawn.max() <= 9
    freq = torch.bincount(drawn - 5, minlength=5).double() / len(drawn)
    want = P.double() ** (1 / temperature)
    assert (freq - want / want.sum()).abs().max() < 0.025  # ~4 standard errors


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


def test_masking_settings():
    bert = method_settings("mlm", {}).masking
    assert (bert.mask_prob, bert.mask_token_prob, bert.random_token_prob) == (0.15, 0.8, 0.1)  # 80/10/10
    electra = method_settings("electra", {})
    m = electra.masking
    assert (m.mask_prob, m.mask_token_prob, m.random_token_prob) == (0.15, 0.85, 0.0)  # 85/0/15
    assert electra.rtd_weight == 50.0 and electra.rtd_head == "mlp"


def test_settings_errors_name_the_key():
    from electralab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"methods\.electra\.rtd_weight"):
        method_settings("electra", {"rtd_weight": -1})
    with pytest.raises(ConfigError, match=r"methods\.electra\.rtd_head"):
        method_settings("electra", {"rtd_head": "ffn"})
    with pytest.raises(ConfigError, match=r"methods\.mlm.*bogus"):
        method_settings("mlm", {"bogus": 1})


# --------------------------------------------------------------------------------------------
# Training and determinism
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["mlm", "electra"])
def test_a_few_adamw_steps_lower_the_loss_and_same_seed_same_numbers(method):
    batch = make_batch()
    settings = method_settings(method, {})
    build = lambda: build_objective(method, settings, tiny_model(), tiny_generators(), VOCAB)
    first = train_losses(build, batch, steps=6)
    assert all(b < a for a, b in zip(first, first[1:])), first  # every step lowers it
    assert train_losses(build, batch, steps=6) == first  # bit-identical on a fresh build
    assert train_losses(build, batch, steps=6, seed=1) != first  # and the seed matters


@pytest.mark.parametrize("method", ["mlm", "electra", "cocolm", "amos", "teams"])
@pytest.mark.parametrize(
    "model", [{"norm": "pre"}, {"qk_norm": True, "residual_init": "depth_scaled", "relative_init": "alibi"}]
)
def test_every_method_trains_with_the_dead_phase_candidates(method, model):
    # The encoder parameters of bench/dead_phase.py apply to every method alike: main and auxiliary networks
    # are built with them and a few steps lower the loss.
    settings = method_settings(method, {})
    cfg = tiny_model(layers=4, **model)
    sizes = dataclasses.replace(
        tiny_generators(),
        amos=AmosGeneratorSize(layers=3, exits=(1, 2, 3)),
        cocolm=GeneratorSize(layers=2),
        teams=GeneratorSize(layers=2),
    )
    build = lambda: build_objective(method, settings, cfg, sizes, VOCAB)
    losses = train_losses(build, make_batch(), steps=4)
    assert losses[-1] < losses[0], losses
    torch.manual_seed(0)
    objective = build()
    encoders = [m for m in objective.modules() if isinstance(m, Encoder)]
    assert encoders and all(e.cfg.norm == cfg.norm and e.cfg.qk_norm == cfg.qk_norm for e in encoders)
    if cfg.relative_init == "alibi":  # every network's own bias starts at ALiBi's (the generator's heads are its own)
        for e in encoders:
            torch.testing.assert_close(e.relative_bias.bias.weight[1], -torch.tensor(alibi_slopes(e.cfg.heads)))


@pytest.mark.parametrize(
    "method, head, own",
    [
        ("electra", "rtd_head", "mlp"),
        ("teams", "rtd_head", "mlp"),
        ("amos", "rtd_head", "linear"),
        ("cocolm", "copy_head", "linear"),
    ],
)
def test_each_detector_has_its_released_head_unless_the_model_names_one_for_all(method, head, own):
    # ELECTRA's and TEAMS's releases: dense -> GELU -> dense; COCO-LM's and AMOS's: linear (docs/methods.md).
    # model.detector_head gives every method the same one, so the rows of a comparison do not differ in it.
    def kind(**model) -> str:
        objective = build_objective(method, method_settings(method, {}), tiny_model(**model), tiny_generators(), VOCAB)
        net = getattr(objective, head).net
        return "mlp" if isinstance(net, torch.nn.Sequential) and len(net) == 3 else "linear"

    assert kind() == kind(detector_head="method") == own
    assert kind(detector_head="linear") == "linear" and kind(detector_head="mlp") == "mlp"


@pytest.mark.parametrize(
    "method, head, share",
    [
        ("electra", "rtd_head", 0.15 * 0.85),
        ("amos", "rtd_head", 0.15 * 0.9),
        ("teams", "rtd_head", 0.15 * 0.9),
        ("cocolm", "copy_head", 1 - 0.15 * 0.9),
    ],
)
def test_a_base_rate_detector_bias_starts_each_detector_at_its_labels_share(method, head, share):
    # model.detector_bias: "zero" is the papers' init (p = 0.5 for every token); "base_rate" starts the RTD
    # heads at the share of replaced tokens and COCO-LM's copy head at the share of originals.
    def output_bias(bias: str) -> float:
        torch.manual_seed(0)
        objective = build_objective(
            method, method_settings(method, {}), tiny_model(detector_bias=bias), tiny_generators(), VOCAB
        )
        linear = [m for m in getattr(objective, head).net.modules() if isinstance(m, torch.nn.Linear)][-1]
        return float(torch.sigmoid(linear.bias))

    assert output_bias("zero") == 0.5
    assert output_bias("base_rate") == pytest.approx(share, rel=1e-5)
