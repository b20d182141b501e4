"""The pretraining loop: one process, or one rank of a Ray Train / DDP job.

    summary = pretrain(run, shards_dir, out_dir, scratch_dir)

Reads top-down: build the objective, optimizer and schedule; restore the last checkpoint; then per
step accumulate gradients over micro-batches, clip, check the loss is finite, step, log, checkpoint,
and every `guard.every` steps measure held-out diagnostics and stop a collapsed run (diagnostics.py).
At the end the main encoder, the auxiliary (where others need it), the
fraction checkpoints and a summary are written to out_dir in one atomic rename.

With `stop` (a function of the step just taken, asked after every step; one process only) the loop stops after
the step at which it says True, with a checkpoint, and returns {"paused": True, "steps": ...}: the next call
resumes there (the GPU sprint's commands end inside their time limit this way: stop=lambda step: clock() >=
deadline; bench/dead_phase.py's --stop-at at a step: stop=lambda step: step >= n).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from electralab.batch import Batch
from electralab.config import PretrainConfig
from electralab.data.loader import PretrainLoader
from electralab.data.progress import progress_bar
from electralab.data.shards import read_shards_manifest
from electralab.errors import ConfigError, DataError, RepresentationCollapsed, TrainingDiverged
from electralab.export import save_encoder
from electralab.io import atomic_dir, write_json
from electralab.model.encoder import count_parameters, set_dropout
from electralab.objectives import Objective, build_objective
from electralab.objectives.common import set_static
from electralab.runs import ResolvedRun
from electralab.train.checkpoint import Checkpointer, write_meta
from electralab.train.common import (
    autocast,
    cpu_has_native_bf16,
    linear_schedule,
    machine,
    make_adamw,
    resolve_precision,
)
from electralab.train.diagnostics import HeldOut, collapse, guard_active
from electralab.train.perf import count_flops, peak_flops
from electralab.train.track import Tracker


@dataclass(frozen=True)
class Dist:
    """Where this process sits in a data-parallel job (rank 0 of 1 when run in-process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pretrain(
    run: ResolvedRun,
    shards_dir: Path,
    out_dir: Path,
    scratch_dir: Path,
    *,
    vocab_dir: Path | None = None,
    dist: Dist = Dist(),
    show_progress: bool = True,
    stop: Callable[[int], bool] | None = None,
) -> dict[str, Any]:
    if stop is not None and dist.world_size > 1:
        raise ValueError("pretrain: stop is for one process (ranks would stop at different steps)")
    cfg = run.pretrain
    device = choose_device(cfg, dist)
    precision = resolve_precision(cfg.precision, device)  # once: "bf16" where the hardware has it
    accumulation = accumulation_steps(cfg, dist.world_size)
    manifest = read_shards_manifest(shards_dir)  # a DataError naming the file when missing or corrupt
    vocab_size = int(manifest["vocab_size"])
    short_until = short_steps(cfg, int(manifest["seq_len"]), run.name)  # rows cut short before this step
    data_hash, world = manifest.get("config_hash"), dist.world_size
    checkpointer = Checkpointer(scratch_dir, (run.as_params(), data_hash, world), (run.param_defaults(), None, None))

    torch.manual_seed(run.seed)  # identical initial weights on every rank
    objective = build_objective(run.method, run.settings, run.model, run.generators, vocab_size).to(device)
    if cfg.dropout is not None:
        set_dropout(objective, cfg.dropout)  # pretraining only: the export keeps the model's dropout
    model = wrap_ddp(objective, device) if dist.world_size > 1 else objective
    step_kind, step_module = training_step(model, cfg, device)  # the module each micro-batch calls
    optimizer = make_optimizer(objective, cfg)
    schedule = make_schedule(optimizer, cfg)
    loader = PretrainLoader(
        shards_dir,
        "train",
        micro_batch_size=cfg.micro_batch_size,
        seed=run.seed,
        masking=run.settings.masking,
        rank=dist.rank,
        world_size=dist.world_size,
    )

    state = checkpointer.load()
    orphan = checkpointer.recorded_mlflow_run() if state is None else None  # read before the clear below
    if state is None:
        if dist.is_main:
            checkpointer.clear()  # nothing of a different configuration survives
        step, elapsed, last_logged = 0, 0.0, {}
    else:
        objective.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        # Rank 0 saved its loader position; every rank is at the same position of its own part.
        loader.load_state_dict({**state["loader"], "rank": dist.rank})
        step, elapsed, last_logged = state["step"], state["elapsed"], state["last_logged"]
    tracker = (
        Tracker.start(run, resume_id=state and state.get("mlflow_run_id"), orphan_id=orphan) if dist.is_main else None
    )
    if tracker:
        checkpointer.record_mlflow_run(tracker.run_id)
        # provenance (the report's "Where the numbers come from"); load: the 1-minute load average as this
        # attempt starts, since a shared machine's load decides its times
        tracker.tag(
            precision=precision,
            training_step=step_kind,
            cpu_native_bf16=cpu_has_native_bf16(),
            machine=machine(device),
            load_at_start=f"{os.getloadavg()[0]:.1f}",
        )
    heldout = (
        HeldOut.from_shards(shards_dir, run.settings.masking, cfg.guard.batches, cfg.micro_batch_size, run.seed, device)
        if dist.is_main and objective.trains
        else None
    )
    batches = iter(loader)  # infinite; loader.state_dict() always points at the next batch
    if heldout is not None and step == 0:  # the diagnostics at initialisation: the baseline of every curve
        tracker.log({f"heldout_{k}": v for k, v in heldout.measure(objective, precision).items()}, 0)

    tokens_per_step = cfg.batch_size * int(manifest["seq_len"])
    fraction_steps: dict[int, list[float]] = {}  # two fractions of a short run can fall on one step
    for f in cfg.checkpoint_fractions:
        fraction_steps.setdefault(max(1, round(f * cfg.steps)), []).append(f)
    devices = dist.world_size
    peak = peak_flops(device, precision)
    meter = Meter()
    flops_per_step: float | None = state.get("flops_per_step") if state else None
    bar = progress_bar(
        total=cfg.steps,
        initial=step,
        desc=f"pretrain {run.name}",
        unit="step",
        disable=not (show_progress and dist.is_main),
        dynamic_ncols=True,
    )
    window_start, window_steps = time.perf_counter(), 0
    last_saved = time.monotonic()  # checkpoint_minutes counts from here, then from each checkpoint
    divergence = Divergence(device, run.name, checkpointer.state_path)
    # progress (step / steps) as one device tensor updated in place: a compiled step reads it as an input
    # (a Python float would be a constant of its graph), at the same address every step (CUDA graphs).
    progress = torch.zeros((), device=device)
    objective.train()
    try:
        while objective.trains and step < cfg.steps:  # the no-pretraining control takes no step
            seed_step(run.seed, step, dist.rank)
            progress.fill_(step / cfg.steps)
            loss_sum = torch.zeros((), device=device)
            for micro in range(accumulation):
                batch = next(batches).to(device, non_blocking=True)
                if step < short_until:
                    batch = batch.split(cfg.short_seq_len)

                def forward_backward(module=step_module, batch: Batch = batch, last: bool = micro == accumulation - 1):
                    with sync_gradients(model, last), autocast(device, precision):
                        out = module(batch, progress=progress)
                        (out.loss / accumulation).backward()
                    return out

                if flops_per_step is None and step >= short_until:  # the model FLOPs of a full micro-batch, once,
                    out, flops = count_flops(lambda: forward_backward(model))  # counted in an eager step
                    flops_per_step = float(flops) * accumulation * dist.world_size
                else:
                    out = forward_backward()
                loss_sum += out.loss.detach()
                meter.add(out.metrics)
            grad_norm = torch.nn.utils.clip_grad_norm_(objective.parameters(), cfg.clip_norm)
            divergence.record(step + 1, loss_sum / accumulation, grad_norm)  # read where the loop reads the device
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_steps += 1
            meter.add({"loss": loss_sum / accumulation, "grad_norm": grad_norm.detach()})  # on the device
            if "loss" not in last_logged:  # until a window is logged, the bar shows this step's loss and pace
                pace = tokens_per_step * window_steps / (time.perf_counter() - window_start)
                bar.set_postfix(loss=f"{float(loss_sum) / accumulation:.3f}", tok_s=f"{pace:.0f}", refresh=False)
            bar.update(1)

            if step % cfg.log_every == 0 or step == cfg.steps:
                divergence.check()
                seconds = time.perf_counter() - window_start
                elapsed += seconds
                speed = {
                    "tokens_per_s": tokens_per_step * window_steps / seconds,
                    "step_time_s": seconds / window_steps,
                    "lr": schedule.get_last_lr()[0],
                    "wall_hours": elapsed / 3600,
                    "device_hours": elapsed * devices / 3600,
                }
                if flops_per_step and peak:
                    speed["mfu"] = flops_per_step * window_steps / seconds / (peak * devices)
                logged = {**meter.means(), **speed}
                meter.reset()
                if tracker:
                    tracker.log(logged, step)
                bar.set_postfix(loss=f"{logged['loss']:.3f}", tok_s=f"{speed['tokens_per_s']:.0f}")
                last_logged = logged
                window_start, window_steps = time.perf_counter(), 0

            if heldout is not None and (step % cfg.guard.every == 0 or step == cfg.steps):
                divergence.check()
                started = time.perf_counter()
                diagnostics = heldout.measure(objective, precision)
                seconds = time.perf_counter() - started  # in the wall clock, not in the tokens/s of training
                elapsed, window_start = elapsed + seconds, window_start + seconds
                tracker.log({f"heldout_{k}": v for k, v in diagnostics.items()}, step)
                last_logged = {**last_logged, **{f"heldout_{k}": v for k, v in diagnostics.items()}}
                problem = collapse(diagnostics, cfg.guard)
                if problem and guard_active(step, cfg.steps, cfg.warmup_steps, cfg.guard):
                    raise RepresentationCollapsed(
                        f"run {run.name} collapsed at step {step}: {problem}. Its numbers would say nothing; "
                        f"docs/training.md (collapse guard) says what to change"
                    )

            # The fraction first: a resume starts after the checkpoint's step, so a fraction at that step
            # must exist before the checkpoint does (a kill in between would otherwise lose it for good).
            if dist.is_main and step in fraction_steps:
                divergence.check()
                so_far = elapsed + time.perf_counter() - window_start
                for fraction in fraction_steps[step]:
                    save_fraction(checkpointer, objective, fraction, step, so_far, devices)
            pause = stop is not None and step < cfg.steps and stop(step)
            if pause:  # the unlogged window's seconds still count towards the run's hours
                elapsed += time.perf_counter() - window_start
            overdue = cfg.checkpoint_minutes and time.monotonic() - last_saved >= cfg.checkpoint_minutes * 60
            if dist.is_main and (step % cfg.checkpoint_every == 0 or step == cfg.steps or pause or overdue):
                divergence.check()  # never a checkpoint of a diverged model
                if tracker:
                    tracker.flush()  # the steps this checkpoint covers are in the store before it exists
                last_saved = time.monotonic()
                checkpointer.save(
                    {
                        "model": objective.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(),
                        "loader": loader.state_dict(),
                        "step": step,
                        "elapsed": elapsed,
                        "last_logged": last_logged,
                        "flops_per_step": flops_per_step,
                        "mlflow_run_id": tracker.run_id if tracker else None,
                    }
                )
            if pause:
                break
        # Fine-tuning would drop a missing point of the efficiency curves without a word: refuse instead.
        # (The no-pretraining control has no training to take fractions of; a paused run has its later
        # fractions still to come.)
        if (
            dist.is_main
            and objective.trains
            and step >= cfg.steps
            and (missing := checkpointer.missing_fractions(cfg.checkpoint_fractions))
        ):
            raise DataError(
                f"run {run.name}: the fraction checkpoints {', '.join(missing)} are missing from "
                f"{checkpointer.directory / 'fractions'} (a scratch of an earlier version, or edited); "
                f"delete {checkpointer.directory} to train the run again"
            )
    except BaseException as error:
        bar.close()
        if tracker:
            tracker.fail(error)
        raise
    bar.close()
    if objective.trains and step < cfg.steps:  # stopped by `stop`; the checkpoint resumes it
        tracker.pause(step)
        print(
            f"pretrain {run.name}: paused at step {step} of {cfg.steps}; the next call resumes "
            f"from {checkpointer.state_path}"
        )
        return {"paused": True, "steps": step, "wall_hours": elapsed / 3600}

    summary = {
        **last_logged,
        "steps": step,
        "tokens": step * tokens_per_step,
        "flops_per_step": flops_per_step or 0.0,
        "params_main": count_parameters(objective.main_encoder()),
        "params_total": count_parameters(objective),
        "devices": devices,
        "wall_hours": elapsed / 3600,
        "device_hours": elapsed * devices / 3600,
    }
    if dist.is_main:
        summary["mlflow_run_id"] = tracker.run_id  # the report matches the workspace's outputs to their run
        # Outputs, then MLflow; the caller clears the scratch last, after its metrics file: a kill anywhere
        # in between resumes from the final checkpoint and redoes only these steps (docs/training.md).
        try:
            write_outputs(objective, out_dir, checkpointer, summary, vocab_dir)
            tracker.finish(summary, out_dir)
        except BaseException as error:  # a full disk, a stop: not finished, and MLflow says so
            tracker.fail(error)
            raise
        print(
            f"pretrain {run.name}: {step} steps, loss {summary.get('loss', float('nan')):.4f}, "
            f"{summary.get('tokens_per_s', 0.0):.0f} tokens/s, {summary['wall_hours'] * 60:.1f} min -> {out_dir}"
        )
    return summary


# --------------------------------------------------------------------------------------------
# The pieces, in the order the loop uses them
# --------------------------------------------------------------------------------------------


def choose_device(cfg: PretrainConfig, dist: Dist) -> torch.device:
    if not cfg.use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            "pretrain.use_gpu=true but no CUDA device is visible; set "
            "presets.<preset>.pretrain.use_gpu=false to train on the CPU"
        )
    torch.cuda.set_device(dist.local_rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return torch.device("cuda", dist.local_rank)


def accumulation_steps(cfg: PretrainConfig, world_size: int) -> int:
    per_step = cfg.micro_batch_size * world_size
    if cfg.batch_size % per_step:
        raise ConfigError(
            f"pretrain.batch_size={cfg.batch_size} is not a multiple of micro_batch_size="
            f"{cfg.micro_batch_size} x num_workers={world_size}"
        )
    return cfg.batch_size // per_step


def wrap_ddp(objective: Objective, device: torch.device) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(objective, device_ids=[device.index] if device.type == "cuda" else None)


def make_optimizer(objective: Objective, cfg: PretrainConfig) -> torch.optim.AdamW:
    """AdamW with the papers' betas/eps; no weight decay on biases and LayerNorm (BERT)."""
    return make_adamw(objective, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)


def short_steps(cfg: PretrainConfig, seq_len: int, run_name: str) -> int:
    """The number of first steps whose rows are cut to cfg.short_seq_len tokens (0: none)."""
    if not cfg.short_seq_len or not cfg.short_seq_until:
        return 0
    if seq_len % cfg.short_seq_len or cfg.short_seq_len >= seq_len:
        raise ConfigError(
            f"run {run_name}: pretrain.short_seq_len={cfg.short_seq_len} must divide the shards' seq_len "
            f"{seq_len} and be shorter than it"
        )
    return round(cfg.short_seq_until * cfg.steps)


def training_step(model: torch.nn.Module, cfg: PretrainConfig, device: torch.device) -> tuple[str, Callable]:
    """The step pretrain.step asks for ("auto" resolved) and what the loop calls for it: the model itself
    (dynamic; DDP's wrapper with several ranks), or the objective in its static form compiled whole
    (objectives/positions.py; one rank, PretrainConfig.check)."""
    kind = cfg.step
    if kind == "auto":
        kind = "cuda_graphs" if device.type == "cuda" and cfg.num_workers == 1 else "dynamic"
    if kind == "dynamic":
        return kind, model
    set_static(model)
    return kind, torch.compile(model, fullgraph=True, mode="reduce-overhead" if kind == "cuda_graphs" else None)


class Divergence:
    """The first step whose loss or gradient norm was not finite, kept on the device and read only where the loop
    reads the device anyway (a log, a held-out check, a checkpoint): the step itself never waits for the host, and
    no checkpoint or fraction of a diverged model is written."""

    NONE = 2**62

    def __init__(self, device: torch.device, run_name: str, state_path: Path):
        self.run_name, self.state_path = run_name, state_path  # what the error names
        self.step = torch.full((), self.NONE, dtype=torch.long, device=device)
        self.values = torch.zeros(2, device=device)  # loss, grad_norm there

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        values = torch.stack([loss.detach().float(), grad_norm.detach().float()])
        first = ~values.isfinite().all() & (self.step == self.NONE)
        self.step = torch.where(first, step, self.step)
        self.values = torch.where(first, values, self.values)

    def check(self) -> None:
        step = int(self.step)
        if step != self.NONE:
            loss, grad_norm = self.values.tolist()
            raise TrainingDiverged(
                f"run {self.run_name}: loss={loss} grad_norm={grad_norm} at step {step}; the last good checkpoint "
                f"is kept in {self.state_path}"
            )


def make_schedule(optimizer: torch.optim.Optimizer, cfg: PretrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the peak LR, then linear decay to zero at the last step."""
    return linear_schedule(optimizer, cfg.warmup_steps, cfg.steps)


def seed_step(seed: int, step: int, rank: int) -> None:
    """Reseed every RNG from (seed, step, rank): dropout and sampling after a resume repeat exactly."""
    value = int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])
    torch.manual_seed(value)


def sync_gradients(model: torch.nn.Module, last_micro_batch: bool):
    """DDP all-reduces gradients only on the last micro-batch of a step."""
    if hasattr(model, "no_sync") and not last_micro_batch:
        return model.no_sync()
    return contextlib.nullcontext()


class Meter:
    """Running means of scalar tensors (NaN = "no such tokens in this batch" is skipped)."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for k, v in metrics.items():
            v = v.detach().float()
            ok = ~torch.isnan(v)
            self.sums[k] = self.sums.get(k, 0) + torch.where(ok, v, torch.zeros_like(v))
            self.counts[k] = self.counts.get(k, 0) + ok.float()

    def means(self) -> dict[str, float]:
        """Means over the window and, in a data-parallel job, over all ranks (every rank calls this)."""
        names = sorted(self.sums)
        device = next(iter(self.sums.values())).device  # CUDA under NCCL: every metric lives there
        sums = torch.stack([self.sums[k].to(device) for k in names])
        counts = torch.stack([self.counts[k].to(device) for k in names])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            both = torch.cat([sums, counts])
            torch.distributed.all_reduce(both)
            sums, counts = both[: len(names)], both[len(names) :]
        return {k: float(s / c) for k, s, c in zip(names, sums.tolist(), counts.tolist()) if c > 0}

    def reset(self) -> None:
        self.sums.clear()
        self.counts.clear()


def save_fraction(
    checkpointer: Checkpointer, objective: Objective, fraction: float, step: int, elapsed: float, devices: int
) -> None:
    directory = checkpointer.fraction_dir(fraction)
    save_encoder(objective.main_encoder(), directory / "encoder")
    write_meta(
        directory,
        {"fraction": fraction, "step": step, "wall_hours": elapsed / 3600, "device_hours": elapsed * devices / 3600},
    )


def write_outputs(
    objective: Objective, out_dir: Path, checkpointer: Checkpointer, summary: dict, vocab_dir: Path | None
) -> None:
    """models/<run>/: encoder/ (ours; the export stage makes the Hugging Face one from it), auxiliary.pt,
    fractions/<pct>/, summary.json, written in one atomic rename."""
    encoder = objective.main_encoder()
    with atomic_dir(out_dir) as tmp:
        save_encoder(encoder, tmp / "encoder", vocab_dir)
        auxiliary = objective.auxiliary_state()
        if auxiliary is not None:
            torch.save({k: v.detach().cpu() for k, v in auxiliary.items()}, tmp / "auxiliary.pt")
        for fraction in checkpointer.fractions():
            shutil.copytree(fraction, tmp / "fractions" / fraction.name)
        write_json(tmp / "summary.json", summary)
