"""COCO-LM (Meng et al. 2021) against the paper (../shared/papers/coco-lm.md).

Every loss is checked against an independent computation written here from the paper's formulas
(explicit probabilities in float64 and Python loops, never the module's own log-space helpers):

  p_LM(x_i|h_i) = 1(x_i = x_i^MLM) p_copy(1|h_i) + p_copy(0|h_i) softmax(x_i^T h_i)      Sec. 3.3
  L_copy = BCE(p_copy, 1(x^MLM = x^orig)) on all tokens                                  Eq. 2
  L_LM   = -log p_LM(x^orig) on the masked positions, p_copy under stop-gradient          Eq. 2
  L_CLM  = 50 L_copy + L_LM                                                              App. B
  L_SCL  = symmetric InfoNCE on [CLS] of (X^MLM, X^crop), cosine, tau = 1, 2N-2 negatives Eq. 3
  L      = L_MLM(aux) + L_CLM + L_SCL                                                    Eq. 4

The full forward is reconstructed from the module's own intermediate tensors (captured with forward
hooks: X^MLM, X^crop, the main model's last hidden states, the auxiliary's logits), so a wrong mask,
a missing stop-gradient, a wrong negatives count or a projection in the CLM head fails a test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import VOCAB, make_batch, tiny_generators, tiny_model
from torch import nn

from electralab import CLS_ID, MASK_ID, PAD_ID
from electralab.config import GeneratorSize, load_params
from electralab.errors import ConfigError
from electralab.objectives import method_settings
from electralab.objectives.cocolm import CocoLM, Settings, crop, lm_log_prob, lm_predict, scl_loss
from electralab.objectives.common import sample

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: tiny tensors, one thread


# ------------------------------------------------------------------------------------------------
# Builders and independent references
# ------------------------------------------------------------------------------------------------


def shallow_model(**overrides):
    """tiny_model() with 2 main layers: depth does not matter for the formulas."""
    return tiny_model(**{"layers": 2, **overrides})


def shallow_generators():
    return dataclasses.replace(tiny_generators(), cocolm=GeneratorSize(layers=1))


def settings(**values) -> Settings:
    """Checked Settings, exactly as params.yaml values are loaded."""
    return method_settings("cocolm", values)


def build(seed: int = 0, model=None, generators=None, vocab: int = VOCAB, **values) -> CocoLM:
    torch.manual_seed(seed)
    return CocoLM(model or shallow_model(), generators or shallow_generators(), vocab, settings(**values))


@contextlib.contextmanager
def recording(module: nn.Module):
    """Records every forward call of `module`: its mode, inputs and (last) output."""
    calls: list[dict] = []

    def hook(m, args, out):
        last = out[-1] if isinstance(out, list) else out
        calls.append(
            {
                "training": m.training,
                "args": [a.detach().clone() if torch.is_tensor(a) else a for a in args],
                "out": last.detach().clone(),
                "out_graph": last,
            }
        )

    handle = module.register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def softmax64(logits: torch.Tensor) -> torch.Tensor:
    """Explicit probabilities: exp(l) / sum exp(l), in float64 (logits here are small)."""
    e = torch.exp(logits.double())
    return e / e.sum(-1, keepdim=True)


def sigmoid64(z: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-z.double()))


def copy_prob(model: CocoLM, hidden: torch.Tensor) -> torch.Tensor:
    """p_copy(1|h) = sigmoid(w_copy^T h + b) from the head's parameters (not its forward); the MLP head
    (copy_head: mlp) is dense -> GELU -> dense."""
    net, h = model.copy_head.net, hidden.double()
    if isinstance(net, nn.Sequential):
        first, _, net = net
        h = h @ first.weight.detach().double().T + first.bias.detach().double()
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    w, b = net.weight.detach().double(), net.bias.detach().double()
    return sigmoid64(h @ w[0] + b[0])


def clm_vocab_prob(model: CocoLM, hidden: torch.Tensor) -> torch.Tensor:
    """softmax(x^T h + b) with the shared token table and NO projection layer (App. D)."""
    table = model.tokens.weight.detach().double()
    return softmax64(hidden.double() @ table.T + model.clm_head.bias.detach().double())


def scl_reference(s: torch.Tensor, s_pos: torch.Tensor, tau: float) -> dict:
    """Eq. 3 by an explicit loop over the 2N anchors; returns loss, negatives per anchor, mean cosines."""
    views = [v.double() for v in s] + [v.double() for v in s_pos]
    n = len(s)

    def cos(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()))

    losses, counts, pos, neg = [], [], [], []
    for a in range(2 * n):
        p = (a + n) % (2 * n)  # X_k^MLM <-> X_k^crop
        negatives = [j for j in range(2 * n) if j not in (a, p)]
        counts.append(len(negatives))
        numerator = math.exp(cos(views[a], views[p]) / tau)
        denominator = numerator + sum(math.exp(cos(views[a], views[j]) / tau) for j in negatives)
        losses.append(-math.log(numerator / denominator))
        pos.append(cos(views[a], views[p]))
        neg += [cos(views[a], views[j]) for j in negatives]
    return {
        "loss": sum(losses) / len(losses),
        "counts": counts,
        "pos": sum(pos) / len(pos),
        "neg": sum(neg) / len(neg) if neg else float("nan"),
    }


def reference_terms(model: CocoLM, batch, main_calls, aux_logits) -> dict[str, float]:
    """Each term of Eq. 4 from the captured X^MLM, X^crop, hidden states and auxiliary logits."""
    s = model.settings
    orig, real = batch.input_ids, batch.attention_mask
    terms = {}
    if aux_logits is not None:  # L_MLM of the auxiliary (masked positions)
        targets = orig[batch.mlm_mask]
        p = softmax64(aux_logits)[torch.arange(len(targets)), targets]
        terms["aux"] = float(-p.log().mean())
    x_mlm, hidden = main_calls[0]["args"][0], main_calls[0]["out"]
    y = (x_mlm == orig).double()  # 1(x^MLM = x^orig)
    pc = copy_prob(model, hidden)
    if s.copy_loss:  # Eq. 2 on every real token
        bce = -(y * pc.log() + (1 - y) * (1 - pc).log())
        terms["copy"] = float(bce[real].mean())
    if s.lm != "none":
        where = batch.mlm_mask if s.lm == "masked" else real
        pv = clm_vocab_prob(model, hidden)[where].gather(1, orig[where][:, None]).squeeze(1)
        if s.lm_form == "release":  # the released criterion: p_copy(0) x the vocabulary's cross-entropy
            terms["lm"] = float(((1 - pc[where]) * -pv.log()).mean())
        else:
            p_lm = y[where] * pc[where] + (1 - pc[where]) * pv if s.copy_mechanism else pv
            terms["lm"] = float(-p_lm.log().mean())
    if s.scl:
        views = hidden[:, 0], main_calls[1]["out"][:, 0]
        if s.scl_projection:  # the release's SCL head, from its parameters: dense -> GELU -> LayerNorm
            dense, _, norm = model.scl_head
            w, b = dense.weight.detach().double(), dense.bias.detach().double()
            gelu = lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))

            def project(v):
                u = gelu(v.double() @ w.T + b)
                u = (u - u.mean(-1, keepdim=True)) / torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + norm.eps)
                return u * norm.weight.detach().double() + norm.bias.detach().double()

            views = tuple(project(v) for v in views)
        terms["scl"] = scl_reference(*views, s.scl_temperature)["loss"]
    return terms


KEPT = 50  # a token id the auxiliary is made to favour


def keep_some_originals(model: CocoLM, batch, seed: int = 0):
    """Makes the auxiliary sample the original token at about half of the masked positions (a fresh
    auxiliary almost never does): their original becomes KEPT, which the auxiliary's bias favours.
    Without such positions the copy branch of p_LM and 'masked vs replaced' could not be told apart."""
    g = torch.Generator().manual_seed(seed)
    half = batch.mlm_mask & (torch.rand(batch.mlm_mask.shape, generator=g) < 0.5)
    batch.input_ids[half] = KEPT
    with torch.no_grad():
        model.auxiliary.head.bias[KEPT] = 30.0
    return batch


def total(terms: dict[str, float], copy_weight: float = 50.0, scl_weight: float = 1.0) -> float:
    aux, copy, lm, scl = (terms.get(k, 0.0) for k in ("aux", "copy", "lm", "scl"))
    return aux + copy_weight * copy + lm + scl_weight * scl


# ------------------------------------------------------------------------------------------------
# 1. L_LM and the full loss against independent computations
# ------------------------------------------------------------------------------------------------

# Four positions, a vocabulary of 7. Rows 0 and 2: input token == target (copyable); 1 and 3: not.
# Row 3 has large logits (a naive exp in float32 would overflow) and a strongly negative copy logit.
LOGITS = [
    [0.5, -1.0, 2.0, 0.1, 0.0, -0.3, 1.2],
    [1.0, 0.2, -0.5, 0.3, 2.2, -1.1, 0.0],
    [-0.2, 0.4, 0.9, -2.0, 0.6, 0.0, 0.3],
    [90.0, 88.5, 91.0, 87.0, 89.5, 92.0, 90.5],
]
COPY = [1.5, -0.7, 0.3, -40.0]
INPUTS = [3, 5, 2, 6]
TARGETS = [3, 1, 2, 4]


def _p_lm_explicit(row: int, copy: bool) -> float:
    e = [math.exp(v - max(LOGITS[row])) for v in LOGITS[row]]  # shift only to fit in a double
    p_vocab = e[TARGETS[row]] / sum(e)
    if not copy:
        return p_vocab
    p1 = 1.0 / (1.0 + math.exp(-COPY[row]))  # p_copy(1|h)
    return (INPUTS[row] == TARGETS[row]) * p1 + (1.0 - p1) * p_vocab


@pytest.mark.parametrize("copy", [True, False])
def test_lm_log_prob_matches_explicit_probabilities(copy):
    got = lm_log_prob(
        torch.tensor(LOGITS), torch.tensor(COPY) if copy else None, torch.tensor(INPUTS), torch.tensor(TARGETS)
    )
    expected = torch.tensor([math.log(_p_lm_explicit(r, copy)) for r in range(4)], dtype=torch.float64)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    if copy:  # the copy term matters: dropping it changes the copyable rows
        without = torch.tensor([math.log(_p_lm_explicit(r, False)) for r in (0, 2)], dtype=torch.float64)
        assert (got.double()[[0, 2]] - without).abs().min() > 0.1


def test_lm_predict_is_argmax_of_p_lm():
    logits, copy = torch.tensor(LOGITS), torch.tensor(COPY)
    inputs = torch.tensor(INPUTS)
    for use_copy in (True, False):
        pred = lm_predict(logits, copy if use_copy else None, inputs)
        for r in range(4):
            e = [math.exp(v - max(LOGITS[r])) for v in LOGITS[r]]
            p1 = 1 / (1 + math.exp(-COPY[r])) if use_copy else 0.0
            p = [(x == INPUTS[r]) * p1 + (1 - p1) * e[x] / sum(e) for x in range(7)]
            assert int(pred[r]) == max(range(7), key=p.__getitem__)
    # Known answers: a confident copy predicts the input; no copy predicts the softmax's best token.
    assert lm_predict(logits, torch.full((4,), 20.0), inputs).tolist() == INPUTS
    assert lm_predict(logits, None, inputs).tolist() == [2, 4, 2, 5]
    # Close calls: softmax = 0.552 on token 6, 0.0746 elsewhere. p_copy(1) = 0.4: the input wins,
    # 0.4 + 0.6 * 0.0746 = 0.445 > 0.6 * 0.552 = 0.331; p_copy(1) = 0.3: token 6 wins, 0.352 < 0.387.
    close = torch.tensor([[0.0] * 6 + [2.0]] * 2)
    copy_logits = torch.tensor([math.log(0.4 / 0.6), math.log(0.3 / 0.7)])
    assert lm_predict(close, copy_logits, torch.tensor([1, 1])).tolist() == [1, 6]


CLM_VARIANTS = {
    "COCO-LM": {},
    "CLM w/o. Stop-grad": {"stop_gradient": False},
    "CLM w/o. Copy": {"copy_mechanism": False},
    "RTD Only": {"lm": "none", "scl": False},
    "SCL + RTD": {"lm": "none"},
    "All-Token LM Only": {"lm": "all_tokens", "copy_loss": False, "stop_gradient": False, "scl": False},
    "temperature 0.5": {"scl_temperature": 0.5},
    # where the paper and the release differ (docs/methods.md): each form a setting
    "released LM form": {"lm_form": "release"},
    "released LM form w/o. Stop-grad": {"lm_form": "release", "stop_gradient": False},
    "SCL weight 0.1": {"scl_weight": 0.1},
    "released SCL head": {"scl_projection": True},
    "MLP copy head": {"copy_head": "mlp"},
}


@pytest.mark.parametrize("row", list(CLM_VARIANTS))
def test_forward_loss_equals_independent_reconstruction(row):
    model = build(seed=3, **CLM_VARIANTS[row])
    batch = keep_some_originals(model, make_batch(batch_size=4, length=24, pad_last=6, mask_prob=0.3, seed=1))
    with recording(model.main) as main_calls, recording(model.auxiliary) as aux_calls:
        out = model(batch)
    s = model.settings
    assert len(main_calls) == (2 if s.scl else 1)
    aux_train = [c for c in aux_calls if c["training"]]
    assert len(aux_train) == 1  # the loss call, with dropout on
    terms = reference_terms(model, batch, main_calls, aux_train[0]["out"])

    assert out.loss.item() == pytest.approx(total(terms, scl_weight=s.scl_weight), rel=1e-6, abs=2e-5)
    assert float(out.metrics["aux_loss"]) == pytest.approx(terms["aux"], rel=1e-5)
    for name, key in (("copy", "copy_loss"), ("lm", "lm_loss"), ("scl", "scl_loss")):
        assert (name in terms) == (key in out.metrics)
        if name in terms:
            assert float(out.metrics[key]) == pytest.approx(terms[name], rel=1e-5, abs=1e-6)

    x_mlm = main_calls[0]["args"][0]
    assert torch.equal(x_mlm[~batch.mlm_mask], batch.input_ids[~batch.mlm_mask])  # Eq. 1
    assert torch.equal(main_calls[0]["args"][1], batch.attention_mask)


@pytest.mark.parametrize("lm_form", ["printed", "release"])
def test_mask_token_positions_take_l_lm_where_the_auxiliary_saw_mask_only(lm_form):
    """lm_positions='mask_token' (the released criterion): L_LM over the selected positions whose auxiliary input
    was [MASK]; a third of them here hold their own or a random token instead (RoBERTa's 10/10), which the
    default ('selected') counts and this does not."""
    batch = make_batch(batch_size=4, length=24, pad_last=6, mask_prob=0.3, seed=1)
    g = torch.Generator().manual_seed(2)
    other = batch.mlm_mask & (torch.rand(batch.mlm_mask.shape, generator=g) < 1 / 3)
    other[:, 1] = False  # every row keeps a [MASK]
    batch.masked_ids[other] = torch.where(
        torch.rand(batch.input_ids.shape, generator=g) < 0.5, batch.input_ids, torch.randint(5, VOCAB, (1,))
    )[other]
    shown = batch.mlm_mask & (batch.masked_ids == MASK_ID)
    assert 0 < other.sum() and torch.equal(shown, batch.mlm_mask & ~other)
    losses = {}
    for positions in ("selected", "mask_token"):
        model = build(seed=3, lm_form=lm_form, lm_positions=positions)
        keep_some_originals(model, batch)
        with recording(model.main) as main_calls:
            out = model(batch)
        x_mlm, hidden = main_calls[0]["args"][0], main_calls[0]["out"]
        y, pc = (x_mlm == batch.input_ids).double(), copy_prob(model, hidden)
        pv = clm_vocab_prob(model, hidden).gather(2, batch.input_ids[..., None]).squeeze(-1)
        per_token = (1 - pc) * -pv.log() if lm_form == "release" else -(y * pc + (1 - pc) * pv).log()
        where = shown if positions == "mask_token" else batch.mlm_mask
        assert float(out.metrics["lm_loss"]) == pytest.approx(float(per_token[where].mean()), rel=1e-5)
        losses[positions] = float(out.metrics["lm_loss"])
    assert abs(losses["selected"] - losses["mask_token"]) > 1e-3
    with pytest.raises(ConfigError, match=r"lm_positions='mask_token'.*lm='masked'"):
        method_settings("cocolm", {"lm_positions": "mask_token", "lm": "all_tokens"})


def test_copy_loss_covers_real_tokens_and_lm_loss_the_masked_positions():
    """The reconstruction above would also pass by luck if the alternatives gave the same numbers:
    show that including [PAD] in L_copy, or all tokens / only replaced ones in L_LM, would not."""
    model = build(seed=3)
    batch = keep_some_originals(model, make_batch(batch_size=4, length=24, pad_last=6, mask_prob=0.3, seed=1))
    with recording(model.main) as main_calls:
        out = model(batch)
    x_mlm, hidden = main_calls[0]["args"][0], main_calls[0]["out"]
    orig, real, masked = batch.input_ids, batch.attention_mask, batch.mlm_mask
    y = (x_mlm == orig).double()
    pc = copy_prob(model, hidden)
    bce = -(y * pc.log() + (1 - y) * (1 - pc).log())
    pv = clm_vocab_prob(model, hidden).gather(2, orig[..., None]).squeeze(-1)
    nll = -(y * pc + (1 - pc) * pv).log()
    replaced = real & (x_mlm != orig)
    assert (~real).sum() == 6 and 0 < replaced.sum() < masked.sum() < real.sum()

    assert float(out.metrics["copy_loss"]) == pytest.approx(float(bce[real].mean()), rel=1e-5)
    # With [PAD] the mean would differ by far more than the 1e-5 relative tolerance above.
    assert abs(float(bce.mean()) - float(bce[real].mean())) > 1e-4
    assert float(out.metrics["lm_loss"]) == pytest.approx(float(nll[masked].mean()), rel=1e-5)
    for wrong in (real, replaced):
        assert abs(float(nll[wrong].mean()) - float(nll[masked].mean())) > 1e-3

    all_tokens = build(seed=3, lm="all_tokens", copy_loss=False, stop_gradient=False, scl=False)
    keep_some_originals(all_tokens, batch)
    with recording(all_tokens.main) as main_calls:
        out = all_tokens(batch)
    x_mlm, hidden = main_calls[0]["args"][0], main_calls[0]["out"]
    y = (x_mlm == orig).double()
    pc = copy_prob(all_tokens, hidden)
    pv = clm_vocab_prob(all_tokens, hidden).gather(2, orig[..., None]).squeeze(-1)
    nll = -(y * pc + (1 - pc) * pv).log()
    assert float(out.metrics["lm_loss"]) == pytest.approx(float(nll[real].mean()), rel=1e-5)
    assert abs(float(nll.mean()) - float(nll[real].mean())) > 1e-3
    assert "copy_loss" not in out.metrics and "scl_loss" not in out.metrics


# ------------------------------------------------------------------------------------------------
# 2. Stop-gradient
# ------------------------------------------------------------------------------------------------


def _copy_head_grads(model: CocoLM, batch) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    model(batch).loss.backward()
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.copy_head.parameters()]


@pytest.mark.parametrize(
    "row, values, reaches",
    [
        ("CLM, L_LM isolated", {"copy_loss": False, "scl": False}, False),
        ("CLM w/o. Stop-grad, L_LM isolated", {"copy_loss": False, "scl": False, "stop_gradient": False}, True),
        ("All-Token LM Only", {"lm": "all_tokens", "copy_loss": False, "stop_gradient": False, "scl": False}, True),
    ],
)
def test_lm_loss_reaches_copy_head_only_without_stop_gradient(row, values, reaches):
    """Loss = L_MLM(aux) + L_LM here; the auxiliary never touches the copy head."""
    model = build(seed=4, **values)
    batch = make_batch(seed=2)
    grads = _copy_head_grads(model, batch)
    norm = sum(float(g.abs().sum()) for g in grads)
    if reaches:
        assert norm > 1e-6
    else:
        assert norm == 0.0
    # L_LM still trains the main model and the CLM head in every case (the test is not vacuous).
    assert float(model.clm_head.bias.grad.abs().sum()) > 0
    assert float(model.main.layers[-1].ffn_out.weight.grad.abs().sum()) > 0


@pytest.mark.parametrize("stop_gradient", [True, False])
def test_copy_head_gradient_is_exactly_that_of_the_copy_loss(stop_gradient):
    """Full COCO-LM loss: with sg the copy head's gradient equals that of 50 * L_copy alone."""
    model = build(seed=4, stop_gradient=stop_gradient)
    batch = make_batch(pad_last=3, seed=2)
    params = list(model.copy_head.parameters())
    with recording(model.main) as main_calls:
        out = model(batch)
    full = torch.autograd.grad(out.loss, params, retain_graph=True)
    x_mlm, hidden = main_calls[0]["args"][0], main_calls[0]["out_graph"]
    real = batch.attention_mask
    logit = hidden @ params[0][0] + params[1][0]  # independent path through the same weights
    copy_only = 50.0 * F.binary_cross_entropy_with_logits(logit[real], (x_mlm == batch.input_ids)[real].float())
    alone = torch.autograd.grad(copy_only, params)
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-8) for a, b in zip(full, alone))
    assert same is stop_gradient


