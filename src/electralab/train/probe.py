"""The time of one pretraining step, measured before anything trains: the first ETA of `make repro` and the GPU
sprint's plan.

    python -m electralab.train.probe <run> <shards> [--params params.yaml] [--seconds 5]   # prints JSON

The step is the training loop's own (electralab.train.loop): the run's objective on the real shards
through PretrainLoader, the loop's precision (bf16 autocast where the hardware has it) and step (pretrain.step: on
one GPU the static step replayed as CUDA graphs, its compilation in the warm-up), the micro-batches of one optimizer
step, clipping, AdamW; nothing read back from the device until the clock stops, as the loop. Model FLOPs are
counted once (torch's FLOP counter, as the loop's MFU); MFU is against the device's peak
(electralab.train.perf: the data-sheet dense bf16 peak of a GPU, the measured fp32 peak of a CPU). The loop's
held-out checks, logging and checkpoints are not in it: a few percent of a run (docs/performance.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from electralab.data.loader import PretrainLoader
from electralab.io import read_json
from electralab.model.encoder import set_dropout
from electralab.objectives import build_objective
from electralab.runs import ResolvedRun
from electralab.train.common import autocast, resolve_precision
from electralab.train.loop import Dist, accumulation_steps, choose_device, make_optimizer, seed_step, training_step
from electralab.train.perf import count_flops, peak_flops

WARMUP_STEPS = 3  # the first builds kernels and caches; the first of them also counts the FLOPs


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def probe(run: ResolvedRun, shards_dir: Path, seconds: float, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Step time (the mean over at least `seconds` of steps after a warm-up), tokens/s, FLOPs per step and
    MFU of `run`'s pretraining."""
    cfg = run.pretrain
    device = choose_device(cfg, Dist())
    precision = resolve_precision(cfg.precision, device)
    manifest = read_json(Path(shards_dir) / "manifest.json")
    torch.manual_seed(run.seed)
    objective = build_objective(run.method, run.settings, run.model, run.generators, int(manifest["vocab_size"])).to(
        device
    )
    if cfg.dropout is not None:
        set_dropout(objective, cfg.dropout)
    optimizer = make_optimizer(objective, cfg)
    accumulation = accumulation_steps(cfg, 1)
    batches = iter(
        PretrainLoader(
            shards_dir, "train", micro_batch_size=cfg.micro_batch_size, seed=run.seed, masking=run.settings.masking
        )
    )
    objective.train()
    kind, module = training_step(objective, cfg, device)
    progress = torch.full((), 0.5, device=device)
    flops = 0

    def step(index: int, count: bool = False) -> None:
        nonlocal flops
        seed_step(run.seed, index, 0)
        loss = torch.zeros((), device=device)
        for _ in range(accumulation):
            batch = next(batches).to(device, non_blocking=True)

            def forward_backward(batch=batch, module=module):
                with autocast(device, precision):
                    out = module(batch, progress=progress)
                    (out.loss / accumulation).backward()
                return out

            if count:  # in an eager step, as the loop counts them
                out, f = count_flops(lambda: forward_backward(module=objective))
                flops += f
            else:
                out = forward_backward()
            loss += out.loss.detach()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    began = clock()
    for i in range(WARMUP_STEPS):
        step(i, count=i == 0)
    sync()
    warmup_s = clock() - began
    timed, started = 0, clock()
    while timed < 3 or clock() - started < seconds:
        step(WARMUP_STEPS + timed)
        timed += 1
        if timed % 10 == 0:  # the clock reads the device's time, not how far ahead the host has queued
            sync()
    sync()
    step_s = (clock() - started) / timed
    peak = peak_flops(device, precision)  # as the loop's MFU: bf16 autocast against the bf16 peak
    tokens = cfg.batch_size * int(manifest["seq_len"])
    result = {
        "method": run.method,
        "device": device_name(device),
        "precision": precision,
        "training_step": kind,
        "step_s": step_s,
        "steps_timed": timed,
        "warmup_s": warmup_s,
        "steps": cfg.steps,  # the run's schedule: step_s x steps is its pretraining, less the loop's checks
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "flops_per_step": float(flops),
        "peak_flops": peak,
        "mfu": flops / step_s / peak if peak else None,
    }
    return result  # the model and optimizer go with this frame: the next probe or run has the memory


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from electralab.cli import set_threads
    from electralab.config import load_params
    from electralab.runs import resolve_run

    parser = argparse.ArgumentParser(prog="python -m electralab.train.probe", description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run of params.yaml")
    parser.add_argument("shards", type=Path, help="the shards directory (the shards stage's output)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--seconds", type=float, default=5.0, help="time steps for at least this long (default 5)")
    args = parser.parse_args(argv)
    set_threads()  # as a stage would train: ELECTRALAB_THREADS, else the CPUs this process may use
    print(json.dumps(probe(resolve_run(load_params(args.params), args.run), args.shards, args.seconds)))


if __name__ == "__main__":
    main()
