"""One trial: fine-tune the pretrained encoder with one configuration and seed, evaluate on the dev
split(s) after every epoch.

    history = run_trial(data, encoder, HParams(lr=2e-5, epochs=3, batch_size=32, warmup=0.06), seed=1,
                        settings=TrialSettings.of(cfg))
    history[-1]   # {"epoch": 3, "train_loss": ..., "accuracy": 84.1, "accuracy_mm": 84.5, "seconds": ...}

Reads top-down: seed, model, optimiser (COCO-LM Table 7: AdamW (0.9, 0.98), eps 1e-6, weight decay
0.01, linear warm-up over `warmup` of the steps then linear decay, no clipping), then per epoch one pass
over length-grouped, dynamically padded batches and an evaluation (after the last epoch only with
eval_every_epoch false). The trial's result is its last evaluation ("max epochs" is a grid dimension);
earlier ones are logged for the curve.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from electralab.config import FinetuneConfig, SquadSettings
from electralab.finetune.data import TaskData
from electralab.finetune.features import Encoded, eval_batches, train_batches
from electralab.finetune.grid import HParams
from electralab.finetune.metrics import glue_metrics, squad_metrics
from electralab.finetune.model import FinetuneModel
from electralab.finetune.squad import SquadWindows, decode
from electralab.model.encoder import Encoder
from electralab.train.common import autocast, linear_schedule, make_adamw, resolve_precision


@dataclass(frozen=True)
class TrialSettings:
    """The values of presets.<p>.finetune that every trial shares (small: shipped to every worker)."""

    adam_betas: tuple[float, float]
    adam_eps: float
    weight_decay: float
    clip_norm: float
    eval_batch_size: int
    eval_every_epoch: bool
    group_by_length: bool
    squad: SquadSettings
    precision: str = "auto"  # resolved on the trial's own device (a Ray worker may have a GPU)
    step: str = "auto"  # of trials trained together (finetune/batched.py); resolved on their device too

    @classmethod
    def of(cls, cfg: FinetuneConfig) -> "TrialSettings":
        return cls(
            cfg.adam_betas,
            cfg.adam_eps,
            cfg.weight_decay,
            cfg.clip_norm,
            cfg.eval_batch_size,
            cfg.eval_every_epoch,
            cfg.group_by_length,
            cfg.squad,
            cfg.precision,
            cfg.step,
        )


def run_trial(
    data: TaskData,
    encoder: Encoder,
    hp: HParams,
    seed: int,
    settings: TrialSettings,
    device: torch.device = torch.device("cpu"),
    report: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    started = time.perf_counter()
    torch.manual_seed(seed)  # the head's initialisation and dropout
    rng = np.random.default_rng(seed)  # the order of the training batches
    model = FinetuneModel(encoder, data.task).to(device)
    precision = resolve_precision(settings.precision, device)
    optimizer = make_adamw(
        model, lr=hp.lr, betas=settings.adam_betas, eps=settings.adam_eps, weight_decay=settings.weight_decay
    )
    steps_per_epoch = math.ceil(len(data.train) / hp.batch_size)
    total = steps_per_epoch * hp.epochs
    schedule = linear_schedule(optimizer, round(hp.warmup * total), total)

    history: list[dict] = []
    for epoch in range(1, hp.epochs + 1):
        model.train()
        losses = []
        for index in train_batches(data.train.lengths, hp.batch_size, rng, settings.group_by_length):
            input_ids, attention_mask, labels = (t.to(device) for t in data.train.batch(index))
            with autocast(device, precision):
                loss = model.loss(model(input_ids, attention_mask), labels)
            loss.backward()
            if settings.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        # A diverged configuration is a result too (its dev metrics show it): the grid goes on.
        evaluated = (
            evaluate(model, data, settings, device, precision)
            if settings.eval_every_epoch or epoch == hp.epochs
            else {}
        )
        history.append(
            {
                "epoch": epoch,
                "train_loss": float(torch.stack(losses).mean()),
                **evaluated,
                "seconds": time.perf_counter() - started,
                "threads": torch.get_num_threads(),
            }
        )
        if report is not None:
            report(history)
    return history


@torch.no_grad()
def predict(
    model: FinetuneModel, encoded: Encoded, batch_size: int, device: torch.device, precision: str = "fp32"
) -> list[np.ndarray]:
    """The model's outputs for every row of `encoded`, in row order (batches sorted by length)."""
    model.eval()
    out: list[np.ndarray] = [None] * len(encoded)  # type: ignore[list-item]
    for index in eval_batches(encoded.lengths, batch_size):
        input_ids, attention_mask, _ = encoded.batch(index)
        with autocast(device, precision):
            logits = model(input_ids.to(device), attention_mask.to(device)).float().cpu().numpy()
        for row, i in enumerate(index):
            out[i] = logits[row, : encoded.lengths[i]] if model.kind == "span" else logits[row]
    return out


def evaluate(
    model: FinetuneModel, data: TaskData, settings: TrialSettings, device: torch.device, precision: str = "fp32"
) -> dict[str, float]:
    """The task's metrics on every evaluation split (MNLI: matched, then mismatched as *_mm)."""
    metrics: dict[str, float] = {}
    for split, evaluation in data.evals:
        if isinstance(evaluation, SquadWindows):
            logits = predict(model, evaluation.encoded, settings.eval_batch_size, device, precision)
            answers = decode(evaluation, [x[:, 0] for x in logits], [x[:, 1] for x in logits], settings.squad)
            scores = squad_metrics(dict(zip(evaluation.qids, evaluation.answers)), answers)
            diverged = not all(np.isfinite(x).all() for x in logits)
        else:
            outputs = np.stack(predict(model, evaluation, settings.eval_batch_size, device, precision))
            predictions = outputs if data.task.kind == "regression" else outputs.argmax(axis=-1)
            scores = glue_metrics(data.task.name, predictions, evaluation.labels, split.suffix)
            diverged = not np.isfinite(outputs).all()
        # A diverged model's argmax, ranks or empty answers would still give numbers (NaN sorts as the
        # largest value): none of its metrics is one, so selection never picks it and the report says so.
        metrics.update({k: math.nan for k in scores} if diverged else scores)
    return metrics


__all__ = ["TrialSettings", "evaluate", "predict", "run_trial"]
