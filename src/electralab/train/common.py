"""What the pretraining loop and the fine-tuning trials share: the optimiser with the papers'
settings, the linear warm-up / decay schedule, and the precision (bf16 autocast where the hardware has it).

    optimizer = make_adamw(model, lr=5e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    schedule = linear_schedule(optimizer, warmup_steps=10_000, total_steps=125_000)
"""

from __future__ import annotations

import contextlib
import functools
import platform

import torch


def make_adamw(
    module: torch.nn.Module, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> torch.optim.AdamW:
    """AdamW (decoupled weight decay, as fairseq's Adam); no weight decay on biases and LayerNorm (BERT)."""
    decay, no_decay = [], []
    for p in module.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (CUDA, and CPU since torch 2.4): one vectorised pass per tensor where the multi-tensor
    # path makes ten; on CPU the latter is a loop of small ops (8% of a 4 x 128 fine-tuning step, docs/performance.md).
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=True)


def schedule_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """The peak LR's factor at `step`: linear warm-up over `warmup_steps`, then linear decay to zero at
    `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def linear_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the peak LR over `warmup_steps`, then linear decay to zero at `total_steps`."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule_factor(step, warmup_steps, total_steps))


PRECISIONS = ("auto", "fp32", "bf16")


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (x86: AVX512-BF16 or AMX; Arm: the BF16 extension).

    Without it, bf16 matmuls are emulated and far slower than fp32 (~300x measured on one of this
    project's machines); with it, ~4x faster. The machines differ from day to day: detect, never assume."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    try:  # aarch64: the kernel lists "bf16" among the CPU features
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("Features") and " bf16" in line for line in f)
    except OSError:
        return False


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for the provenance of a measurement; the platform's name elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(device: torch.device) -> str:
    """What a run trains on, for its provenance: the GPU's name (and how many), or the CPU's model name."""
    if device.type == "cuda":
        count = torch.cuda.device_count()
        return torch.cuda.get_device_name(device) + (f" x{count}" if count > 1 else "")
    return cpu_model()


def resolve_precision(precision: str, device: torch.device) -> str:
    """ "auto" -> "bf16" on CUDA with bf16 and on CPUs with native bf16, else "fp32"; others as given."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose one of {list(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_native_bf16() else "fp32"


def autocast(device: torch.device, precision: str = "fp32"):
    """bf16 autocast (matmuls and attention in bf16, weights, optimiser state, losses and softmaxes in
    fp32) when `precision` (resolved) is "bf16"; nothing otherwise."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"autocast: precision={precision!r} is not resolved; call resolve_precision first")
    return contextlib.nullcontext()
