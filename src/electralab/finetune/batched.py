"""Trials trained together: several seeds and learning rates of one task's grid as one batched model (issue 38).

    histories = run_trials(data, encoder, [HParams(2e-5, 3, 32, 0.06), HParams(3e-5, 3, 32, 0.06)], [1, 2], settings)
    histories[k]   # what run_trial(data, encoder, hps[k], seeds[k], settings) returns, one per trial

A small encoder's trial leaves a GPU mostly idle (docs/scaling.md: about 7 GPU-minutes a run in 8 worker
processes). Here one process trains K trials at once: one model per trial, their weights stacked along a new first
dimension (torch.func.stack_module_state), every step one vmap'ed forward and backward over the trials' own batches
(padded to one shape; padding rows weigh nothing) and one AdamW update of the stacked weights with each trial's own
learning rate and schedule. Each trial is run_trial's: its head initialised under its seed, its batches in its
seed's order, its schedule, AdamW with the same settings, its evaluations on its own weights. With dropout off the
losses and metrics equal run_trial's within float tolerance (tests/test_finetune_batched.py); with dropout each
trial draws its masks in vmap's stream ("different" randomness), not run_trial's, the same distribution.

The trials of one call share the batch size and the epochs (the number of steps); seeds and learning rates and
warm-ups differ. The fine-tuning stage trains packs of its grid this way with `finetune.resources.trials_together`
(finetune/tuning.py).

`finetune.step` (resolve_step): "dynamic" runs the step eagerly, each batch as wide as its longest row. On a GPU that
leaves it idle: vmap's eager dispatch and hundreds of small kernels a step cost more host time than the GPU computes
(docs/findings.md, "Trials together on the GPU": about 1% MFU). "static" pads every batch to one shape (full, as wide
as the task's longest training row) and compiles the forward and backward whole (vmap traced away) and the update
(clipping and AdamW) whole; "cuda_graphs" also replays the forward and backward as CUDA graphs. Padding changes no
result: a [PAD] is masked out of attention and a padding row weighs 0.
"""

from __future__ import annotations

import copy
import math
import time

import numpy as np
import torch
from torch.func import functional_call, stack_module_state, vmap

from electralab import CLS_ID, PAD_ID
from electralab.finetune.data import TaskData
from electralab.finetune.features import train_batches
from electralab.finetune.grid import HParams
from electralab.finetune.model import FinetuneModel
from electralab.finetune.trial import TrialSettings, evaluate
from electralab.model.encoder import Encoder
from electralab.objectives.common import set_static
from electralab.train.common import autocast, resolve_precision, schedule_factor


