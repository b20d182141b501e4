"""The sprint's results: one row per run (the control first) beside the published small-model numbers.

Ours: per task the median over the seeds of the selected configuration (in points, as the papers print
them: accuracy, MCC for CoLA, Spearman for STS-B), its range over the seeds, and the average over the
sprint's tasks, with the range of the per-seed averages (each seed is a full replicate of the grid's
best configuration on every task). The published averages are over the eight GLUE tasks (MNLI, QQP and
QNLI included, which the mirror does not hold in full): close to ours in kind, not the same average.
"""

from __future__ import annotations

import csv
import io
import math

import numpy as np

from electralab.finetune.metrics import GLUE_AVERAGE_METRICS
from electralab.report.published import published_table

# The ELECTRA paper (Clark et al. 2020, Table 1; GLUE dev, one V100), as issue 16 quotes it; that paper
# is not among ../shared/papers, so these two numbers live here rather than in report/published.csv.
ELECTRA_PAPER = (
    ("ELECTRA-Small at 6.25% of its training (6 h on one V100) [ELECTRA, Table 1]", 74.1),
    ("BERT-Small, fully trained [ELECTRA, Table 1]", 75.1),
)
TEAMS_ROWS = ("BERT-Small", "ELECTRA-Small (Our reimplementation)", "TEAMS-Small")  # TEAMS Table 1, small


def published_rows() -> list[tuple[str, float]]:
    teams = published_table("teams", "table1", "small")
    glue = teams[teams["column"] == "GLUE"].set_index("row")["value"]
    return [*ELECTRA_PAPER, *((f"{row}, fully trained [TEAMS, Table 1]", float(glue[row])) for row in TEAMS_ROWS)]


def run_scores(summary: dict, tasks: tuple[str, ...]) -> dict:
    """Median, seed range per task; the average of the medians and the range of the per-seed averages."""
    out = {}
    for task in tasks:
        t, metric = summary["tasks"].get(task), GLUE_AVERAGE_METRICS[task]
        if t is None:
            continue
        out[task] = (t[f"median_{metric}"], t[f"min_{metric}"], t[f"max_{metric}"])
    if len(out) == len(tasks):
        seeds = set.intersection(*(set(summary["tasks"][t]["seeds"]) for t in tasks))
        per_seed = [np.mean([summary["tasks"][t]["seeds"][s][GLUE_AVERAGE_METRICS[t]] for t in tasks]) for s in seeds]
        out["avg"] = (float(np.mean([out[t][0] for t in tasks])), float(min(per_seed)), float(max(per_seed)))
    return out


def rows(state: dict) -> list[dict]:
    tasks, lines = tuple(state["config"]["tasks"]), []
    for name in ["control", *state["config"]["methods"]]:
        unit, summary = state["units"].get(name, {}), state["finetune"].get(name)
        pre, planned = unit.get("pretrain", {}), state.get("plan", {}).get("runs", {}).get(name, {})
        line = {
            "row": name,
            "source": "ours",
            "run": name,
            "method": unit.get("method", ""),
            "planned_seconds": planned.get("seconds", 0.0 if name == "control" else None),
            "pretrain_seconds": pre.get("wall_hours", 0) * 3600 if pre else None,
            "steps": pre.get("steps"),
            "tokens": pre.get("tokens"),
            "tokens_per_s": pre.get("tokens_per_s"),
            "mfu": pre.get("mfu"),
            "loss": pre.get("loss"),
            "status": unit.get("status", "not started"),
        }
        scores = run_scores(summary, tasks) if summary else {}
        for key in (*tasks, "avg"):
            median, low, high = scores.get(key, (None, None, None))
            line |= {key: median, f"{key}_min": low, f"{key}_max": high}
        lines.append(line)
    for label, value in published_rows():
        lines.append({"row": label, "source": "published", "avg": value})
    return lines


