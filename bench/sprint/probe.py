"""Throughput first: the time of one pretraining step of each method, before anything trains
(electralab.train.probe), and its table for the sprint's log."""

from __future__ import annotations

from electralab.train.probe import probe

__all__ = ["probe", "probe_table"]


def probe_table(results: dict[str, dict], order: tuple[str, ...]) -> str:
    lines = ["| run | method | step (ms) | tokens/s | GFLOP/step | MFU |", "|---|---|---|---|---|---|"]
    for name in order:  # the methods' order (the saved JSON sorts its keys)
        r = results[name]
        mfu = f"{r['mfu'] * 100:.1f}%" if r.get("mfu") else "-"
        lines.append(
            f"| {name} | {r['method']} | {r['step_s'] * 1000:.1f} | {r['tokens_per_s']:,.0f} | "
            f"{r['flops_per_step'] / 1e9:,.3g} | {mfu} |"
        )
    first = next(iter(results.values()))
    peak = f"{first['peak_flops'] / 1e9:,.0f} GFLOP/s" if first.get("peak_flops") else "unknown"
    return "\n".join(lines) + f"\n\ndevice {first['device']}, precision {first['precision']}, peak {peak}\n"
