"""The static training step (issue 38): fixed shapes, no host synchronisation, one graph for torch.compile.

Each method's step, at the shapes of the tiny and small presets and in every pretraining run's settings, must
(1) give the dynamic step's loss and gradients on the same batch, and (2) compile with fullgraph=True, which
fails on any graph break. The static step draws its samples for B x P rows where the dynamic one draws for the
M masked ones, so the two cannot share a random draw: the equality tests fix the draws (the generator's most
likely token, no Gumbel noise, one token for uniform replacements), the compile tests keep them.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import torch

from electralab import CLS_ID, PAD_ID, SEP_ID
from electralab.batch import Batch
from electralab.config import load_params
from electralab.data.masking import mask_tokens
from electralab.model.encoder import Encoder, set_dropout
from electralab.objectives import build_objective
from electralab.objectives.common import set_static
from electralab.objectives.positions import Positions, predictions_per_row
from electralab.runs import resolve_run
from electralab.train.loop import training_step

ROOT = Path(__file__).resolve().parents[1]
PARAMS = load_params(ROOT / "params.yaml")
METHODS = ("mlm", "electra", "cocolm", "amos", "teams")
# The pretraining runs beside each method's main row: settings that take other paths through an objective (those
# that read another run's output, a converged auxiliary or fixed mixture weights, take their base's path).
ABLATIONS = [
    name
    for name, run in PARAMS.runs.items()
    if run["method"] in METHODS and name not in METHODS and run["reads"] == "data/shards"
]
RANDOM_PER_ROW = {"amos_random_layer"}  # a random exit per masked row: the two steps cannot share the draw


def path(run_name: str) -> tuple:
    """What decides a run's path through its objective: its switches (a number counts as zero or not)."""

    def switch(value):
        if value is None or isinstance(value, (bool, str)):
            return value
        return value == 0 if isinstance(value, (int, float)) else type(value).__name__

    run = resolve_run(PARAMS, run_name)
    fields = {**dataclasses.asdict(run.model), **dataclasses.asdict(run.settings)}
    return (run.method, *sorted((k, switch(v)) for k, v in fields.items() if k != "masking"))


# One ablation run for each path (crop fractions, generator depths, candidate counts and exits trace alike).
ONE_PER_PATH = sorted({path(name): name for name in reversed(ABLATIONS)}.values())


def objective_of(run_name: str, preset: str = "tiny", **model):
    params = dataclasses.replace(PARAMS, preset=preset)
    run = resolve_run(params, run_name)
    torch.manual_seed(0)
    cfg = dataclasses.replace(run.model, **model)
    objective = build_objective(run.method, run.settings, cfg, run.generators, params.active.vocab.size)
    set_dropout(objective, 0.0)  # the same function of the weights in both steps
    return objective.train(), run, params.active.vocab.size


