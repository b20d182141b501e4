"""What the pretraining loop and the fine-tuning trials share: the optimiser with the papers'
settings, the linear warm-up / decay schedule, and bf16 autocast on CUDA only.

    optimizer = make_adamw(model, lr=5e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    schedule = linear_schedule(optimizer, warmup_steps=10_000, total_steps=125_000)
"""

from __future__ import annotations

import contextlib

import torch


def make_adamw(module: torch.nn.Module, *, lr: float, betas: tuple[float, float], eps: float,
               weight_decay: float) -> torch.optim.AdamW:
    """AdamW (decoupled weight decay, as fairseq's Adam); no weight decay on biases and LayerNorm (BERT)."""
    decay, no_decay = [], []
    for p in module.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.is_cuda for p in decay + no_decay)   # one kernel on CUDA; multi-tensor ops elsewhere
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused,
                             foreach=None if fused else True)


def linear_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the peak LR over `warmup_steps`, then linear decay to zero at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast(device: torch.device):
    """bf16 autocast on CUDA only: on these CPUs bf16 matmuls are ~300x slower than fp32."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
