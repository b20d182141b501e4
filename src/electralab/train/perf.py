"""Throughput accounting: model FLOPs of a training step, the device's peak, MFU."""

from __future__ import annotations

import time
from functools import lru_cache

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense bf16 tensor-core peaks (no sparsity) from the vendors' data sheets, in FLOP/s.
CUDA_BF16_PEAK = {
    "H200": 989.4e12,
    "H100": 989.4e12,
    "A100": 312e12,
    "A10G": 70e12,
    "L4": 121e12,
    "L40S": 362e12,
    "V100": 125e12,  # V100 has no bf16: its fp16 tensor-core peak
}


def count_flops(fn) -> tuple[object, int]:
    """Run fn() under a FLOP counter (matmuls and attention, forward and backward); return (result, flops)."""
    counter = FlopCounterMode(display=False)
    with counter:
        result = fn()
    return result, counter.get_total_flops()


@lru_cache(maxsize=None)
def cpu_matmul_peak(size: int = 1024, seconds: float = 0.3, dtype: torch.dtype = torch.float32) -> float:
    """Measured matmul FLOP/s of this CPU in `dtype` (the denominator of CPU MFU: bf16 under bf16 autocast)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    return 2 * size**3 * n / (time.perf_counter() - start)


def peak_flops(device: torch.device, precision: str = "fp32") -> float | None:
    """FLOP/s peak of one device: a known GPU's bf16 peak, or the CPU's matmul peak measured in the
    run's precision (fp32, or bf16 under bf16 autocast)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in CUDA_BF16_PEAK.items() if k in name), None)
    if device.type == "cpu":
        return cpu_matmul_peak(dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    return None