def batch_for(run, vocab: int, rows: int = 3, length: int = 128, seed: int = 0) -> Batch:
    """Rows masked as the loader masks them; the first ends in [PAD] (a short final block)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, length), generator=g)
    ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
    attention = torch.ones_like(ids, dtype=torch.bool)
    ids[0, length // 2 :] = PAD_ID
    ids[0, length // 2 - 1] = SEP_ID
    attention[0, length // 2 :] = False
    masked, mlm = mask_tokens(ids, attention, run.settings.masking, vocab, g)
    return Batch(ids, attention, masked, mlm)


@pytest.fixture
def fixed_draws(monkeypatch):
    for name in ("electra", "cocolm", "amos", "teams"):
        module = importlib.import_module(f"electralab.objectives.{name}")
        if hasattr(module, "sample"):
            monkeypatch.setattr(module, "sample", lambda logits, temperature=1.0: logits.argmax(-1))
        if hasattr(module, "gumbel_noise"):
            monkeypatch.setattr(module, "gumbel_noise", lambda like: torch.zeros_like(like, dtype=torch.float32))
        if hasattr(module, "random_tokens"):  # one token for every replacement
            monkeypatch.setattr(
                module, "random_tokens", lambda count, vocab, device: torch.full((count,), 7, device=device)
            )


def step(objective, batch: Batch, static: bool):
    set_static(objective, static)
    objective.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the crop's and the random draws' numbers, alike in both steps
    out = objective(batch, progress=0.5)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in objective.named_parameters() if p.grad is not None}
    return out, grads


def assert_same_step(objective, batch: Batch) -> None:
    (dynamic, dynamic_grads), (static, static_grads) = (step(objective, batch, s) for s in (False, True))
    torch.testing.assert_close(static.loss, dynamic.loss, rtol=1e-5, atol=1e-6)
    assert static.metrics.keys() == dynamic.metrics.keys()
    for name, value in dynamic.metrics.items():
        torch.testing.assert_close(static.metrics[name], value, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)
    assert static_grads.keys() == dynamic_grads.keys()
    for name, grad in dynamic_grads.items():
        torch.testing.assert_close(static_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("method", METHODS)
def test_the_static_step_gives_the_dynamic_steps_loss_and_gradients(method, preset, fixed_draws):
    objective, run, vocab = objective_of(method, preset)
    assert_same_step(objective, batch_for(run, vocab))


@pytest.mark.parametrize("run_name", sorted(set(ABLATIONS) - RANDOM_PER_ROW))
def test_every_ablations_static_step_gives_the_dynamic_steps(run_name, fixed_draws):
    objective, run, vocab = objective_of(run_name)
    assert_same_step(objective, batch_for(run, vocab, length=64))


@pytest.mark.compile
@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("method", METHODS)
def test_the_static_step_compiles_as_one_graph(method, preset):
    """fullgraph=True raises at the first graph break, found in tracing, the same for every backend (none here
    generates code); at the tiny shape aot_eager traces the backward too."""
    torch._dynamo.reset()
    objective, run, vocab = objective_of(method, preset)
    set_static(objective)
    backend = "aot_eager" if preset == "tiny" else "eager"
    compiled = torch.compile(objective, fullgraph=True, backend=backend)
    out = compiled(batch_for(run, vocab, rows=2), progress=torch.tensor(0.5))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None for p in objective.parameters() if p.requires_grad)


@pytest.mark.compile
@pytest.mark.parametrize("run_name", ONE_PER_PATH)
def test_every_ablations_static_step_compiles_as_one_graph(run_name):
    torch._dynamo.reset()
    objective, run, vocab = objective_of(run_name)
    set_static(objective)
    out = torch.compile(objective, fullgraph=True, backend="eager")(batch_for(run, vocab, rows=2, length=64))
    assert torch.isfinite(out.loss)


@pytest.mark.compile
def test_the_loops_static_step_compiles_once(monkeypatch):
    """The loop's compiled step (train/loop.py, training_step) compiles once: the relative-position buckets, once
    cached on the module while torch.compile traced, changed the step's guards, and the first two steps compiled
    twice (model/encoder.py, RelativePositionBias.buckets)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    objective, run, vocab = objective_of("electra")
    assert all(e.relative_bias is not None for e in objective.modules() if isinstance(e, Encoder))
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, fullgraph=True, backend="eager"))
    kind, step = training_step(objective, dataclasses.replace(run.pretrain, step="static"), torch.device("cpu"))
    for seed in range(3):
        assert torch.isfinite(
            step(batch_for(run, vocab, rows=2, length=64, seed=seed), progress=torch.tensor(0.5)).loss
        )
    assert kind == "static" and torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_the_static_positions_refuse_a_row_with_more_targets_than_their_bound():
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[1, :5] = True
    with pytest.raises(ValueError, match="selects 5 positions, more than per_row=3"):
        Positions(mask, per_row=3)


def test_the_bound_is_the_most_the_masking_selects():
    """data/masking.py selects exactly round(p * n) of a row's n <= T eligible positions, at least one."""
    objective, run, vocab = objective_of("mlm")
    for length in (3, 7, 64, 128):
        batch = batch_for(run, vocab, rows=4, length=length)
        per_row = predictions_per_row(run.settings.masking, batch.mlm_mask.shape[1])
        assert int(batch.mlm_mask.sum(1).max()) == per_row
