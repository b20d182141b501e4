"""bench/adam_moments.py reads from Adam's state the share of each update that its epsilon keeps."""

from __future__ import annotations

import sys

import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import adam_moments  # noqa: E402


def test_the_kept_share_is_the_update_adamw_takes_against_the_one_without_epsilon():
    eps, betas = 1e-6, (0.9, 0.98)
    magnitudes = torch.logspace(-9, -3, 1000)  # gradients from far below eps to far above it
    signs = torch.where(torch.arange(1000) % 2 == 0, 1.0, -1.0)
    p = torch.nn.Parameter(torch.zeros(1000))
    p.grad = magnitudes * signs
    optimizer = torch.optim.AdamW([p], lr=1.0, betas=betas, eps=eps, weight_decay=0.0)
    optimizer.step()  # first step: m and v bias-corrected are g and g^2, so the update is g / (|g| + eps)
    median, below, kept = adam_moments.damping(optimizer.state[p], eps, betas[1])
    # Without eps every weight would move by lr exactly (sign(g)): the kept share is the mean step taken.
    assert abs(kept - p.detach().abs().mean().item()) < 1e-4
    assert abs(median - magnitudes.median().item()) / magnitudes.median().item() < 1e-3
    assert abs(below - (magnitudes < eps).float().mean().item()) < 1e-3


def test_weights_that_never_had_a_gradient_are_left_out_of_the_kept_share():
    state = {"exp_avg_sq": torch.tensor([0.0, 0.0, 1e-6, 1e-6]), "step": torch.tensor(1.0)}  # sqrt(v) 1e-3
    median, below, kept = adam_moments.damping(state, 1e-6, 0.0)
    assert below == 0.5 and abs(kept - 1e-3 / (1e-3 + 1e-6)) < 1e-6 and median == 0.0


def test_a_file_that_is_not_a_pretraining_checkpoint_is_named_in_one_line(tmp_path):
    import subprocess

    script = str(ROOT / "bench" / "adam_moments.py")
    for name, content in [
        ("weights.pt", {"tokens.weight": torch.zeros(2, 2)}),
        ("bare.pt", {"model": {}, "optimizer": {}, "step": 0}),
    ]:
        path = tmp_path / name
        torch.save(content, path)
        done = subprocess.run([sys.executable, script, str(path), "electra"], capture_output=True, text=True)
        assert done.returncode == 1 and str(path) in done.stderr and "Traceback" not in done.stderr, done.stderr