# ------------------------------------------------------------------------------------------------
# 3. SCL
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_scl_loss_matches_explicit_loop(tau):
    g = torch.Generator().manual_seed(0)
    s, s_pos = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    loss, metrics = scl_loss(s, s_pos, tau)
    ref = scl_reference(s, s_pos, tau)
    assert ref["counts"] == [4] * 6  # 2N - 2 negatives per anchor
    assert float(loss) == pytest.approx(ref["loss"], rel=1e-6)
    assert float(metrics["scl_pos_cos"]) == pytest.approx(ref["pos"], rel=1e-6)
    assert float(metrics["scl_neg_cos"]) == pytest.approx(ref["neg"], rel=1e-6)
    # symmetric contrast: the two views play the same role
    swapped, _ = scl_loss(s_pos, s, tau)
    assert float(swapped) == pytest.approx(float(loss), rel=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_scl_negatives_count_is_2n_minus_2(n):
    """Orthonormal sequences, each identical to its pair: cos+ = 1, every negative cos = 0, so
    L = log(1 + (2N-2)/e) exactly. N-1 negatives (other crops only) or 2N-1 (self included) differ."""
    s = torch.eye(6)[:n]
    loss, metrics = scl_loss(s, s.clone(), 1.0)
    assert float(loss) == pytest.approx(math.log(1 + (2 * n - 2) / math.e), rel=1e-6, abs=1e-7)
    assert float(metrics["scl_pos_cos"]) == pytest.approx(1.0)
    if n == 1:
        assert math.isnan(float(metrics["scl_neg_cos"]))
    else:
        assert float(metrics["scl_neg_cos"]) == pytest.approx(0.0, abs=1e-7)


def test_scl_one_directional_variant_would_differ():
    """Symmetry is not automatic: anchoring only the X^MLM side gives another number."""
    g = torch.Generator().manual_seed(1)
    s, s_pos = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    z = F.normalize(torch.cat([s, s_pos]).double(), dim=-1)
    cos = z @ z.T
    one_way = []
    for a in range(3):  # anchors X^MLM only
        row = torch.cat([cos[a, :a], cos[a, a + 1 :]])
        one_way.append(-(cos[a, a + 3] - torch.log(torch.exp(row).sum())))
    loss, _ = scl_loss(s, s_pos, 1.0)
    assert abs(float(loss) - float(torch.stack(one_way).mean())) > 1e-3
    assert float(loss) == pytest.approx(scl_reference(s, s_pos, 1.0)["loss"], rel=1e-6)


def test_scl_gradient_reaches_both_views():
    """Neither view is a stop-gradient target: d L / d s and d L / d s^+ match Eq. 3 differentiated
    by autograd through an explicit per-anchor loop (only L_MLM(aux) + L_SCL here)."""
    model = build(seed=10, lm="none", copy_loss=False)
    batch = make_batch(seed=7)
    with recording(model.main) as main_calls:
        out = model(batch)
    views = [main_calls[0]["out_graph"], main_calls[1]["out_graph"]]
    got = torch.autograd.grad(out.loss, views)
    leaves = [v.detach().double().requires_grad_() for v in views]
    z = [x[:, 0] / x[:, 0].norm(dim=-1, keepdim=True) for x in leaves]
    z = torch.cat(z)
    n = batch.input_ids.shape[0]
    losses = []
    for a in range(2 * n):
        p = (a + n) % (2 * n)
        others = torch.stack([z[a] @ z[j] for j in range(2 * n) if j != a])
        losses.append(-(z[a] @ z[p] - torch.log(torch.exp(others).sum())))
    expected = torch.autograd.grad(torch.stack(losses).mean(), leaves)
    for g, e in zip(got, expected):
        assert float(g[:, 0].abs().sum()) > 0
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-7)


