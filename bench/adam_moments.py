"""How much Adam's epsilon damps each tensor's update, read from a pretraining checkpoint (no training).

    ELECTRALAB_DATA=../shared/data .venv/bin/python bench/adam_moments.py \
        results/controlled/work/scratch/cocolm-no_scl-s1/state.pt cocolm --set settings.scl=false

Adam's step for one weight is lr * m / (sqrt(v) + eps) (bias-corrected moments). Where sqrt(v) is far above eps the
epsilon does nothing; where it is near or below, the step shrinks by sqrt(v) / (sqrt(v) + eps), so a tensor whose
gradients are tiny (the last layer's queries and keys while its attention is even; docs/findings.md, "The dead phase:
what moves it") learns slower than the learning rate says. For each parameter tensor of the run's objective: the
median sqrt(v), the share of its weights below eps and the mean factor sqrt(v) / (sqrt(v) + eps) over the weights that
have had a gradient (a position row no sequence reaches never gets one; the key bias, which softmax ignores, gets only
rounding); the attention's fused q/k/v weights and biases are split in three. The run is the active preset's `run`
with `--set`s, as in bench/heldout_trace.py (a dead_phase point's `sets`); the checkpoint's weights must fit it. A
`--set pretrain.adam_eps=...` asks what another epsilon would keep of the same moments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def damping(state: dict, eps: float, beta2: float):
    """(median sqrt(v), share below eps, mean sqrt(v) / (sqrt(v) + eps) where v > 0) of one tensor's Adam state."""
    import torch

    root = (state["exp_avg_sq"].float() / (1 - beta2 ** float(state["step"]))).sqrt().flatten()
    seen = root[root > 0]
    factor = (seen / (seen + eps)).mean().item() if seen.numel() else float("nan")
    return torch.median(root).item(), (root < eps).float().mean().item(), factor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path, help="a state.pt the pretraining loop wrote")
    ap.add_argument("run", help="the run of params.yaml it trains (a dead_phase point's method)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as bench/heldout_trace.py")
    args = ap.parse_args()

    import torch
    from heldout_trace import resolve

    from electralab.objectives import build_objective
    from electralab.train.loop import make_optimizer

    state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or not {"model", "optimizer", "step"} <= state.keys():
        sys.exit(f"{args.checkpoint}: not a pretraining checkpoint (no model, optimizer and step)")
    if "tokens.weight" not in state["model"]:
        sys.exit(f"{args.checkpoint}: its model has no tokens.weight, so the vocabulary size is unknown")
    run, _, _ = resolve(args.run, args.set, 8000, 250)  # steps and checks do not change the weights' shapes
    vocab_size = state["model"]["tokens.weight"].shape[0]
    objective = build_objective(run.method, run.settings, run.model, run.generators, vocab_size)
    objective.load_state_dict(state["model"])  # a run that does not fit: torch names the tensors
    optimizer = make_optimizer(objective, run.pretrain)
    optimizer.load_state_dict(state["optimizer"])
    eps, beta2 = run.pretrain.adam_eps, run.pretrain.adam_betas[1]
    print(f"{args.checkpoint} at step {state['step']}: eps {eps:g}, beta2 {beta2:g}")
    print(f"{'tensor':58s} {'median sqrt(v)':>14s} {'below eps':>9s} {'step kept':>9s}")
    for name, p in objective.named_parameters():
        if p not in optimizer.state:
            continue
        st = optimizer.state[p]
        parts = [("", st)]
        if ".qkv." in name:  # fused q, k, v rows (model/encoder.py)
            parts = [(f"[{k}]", {**st, "exp_avg_sq": v}) for k, v in zip("qkv", st["exp_avg_sq"].chunk(3, 0))]
        for tag, part in parts:
            median, below, factor = damping(part, eps, beta2)
            print(f"{name + tag:58s} {median:14.1e} {below:9.2f} {factor:9.2f}")


if __name__ == "__main__":
    main()