def to_csv(lines: list[dict], tasks: tuple[str, ...]) -> str:
    columns = [
        "row",
        "source",
        "run",
        "method",
        "status",
        "planned_seconds",
        "pretrain_seconds",
        "steps",
        "tokens",
        "tokens_per_s",
        "mfu",
        "loss",
        *(f"{t}{s}" for t in (*tasks, "avg") for s in ("", "_min", "_max")),
    ]
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for line in lines:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in line.items()})
    return out.getvalue()


def _cell(line: dict, key: str) -> str:
    value = line.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    low, high = line.get(f"{key}_min"), line.get(f"{key}_max")
    return f"{value:.1f} ({low:.1f}–{high:.1f})" if low is not None and high is not None else f"{value:.1f}"


def _diff(lines: dict, a: str, b: str, tasks: int) -> str | None:
    """a − b on the average, and whether the seeds' ranges of the per-seed averages overlap."""
    if a not in lines or b not in lines or lines[a].get("avg") is None or lines[b].get("avg") is None:
        return None
    x, y = lines[a], lines[b]
    apart = x["avg_min"] > y["avg_max"] or y["avg_min"] > x["avg_max"]
    return (
        f"{a} − {b}: {x['avg'] - y['avg']:+.1f} points on the {tasks}-task average; per-seed averages "
        f"{a} {x['avg_min']:.1f}–{x['avg_max']:.1f}, {b} {y['avg_min']:.1f}–{y['avg_max']:.1f} "
        f"({'apart' if apart else 'overlapping: within the spread of the seeds'})"
    )


def to_markdown(lines: list[dict], state: dict) -> str:
    cfg, plan, probe = state["config"], state.get("plan", {}), state.get("probe", {})
    tasks = tuple(cfg["tasks"])
    first = next(iter(probe.values()), {})
    head = [
        "run",
        "status",
        "pretrain s (planned)",
        "steps",
        "tokens (M)",
        "tokens/s",
        "MFU",
        *(f"{t} ({GLUE_AVERAGE_METRICS[t]})" for t in tasks),
        f"avg of {len(tasks)}",
    ]
    out = [
        f"# GPU sprint: {cfg['preset']} preset, {first.get('device', '?')}, {first.get('precision', '?')}",
        "",
        f"Pretraining: {plan.get('pretrain_seconds', 0):.0f} s of the device per method (equal GPU-seconds; "
        f"steps from the measured step time). Fine-tuning: the preset's grid, {cfg['seeds']} seed(s) (the "
        f"preset has more), tasks {', '.join(tasks)}; cells: median over the seeds of the selected "
        f"configuration (min–max over the seeds).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for line in (x for x in lines if x["source"] == "ours"):
        mfu = f"{line['mfu'] * 100:.1f}%" if line.get("mfu") else "—"
        planned = f" ({line['planned_seconds']:.0f})" if line.get("planned_seconds") is not None else ""
        numbers = [
            (f"{line['pretrain_seconds']:.0f}" if line.get("pretrain_seconds") is not None else "—") + planned,
            f"{line['steps']:,}" if line.get("steps") is not None else "—",
            f"{line['tokens'] / 1e6:,.1f}" if line.get("tokens") else "—",
            f"{line['tokens_per_s']:,.0f}" if line.get("tokens_per_s") else "—",
            mfu,
        ]
        out.append(
            "| "
            + " | ".join([line["run"], line["status"], *numbers, *(_cell(line, t) for t in tasks), _cell(line, "avg")])
            + " |"
        )
    out += [
        "",
        "Published (GLUE dev average over its eight tasks, not the same average as ours):",
        "",
        "| row | GLUE |",
        "|---|---|",
    ]
    out += [f"| {x['row']} | {x['avg']:.2f} |" for x in lines if x["source"] == "published"]
    ours = {x["run"]: x for x in lines if x["source"] == "ours"}
    comparisons = [_diff(ours, "electra", "mlm", len(tasks))] + [
        _diff(ours, m, "control", len(tasks)) for m in cfg["methods"]
    ]
    if any(comparisons):
        out += ["", "Comparisons:", ""] + [f"- {c}" for c in comparisons if c]
    return "\n".join(out) + "\n"