def test_settings_defaults_follow_the_paper():
    s = Settings()
    assert s.scl_temperature == 1.0  # Sec. 3.3 and App. B
    assert s.copy_weight == 50.0  # lambda_copy, App. B
    assert s.crop_fraction == 0.9  # App. B: 10% crop ratio
    assert s.masking.mask_prob == 0.15 and s.masking.mask_special_tokens  # App. B, App. D (RoBERTa)
    assert (s.lm, s.copy_loss, s.copy_mechanism, s.stop_gradient, s.scl) == ("masked", True, True, True, True)
    assert s.auxiliary == "shallow" and s.sample_without_dropout  # Sec. 3.3, App. D
    # Where the release differs, the paper's printed form: L_LM as Sec. 3.3, SCL on h_[CLS], weight 1 (Eq. 4)
    assert (s.lm_form, s.scl_projection, s.scl_weight, s.copy_head) == ("printed", False, 1.0, "linear")
    params = load_params(ROOT / "params.yaml")
    for preset, layers in (("base", 4), ("base_pp", 4), ("large_pp", 6)):  # Sec. 4
        aux = params.presets[preset].generators.cocolm
        assert aux.layers == layers and aux.hidden is None and aux.heads is None and aux.ffn is None


# ------------------------------------------------------------------------------------------------
# 4. crop
# ------------------------------------------------------------------------------------------------


