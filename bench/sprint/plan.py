"""The plan: the same GPU-seconds of pretraining for every method, in whole pieces.

A unit is one method's pretraining (P seconds, the same for all) and its fine-tuning (F seconds, measured
on the control, which fine-tunes the same model size on the same data and grid). A unit never spans two
commands by design: its checkpoint (model and optimiser, about 180 MB at the small preset) and its
encoder are too large to come back through $OUT, so they exist only on the machine that made them, and
the next command usually runs on a fresh one. Each unit's steps are P / its measured step time.

    P = pretrain_seconds(capacities=[what is left of this command, then each later one], units=3, fixed=F + m)
"""

from __future__ import annotations

import math

MARGIN = 0.05  # of a command's budget, kept free for estimates that were low
START_SECONDS = 90.0  # a fresh machine's start: 36 s to 2 minutes seen (the device tool's README; 27 Nov 2026)
TRANSFER_SECONDS = 20.0  # each command's working tree and carry out, its files back, its Python start


def device_seconds(pieces: int, piece_seconds: float, grace_seconds: float) -> float:
    """The device time a sprint plans: one machine's start, then its commands one after another while it is still
    warm (the device tool keeps it 30 s after a call: restore the state and run the next at once)."""
    return START_SECONDS + pieces * (piece_seconds + grace_seconds + TRANSFER_SECONDS)


def fits(capacities: list[float], units: int, unit_seconds: float) -> bool:
    """Whether `units` whole units of `unit_seconds` each fit into pieces of these capacities."""
    if unit_seconds <= 0:
        return True
    return sum(math.floor(c / unit_seconds) for c in capacities if c > 0) >= units


def pretrain_seconds(capacities: list[float], units: int, fixed: float) -> float:
    """The largest P (to 0.1 s) such that `units` units of P + `fixed` seconds fit whole; 0 if none does."""
    if not fits(capacities, units, fixed + 0.1):
        return 0.0
    lo, hi = 0.1, max(capacities)
    while hi - lo > 0.1:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(capacities, units, fixed + mid) else (lo, mid)
    return round(lo, 1)


def make_plan(
    probes: dict[str, dict],
    methods: tuple[str, ...],
    finetune_s: float,
    unit_overhead_s: float,
    left_now: float,
    later_pieces: int,
    piece_capacity: float,
    forced: float | None,
    piece_now: int = 1,
) -> dict:
    """Steps per method for equal GPU-seconds, and the command each unit is expected to run in (this one
    is number `piece_now`, with `left_now` seconds left; `later_pieces` more of `piece_capacity` each)."""
    fixed = finetune_s + unit_overhead_s
    capacities = [left_now] + [piece_capacity] * later_pieces
    seconds = forced if forced is not None else pretrain_seconds(capacities, len(methods), fixed)
    notes = []
    if seconds <= 0:
        seconds = max(1.0, 0.1 * piece_capacity)
        notes.append(
            f"the commands planned do not hold {len(methods)} units of {fixed:.0f} s (fine-tuning and "
            f"overheads) plus any pretraining: every method pretrains {seconds:.0f} s and the sprint needs "
            f"more commands than planned"
        )
    schedule, piece, room = [], piece_now, left_now
    for method in methods:  # the order the commands will take them (a unit goes where it fits whole)
        while room < seconds + fixed and piece < piece_now + later_pieces:
            piece, room = piece + 1, piece_capacity
        schedule.append({"run": method, "piece": piece})
        room -= seconds + fixed
    if forced is not None and seconds + fixed > piece_capacity:
        notes.append(
            f"pretrain_seconds={forced:g} does not fit one command with its fine-tuning: each method "
            f"pauses at a command's end and resumes from its checkpoint while that machine is still "
            f"warm; on a fresh machine it starts over"
        )
    runs = {}
    for method in methods:
        p = probes[method]
        steps = max(1, int(seconds / p["step_s"]))
        runs[method] = {
            "steps": steps,
            "seconds": steps * p["step_s"],
            "tokens": steps * p["tokens_per_step"],
            "flops": steps * p["flops_per_step"],
            "step_s": p["step_s"],
            "tokens_per_s": p["tokens_per_s"],
            "mfu": p.get("mfu"),
        }
    return {
        "pretrain_seconds": seconds,
        "finetune_seconds": finetune_s,
        "unit_overhead_seconds": unit_overhead_s,
        "capacities": capacities,
        "runs": runs,
        "schedule": schedule,
        "notes": notes,
    }


def plan_table(plan: dict) -> str:
    lines = [
        f"Each method pretrains {plan['pretrain_seconds']:.0f} s of the device (equal GPU-seconds); every "
        f"run then fine-tunes for about {plan['finetune_seconds']:.0f} s (measured on the control).",
        "",
        "| run | steps | est. seconds | tokens (M) | PFLOP | expected command |",
        "|---|---|---|---|---|---|",
    ]
    where = {s["run"]: s["piece"] for s in plan["schedule"]}
    for name in where:  # the schedule keeps the methods' order (the JSON of `runs` sorts them)
        r = plan["runs"][name]
        lines.append(
            f"| {name} | {r['steps']:,} | {r['seconds']:.0f} | {r['tokens'] / 1e6:,.1f} | "
            f"{r['flops'] / 1e15:,.2f} | {where[name]} |"
        )
    lines += [""] + [f"Note: {n}" for n in plan["notes"]]
    return "\n".join(lines).rstrip() + "\n"