class StackedAdamW:
    """torch's AdamW (decoupled weight decay, none on biases and LayerNorm: make_adamw) over weights stacked along
    a first dimension of K trials, each with its own learning rate. The step count is a tensor, so that a compiled
    update is one graph for every step."""

    def __init__(self, params: dict[str, torch.Tensor], betas: tuple[float, float], eps: float, weight_decay: float):
        self.params, self.betas, self.eps, self.weight_decay = params, betas, eps, weight_decay
        self.state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
        self.steps = torch.zeros((), device=next(iter(params.values())).device)

    @torch.no_grad()
    def step(self, lrs: torch.Tensor) -> None:
        """One update from the weights' gradients; lrs (K,) this step's learning rate of each trial."""
        self.steps.add_(1)
        b1, b2 = self.betas
        correction1, correction2 = 1 - b1**self.steps, (1 - b2**self.steps).sqrt()
        for name, p in self.params.items():
            lr = lrs.to(p.dtype).view(-1, *[1] * (p.dim() - 1))
            m, v = self.state[name]
            m.lerp_(p.grad, 1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            if p.dim() > 2:  # a matrix of each trial (make_adamw: no decay on biases and norms, ndim < 2)
                p.mul_(1 - lr * self.weight_decay)
            p.sub_(lr / correction1 * m / (v.sqrt() / correction2 + self.eps))


def clip_per_trial(params: dict[str, torch.Tensor], max_norm: float) -> None:
    """clip_grad_norm_ for each trial alone: its gradients' global norm at most max_norm."""
    squares = sum(p.grad.float().pow(2).flatten(1).sum(1) for p in params.values())
    scale = (max_norm / (squares.sqrt() + 1e-6)).clamp(max=1.0)
    for p in params.values():
        p.grad.mul_(scale.to(p.grad.dtype).view(-1, *[1] * (p.dim() - 1)))


def stacked_batch(
    data: TaskData, indices: list[np.ndarray], shape: tuple[int, int] | None = None
) -> tuple[torch.Tensor, ...]:
    """The K trials' batches as (K, B, T) tensors, (B, T) the largest of them or `shape`; a padding row is [CLS]
    alone and weighs 0."""
    batches = [data.train.batch(index) for index in indices]
    rows, width = shape or (max(len(i) for i in indices), max(b[0].shape[1] for b in batches))
    K = len(batches)
    ids = torch.full((K, rows, width), PAD_ID, dtype=torch.long)
    ids[:, :, 0] = CLS_ID
    labels = torch.zeros((K, rows, *batches[0][2].shape[1:]), dtype=batches[0][2].dtype)
    weights = torch.zeros((K, rows))
    for k, (batch_ids, _, batch_labels) in enumerate(batches):
        n, t = batch_ids.shape
        ids[k, :n, :t], labels[k, :n], weights[k, :n] = batch_ids, batch_labels, 1.0
    return ids, ids != PAD_ID, labels, weights


def resolve_step(step: str, device: torch.device) -> str:
    """finetune.step on `device`: "auto" is cuda_graphs on a GPU, else dynamic; CUDA graphs on a CPU are static."""
    if step == "auto":
        return "cuda_graphs" if device.type == "cuda" else "dynamic"
    return "static" if step == "cuda_graphs" and device.type != "cuda" else step


def on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on `device`; to a GPU from pinned memory without waiting, so the host prepares the next step
    while the GPU computes this one."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def run_trials(
    data: TaskData,
    encoder: Encoder,
    hps: list[HParams],
    seeds: list[int],
    settings: TrialSettings,
    device: torch.device = torch.device("cpu"),
) -> list[list[dict]]:
    if len(hps) != len(seeds) or not hps:
        raise ValueError(f"run_trials: {len(hps)} configurations for {len(seeds)} seeds")
    if len({(hp.batch_size, hp.epochs) for hp in hps}) != 1:
        raise ValueError("run_trials: the trials of one call share the batch size and the epochs")
    started = time.perf_counter()
    precision = resolve_precision(settings.precision, device)
    step_kind = resolve_step(settings.step, device)
    models = []
    for seed in seeds:
        torch.manual_seed(seed)  # the head's initialisation, as run_trial
        models.append(FinetuneModel(copy.deepcopy(encoder), data.task).to(device))
    evaluator = copy.deepcopy(models[0])  # each trial's weights are copied in to evaluate them
    for model in models:
        set_static(model)  # the [PAD] mask always built: vmap cannot ask the host whether a batch has [PAD]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    optimizer = StackedAdamW(params, settings.adam_betas, settings.adam_eps, settings.weight_decay)
    rngs = [np.random.default_rng(seed) for seed in seeds]  # each trial's order of batches
    batch_size, epochs = hps[0].batch_size, hps[0].epochs
    total = math.ceil(len(data.train) / batch_size) * epochs
    peaks = torch.tensor([hp.lr for hp in hps], device=device)
    warmups = [round(hp.warmup * total) for hp in hps]
    schedule = torch.tensor([[schedule_factor(s, w, total) for w in warmups] for s in range(total)], device=device)

    def trial_loss(p, b, ids, mask, labels, weights):
        logits = functional_call(base, (p, b), (ids, mask))
        rows = base.loss(logits, labels, reduction="none")
        return (rows * weights).sum() / weights.sum()

    def update(lrs: torch.Tensor) -> None:
        if settings.clip_norm > 0:
            clip_per_trial(params, settings.clip_norm)
        optimizer.step(lrs)

    step_losses = vmap(trial_loss, randomness="different")
    shape = None  # dynamic: each step's batches as they come
    if step_kind != "dynamic":  # one shape for every step, so that each function compiles once, whole
        shape = (batch_size, int(data.train.lengths.max()))
        mode = None
        if step_kind == "cuda_graphs":
            mode = "reduce-overhead"
            for t in (*params.values(), *buffers.values()):
                torch._dynamo.mark_static_address(t)  # the graphs read the weights in place, not a copy a step
        step_losses = torch.compile(step_losses, fullgraph=True, dynamic=False, mode=mode)
        update = torch.compile(update, fullgraph=True, dynamic=False)  # in place on the weights: no CUDA graph
    base.train()  # always: the trials are evaluated on `evaluator`
    histories: list[list[dict]] = [[] for _ in hps]
    step = 0
    for epoch in range(1, epochs + 1):
        losses = []
        orders = [train_batches(data.train.lengths, batch_size, rng, settings.group_by_length) for rng in rngs]
        for indices in zip(*orders):
            ids, mask, labels, weights = (on_device(t, device) for t in stacked_batch(data, list(indices), shape))
            with autocast(device, precision):
                loss = step_losses(params, buffers, ids, mask, labels, weights)  # (K,)
            loss.sum().backward()  # the trials share no weight: each gets its own gradient
            update(peaks * schedule[step])
            for p in params.values():
                p.grad = None
            step += 1
            losses.append(loss.detach().clone())  # a CUDA graph's output is overwritten by its next replay
        train_loss = torch.stack(losses).mean(0).tolist()
        for k, history in enumerate(histories):
            evaluated = {}
            if settings.eval_every_epoch or epoch == epochs:
                evaluator.load_state_dict({name: value[k] for name, value in {**params, **buffers}.items()})
                evaluated = evaluate(evaluator, data, settings, device, precision)
            history.append(
                {
                    "epoch": epoch,
                    "train_loss": train_loss[k],
                    **evaluated,
                    "seconds": time.perf_counter() - started,
                    "threads": torch.get_num_threads(),
                    "trials_together": len(hps),
                }
            )
    return histories


__all__ = ["StackedAdamW", "run_trials"]