def _rows(lengths: list[int], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct token ids (so a span can be located), [CLS] first, [PAD] after each row's length."""
    ids = torch.full((len(lengths), T), PAD_ID)
    mask = torch.zeros((len(lengths), T), dtype=torch.bool)
    for r, n in enumerate(lengths):
        ids[r, 0] = CLS_ID
        ids[r, 1:n] = torch.arange(100 * (r + 1), 100 * (r + 1) + n - 1)
        mask[r, :n] = True
    return ids, mask


@pytest.mark.parametrize("fraction", [0.7, 0.8, 0.9, 1.0])
def test_crop_is_cls_plus_contiguous_span_of_the_real_tokens(fraction):
    lengths = [41, 21, 12, 2]  # content (after [CLS]) 40, 20, 11, 1: no .5 ties
    ids, mask = _rows(lengths, 41)
    torch.manual_seed(0)
    for _ in range(20):
        out, out_mask = crop(ids, mask, fraction)
        keeps = [max(round(fraction * (n - 1)), 1) for n in lengths]
        assert out.shape == out_mask.shape == (4, max(keeps) + 1)
        for r, (n, k) in enumerate(zip(lengths, keeps)):
            assert out[r, 0] == CLS_ID and out_mask[r, 0]
            assert out_mask[r].tolist() == [True] * (k + 1) + [False] * (out.shape[1] - k - 1)
            assert (out[r, k + 1 :] == PAD_ID).all()
            span = out[r, 1 : k + 1]
            start = int((ids[r] == span[0]).nonzero())
            assert 1 <= start and start + k <= n  # inside the real tokens after [CLS]
            assert torch.equal(span, ids[r, start : start + k])


def test_crop_fraction_one_is_the_original_sequence():
    ids, mask = _rows([30, 17, 9], 30)
    out, out_mask = crop(ids, mask, 1.0)
    assert torch.equal(out, ids) and torch.equal(out_mask, mask)
    batch = make_batch(pad_last=5)
    out, out_mask = crop(batch.input_ids, batch.attention_mask, 1.0)
    assert torch.equal(out, batch.input_ids) and torch.equal(out_mask, batch.attention_mask)


def test_crop_start_is_random_and_covers_the_valid_range():
    ids, mask = _rows([41, 21], 41)  # 40 content tokens keep 36: starts 1..5; 20 keep 18: 1..3
    torch.manual_seed(0)
    starts = [[], []]
    for _ in range(500):
        out, _ = crop(ids, mask, 0.9)
        for r in range(2):
            starts[r].append(int((ids[r] == out[r, 1]).nonzero()))
    for r, valid in enumerate((range(1, 6), range(1, 4))):
        counts = {v: starts[r].count(v) for v in valid}
        assert set(starts[r]) == set(valid)
        assert min(counts.values()) > 0.6 * 500 / len(valid)  # roughly uniform


# ------------------------------------------------------------------------------------------------
# 5. Sampling in inference mode (App. D)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("without_dropout", [True, False])
def test_replacements_sampled_with_the_auxiliary_in_the_right_mode(without_dropout):
    model = build(
        seed=6,
        model=shallow_model(dropout=0.5, attention_dropout=0.5),
        scl=False,
        sample_without_dropout=without_dropout,
    )
    with torch.no_grad():
        model.tokens.weight.mul_(30)  # peaked auxiliary logits: dropout moves the samples
    batch = make_batch(batch_size=8, length=32, mask_prob=0.5, seed=3)
    model.train()
    with recording(model.auxiliary) as aux_calls, recording(model.main) as main_calls:
        torch.manual_seed(11)
        out = model(batch)
    x_mlm = main_calls[0]["args"][0]
    assert [c["training"] for c in aux_calls] == ([True, False] if without_dropout else [True])
    assert all(m.training for m in model.auxiliary.modules())  # training mode restored

    # The same RNG stream, by hand: the training forward (same dropout draws), then the sample.
    torch.manual_seed(11)
    train_logits = model.auxiliary(batch).detach()
    model.auxiliary.eval()
    with torch.no_grad():
        eval_logits = model.auxiliary(batch)
    model.auxiliary.train()
    assert torch.equal(train_logits, aux_calls[0]["out"])
    assert (train_logits - eval_logits).abs().max() > 1.0  # dropout really was on
    state = torch.get_rng_state()
    from_eval = sample(eval_logits)
    torch.set_rng_state(state)
    from_train = sample(train_logits)
    assert (from_eval != from_train).sum() >= 5  # the two modes are distinguishable
    placed = x_mlm[batch.mlm_mask]
    assert torch.equal(placed, from_eval if without_dropout else from_train)

    # The auxiliary's own MLM loss is always the training-mode (dropout on) one.
    targets = batch.input_ids[batch.mlm_mask]
    ce = lambda logits: float(-softmax64(logits)[torch.arange(len(targets)), targets].log().mean())
    assert float(out.metrics["aux_loss"]) == pytest.approx(ce(train_logits), rel=1e-5)
    assert abs(ce(train_logits) - ce(eval_logits)) > 1e-2


def test_eval_mode_objective_samples_once_in_eval_mode():
    model = build(seed=6, model=shallow_model(dropout=0.5), scl=False)
    model.eval()
    with recording(model.auxiliary) as aux_calls:
        model(make_batch())
    assert [c["training"] for c in aux_calls] == [False]


# ------------------------------------------------------------------------------------------------
# 6. Random replacements
# ------------------------------------------------------------------------------------------------


def test_random_replacements_are_uniform_over_non_special_ids():
    model = build(seed=7, auxiliary="random", scl=False)
    assert model.auxiliary is None and model.auxiliary_state() is None
    assert not any("auxiliary" in name for name, _ in model.named_parameters())
    batch = make_batch(batch_size=16, length=64, mask_prob=0.5, seed=4)
    out = model(batch)
    assert "aux_loss" not in out.metrics
    assert out.loss.item() == pytest.approx(
        50 * float(out.metrics["copy_loss"]) + float(out.metrics["lm_loss"]), rel=1e-6
    )
    torch.manual_seed(8)
    drawn = []
    for _ in range(40):
        x_mlm, aux_loss, _ = model.corrupt(batch, model.masked(batch))
        assert float(aux_loss) == 0.0 and not aux_loss.requires_grad
        assert torch.equal(x_mlm[~batch.mlm_mask], batch.input_ids[~batch.mlm_mask])
        drawn.append(x_mlm[batch.mlm_mask])
    drawn = torch.cat(drawn)
    assert int(drawn.min()) >= 5 and int(drawn.max()) < VOCAB
    counts = torch.bincount(drawn, minlength=VOCAB)[5:].double()
    expected = len(drawn) / (VOCAB - 5)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = VOCAB - 6
    assert len(drawn) > 15_000 and (counts > 0).all()
    assert chi2 < dof + 6 * math.sqrt(2 * dof)  # fixed seed: deterministic, generous


# ------------------------------------------------------------------------------------------------
# 7. Converged auxiliary
# ------------------------------------------------------------------------------------------------


def test_converged_auxiliary_is_loaded_frozen_and_separate(tmp_path):
    donor = build(seed=1)
    path = tmp_path / "aux.pt"
    torch.save(donor.auxiliary_state(), path)
    model = build(seed=2, auxiliary="converged", auxiliary_checkpoint=str(path))
    for name, value in model.auxiliary.state_dict().items():
        assert torch.equal(value, donor.auxiliary_state()[name]), name
    aux = model.auxiliary
    assert all(not p.requires_grad for p in aux.parameters())
    model.train()
    assert not any(m.training for m in aux.modules()) and model.main.training
    model.eval()
    model.train()
    assert not any(m.training for m in aux.modules())
    # Its own frozen token table; the main model's shared one is another Parameter and trains.
    assert aux.encoder.embeddings.tokens is aux.head.tokens
    assert aux.encoder.embeddings.tokens.weight is not model.tokens.weight
    assert model.main.embeddings.tokens is model.tokens and model.clm_head.tokens is model.tokens

    frozen = {k: v.clone() for k, v in aux.state_dict().items()}
    table = model.tokens.weight.detach().clone()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = make_batch(seed=5)
    for _ in range(3):
        with recording(aux) as aux_calls:
            out = model(batch)
        assert [c["training"] for c in aux_calls] == [False]  # sampled in inference mode
        opt.zero_grad()
        out.loss.backward()
        assert all(p.grad is None for p in aux.parameters())
        assert model.tokens.weight.grad is not None and float(model.tokens.weight.grad.abs().sum()) > 0
        opt.step()
    assert all(torch.equal(v, frozen[k]) for k, v in aux.state_dict().items())
    assert not torch.equal(model.tokens.weight, table)
    assert "aux_loss" not in out.metrics


def test_converged_auxiliary_checkpoint_errors_name_the_path(tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(ConfigError, match="missing.pt"):
        build(auxiliary="converged", auxiliary_checkpoint=str(missing))
    wrong_vocab = tmp_path / "wrong_vocab.pt"
    torch.save(build(vocab=VOCAB + 3).auxiliary_state(), wrong_vocab)
    with pytest.raises(ConfigError, match="wrong_vocab.pt"):
        build(auxiliary="converged", auxiliary_checkpoint=str(wrong_vocab))
    wrong_depth = tmp_path / "wrong_depth.pt"
    deeper = dataclasses.replace(tiny_generators(), cocolm=GeneratorSize(layers=2))
    torch.save(build(generators=deeper).auxiliary_state(), wrong_depth)
    with pytest.raises(ConfigError, match="wrong_depth.pt"):
        build(auxiliary="converged", auxiliary_checkpoint=str(wrong_depth))


# ------------------------------------------------------------------------------------------------
# 8. Shared embeddings and heads (App. B, App. D)
# ------------------------------------------------------------------------------------------------


def test_token_embeddings_are_one_shared_parameter():
    torch.manual_seed(0)
    model = CocoLM(tiny_model(), tiny_generators(), VOCAB, Settings())
    table = model.tokens.weight
    for module in (
        model.auxiliary.encoder.embeddings.tokens,
        model.auxiliary.head.tokens,
        model.main.embeddings.tokens,
        model.clm_head.tokens,
    ):
        assert module.weight is table
    assert sum(p.shape == table.shape for p in model.parameters()) == 1
    # Both networks' losses train it.
    batch = make_batch()
    model(batch).loss.backward()
    assert float(table.grad.abs().sum()) > 0
    model.zero_grad()
    model.auxiliary(batch).sum().backward()
    assert float(table.grad.abs().sum()) > 0


@pytest.mark.parametrize("share", ["all", "tokens"])
def test_the_auxiliary_shares_the_embedding_module_as_released_or_the_token_table_alone(share):
    torch.manual_seed(0)
    model = CocoLM(tiny_model(), tiny_generators(), VOCAB, Settings(share_embeddings=share))
    mine, main = model.auxiliary.encoder.embeddings, model.main.embeddings
    assert mine.tokens is main.tokens
    assert (mine.positions is main.positions and mine.norm is main.norm) == (share == "all")
    if share == "all":  # the main model's loss and the auxiliary's both train the shared positions
        batch = make_batch()
        model.auxiliary(batch).sum().backward()
        assert float(main.positions.weight.grad.abs().sum()) > 0
    own = sum(p.numel() for p in (*mine.positions.parameters(), *mine.norm.parameters()))
    separate = sum(
        p.numel()
        for p in CocoLM(tiny_model(), tiny_generators(), VOCAB, Settings(share_embeddings="tokens")).parameters()
    )
    assert sum(p.numel() for p in model.parameters()) == separate - (own if share == "all" else 0)


def test_auxiliary_head_has_projection_and_clm_head_does_not():
    torch.manual_seed(0)
    model = CocoLM(tiny_model(), tiny_generators(), VOCAB, Settings())
    assert model.clm_head.transform is None
    transform = model.auxiliary.head.transform
    assert [type(m) for m in transform] == [nn.Linear, nn.GELU, nn.LayerNorm]
    h = torch.randn(3, 32)
    expected = h @ model.tokens.weight.T + model.clm_head.bias
    torch.testing.assert_close(model.clm_head(h), expected)
    assert isinstance(model.copy_head.net, nn.Linear) and model.copy_head.net.out_features == 1
    # A factorised table (embedding != hidden) keeps only the unavoidable linear map.
    factorised = CocoLM(tiny_model(embedding=16), tiny_generators(), VOCAB, Settings())
    assert isinstance(factorised.clm_head.transform, nn.Linear)


# ------------------------------------------------------------------------------------------------
# 9. Architecture ablations and diagnostics (Fig. 7a, Fig. 8)
# ------------------------------------------------------------------------------------------------


def test_auxiliary_sizes_shallow_and_electra():
    torch.manual_seed(0)
    main_cfg, gens = tiny_model(), tiny_generators()
    shallow = CocoLM(main_cfg, gens, VOCAB, Settings())
    assert len(shallow.auxiliary.encoder.layers) == 4 and shallow.auxiliary.encoder.cfg.hidden == 32
    assert len(shallow.main.layers) == 12 and shallow.auxiliary.encoder.embeddings.project is None
    electra = CocoLM(main_cfg, gens, VOCAB, settings(auxiliary="electra"))
    cfg = electra.auxiliary.encoder.cfg
    assert len(electra.auxiliary.encoder.layers) == 12
    assert (cfg.hidden, cfg.heads, cfg.ffn) == (16, 1, 32)  # tiny_generators().electra
    assert electra.auxiliary.encoder.embeddings.project.in_features == 32  # shared 32-d table
    assert electra.auxiliary.head.transform[0].in_features == 16
    assert electra.auxiliary.head.tokens is electra.tokens


def test_without_relative_positions_has_no_relative_bias():
    with_rel = build()
    assert with_rel.main.relative_bias is not None
    model = build(model=shallow_model(relative_positions=False))
    assert model.main.relative_bias is None and model.auxiliary.encoder.relative_bias is None
    assert not any("relative_bias" in name for name, _ in model.named_parameters())
    assert model.main.embeddings.positions is not None
    model(make_batch()).loss.backward()


def test_diagnostics_match_independent_computation():
    model = build(seed=9, scl=False)
    batch = make_batch(batch_size=4, length=24, pad_last=5, mask_prob=0.5, seed=6)
    with recording(model.main) as main_calls:
        out = model(batch)
    x_mlm, hidden = main_calls[0]["args"][0], main_calls[0]["out"]
    orig, real = batch.input_ids, batch.attention_mask
    original = (x_mlm == orig) & real
    replaced = (x_mlm != orig) & real
    assert replaced.sum() >= 10
    copy_says_original = copy_prob(model, hidden) > 0.5
    m = out.metrics
    assert float(m["replaced_fraction"]) == pytest.approx(float(replaced.sum() / real.sum()))
    assert float(m["copy_acc_replaced"]) == pytest.approx(float((~copy_says_original)[replaced].double().mean()))
    assert float(m["copy_acc_original"]) == pytest.approx(float(copy_says_original[original].double().mean()))
    # argmax of the full p_LM vector on replaced tokens
    pc = copy_prob(model, hidden)[replaced]
    p = (1 - pc)[:, None] * clm_vocab_prob(model, hidden)[replaced]
    p[torch.arange(len(pc)), x_mlm[replaced]] += pc
    assert float(m["clm_acc_replaced"]) == pytest.approx(float((p.argmax(-1) == orig[replaced]).double().mean()))


@pytest.mark.parametrize(
    "copy_bias, expected",
    [
        (+50.0, {"copy_acc_replaced": 0.0, "copy_acc_original": 1.0, "clm_acc_replaced": 0.0, "clm_acc_original": 1.0}),
        (-50.0, {"copy_acc_replaced": 1.0, "copy_acc_original": 0.0, "clm_acc_replaced": 0.0, "clm_acc_original": 0.0}),
    ],
)
def test_diagnostics_known_answers(copy_bias, expected):
    """p_copy ~ 1: the CLM copies its input (right on original tokens, wrong on replaced ones).
    p_copy ~ 0 and a softmax that always says [MASK] (never an original token): all CLM answers wrong."""
    model = build(seed=9, scl=False)
    with torch.no_grad():
        model.copy_head.net.bias.fill_(copy_bias)
        model.clm_head.bias[MASK_ID] = 1e3
    out = model(make_batch(batch_size=4, length=24, pad_last=5, mask_prob=0.5, seed=6))
    for key, value in expected.items():
        assert float(out.metrics[key]) == value, key


def test_scl_diagnostics_in_forward():
    model = build(seed=10)
    batch = make_batch(seed=7)
    with recording(model.main) as main_calls:
        out = model(batch)
    ref = scl_reference(main_calls[0]["out"][:, 0], main_calls[1]["out"][:, 0], 1.0)
    assert float(out.metrics["scl_pos_cos"]) == pytest.approx(ref["pos"], rel=1e-5)
    assert float(out.metrics["scl_neg_cos"]) == pytest.approx(ref["neg"], rel=1e-5)
    # The second view is X^crop of X^orig (not of X^MLM)
    x_crop, crop_mask = main_calls[1]["args"]
    assert x_crop[0, 0] == CLS_ID and int(crop_mask[0].sum()) == 1 + round(0.9 * 23)
    k = int(crop_mask[0].sum()) - 1
    row = batch.input_ids[0].tolist()
    span = x_crop[0, 1 : k + 1].tolist()
    assert any(row[i : i + k] == span for i in range(1, 24 - k + 1))


# ------------------------------------------------------------------------------------------------
# 10. Every Table 3 row and Figure 4 crop fraction trains and is reproducible
# ------------------------------------------------------------------------------------------------

ROWS = {
    "COCO-LM": ({}, {}),
    "RTD Only": ({"lm": "none", "scl": False}, {}),
    "CLM Only": ({"scl": False}, {}),
    "SCL + RTD": ({"lm": "none"}, {}),
    "w/o Rel-Pos": ({}, {"relative_positions": False}),
    "w. ELECTRA's Auxiliary": ({"auxiliary": "electra"}, {}),
    "w. Random Replacements": ({"auxiliary": "random"}, {}),
    "w. Converged Auxiliary": ({"auxiliary": "converged"}, {}),
    "All-Token LM Only": ({"lm": "all_tokens", "copy_loss": False, "stop_gradient": False, "scl": False}, {}),
    "CLM w/o. Copy": ({"copy_mechanism": False}, {}),
    "CLM w/o. Stop-grad": ({"stop_gradient": False}, {}),
    **{f"Fig. 4 crop {f:.0%}": ({"crop_fraction": f}, {}) for f in (0.7, 0.8, 0.9, 1.0)},
}


@pytest.fixture(scope="module")
def converged_checkpoint(tmp_path_factory) -> str:
    """A separately pretrained auxiliary: another CocoLM trained a few steps, its auxiliary saved."""
    donor = build(seed=123)
    opt = torch.optim.AdamW(donor.parameters(), lr=1e-3)
    batch = make_batch(seed=9)
    for _ in range(3):
        opt.zero_grad()
        donor(batch).loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("converged") / "auxiliary.pt"
    torch.save(donor.auxiliary_state(), path)
    return str(path)


def _train(values: dict, encoder: dict, steps: int = 6) -> tuple[float, float, list[float]]:
    model = build(seed=0, model=shallow_model(**encoder), **values)
    batch = make_batch(batch_size=4, length=24, pad_last=4, seed=8)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)

    def fixed_seed_loss() -> float:  # same dropout, samples and crops before and after
        torch.manual_seed(1234)
        with torch.no_grad():
            return float(model(batch).loss)

    before = fixed_seed_loss()
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        out = model(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    return before, fixed_seed_loss(), losses


@pytest.mark.parametrize("row", list(ROWS))
def test_every_ablation_lowers_its_loss_and_is_reproducible(row, converged_checkpoint):
    values, encoder = ROWS[row]
    if values.get("auxiliary") == "converged":
        values = {**values, "auxiliary_checkpoint": converged_checkpoint}
    before, after, losses = _train(values, encoder)
    assert all(math.isfinite(v) for v in losses)
    assert after < before - 0.01 * abs(before), (row, before, after)
    again = _train(values, encoder)
    assert again == (before, after, losses)  # same seed, same numbers


# ------------------------------------------------------------------------------------------------
# 11. Settings validation
# ------------------------------------------------------------------------------------------------


def test_settings_validation_names_the_key():
    with pytest.raises(ConfigError, match=r"methods\.cocolm\.auxiliary_checkpoint"):
        method_settings("cocolm", {"auxiliary": "converged"})
    with pytest.raises(ConfigError, match=r"lm='none'.*copy_loss.*scl"):
        method_settings("cocolm", {"lm": "none", "copy_loss": False, "scl": False})
    with pytest.raises(ConfigError, match=r"crop_fraction"):
        method_settings("cocolm", {"crop_fraction": 0.0})
    with pytest.raises(ConfigError, match=r"scl_temperature"):
        method_settings("cocolm", {"scl_temperature": 0.0})
    with pytest.raises(ConfigError, match=r"'auxiliary'|auxiliary"):
        method_settings("cocolm", {"auxiliary": "deep"})
    with pytest.raises(ConfigError, match=r"unknown key 'temperature'"):
        method_settings("cocolm", {"temperature": 1.0})
    with pytest.raises(ConfigError, match=r"scl_weight=0"):
        method_settings("cocolm", {"lm": "none", "copy_loss": False, "scl_weight": 0.0})
    with pytest.raises(ConfigError, match=r"methods\.cocolm\.lm_form='release'.*copy_mechanism"):
        method_settings("cocolm", {"lm_form": "release", "copy_mechanism": False})
    # Valid neighbours pass: SCL alone, or the binary task alone, still train the main model.
    method_settings("cocolm", {"lm": "none", "copy_loss": False})
    method_settings("cocolm", {"lm": "none", "scl": False})
