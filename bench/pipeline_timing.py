"""Benchmark: where the time of the whole default run goes, stage by stage, as the reproduce flow runs it.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/pipeline_timing.py                  # every stage
    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/pipeline_timing.py corpus shards pretrain@mlm
    ELECTRALAB_DATA=../shared/data python bench/pipeline_timing.py \
        $(python flows/reproduce.py --tables coco-lm/table1 --targets) report
    python bench/pipeline_timing.py --project /tmp/fresh-clone                                     # another checkout

Runs `dvc repro <stage>` once per stage, in `dvc stage list` order (the registry's order: producers before
the runs that read them), in the project (measure a fresh clone: empty DVC cache, no mlflow.db). For every
stage it records wall seconds, CPU seconds (user + system of dvc and the stage, from wait4) and the load
average, and, for pretrain@<run>, the training loop's own seconds from metrics/pretrain/<run>.json
(`wall_hours`), so "start-up and export" = stage wall - loop. The machine may be shared: CPU seconds and the
load average say how much. Writes bench/out/pipeline_timing.json and prints a Markdown summary.
docs/operations.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stages", nargs="*", help="stages to run (default: every stage of `dvc stage list`)")
    parser.add_argument("--project", type=Path, default=HERE.parent, help="the checkout to run in")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "pipeline_timing.json")
    args = parser.parse_args()

    beside = Path(sys.executable).parent / "dvc"
    dvc = str(beside) if beside.exists() else "dvc"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    stages = (
        args.stages
        or subprocess.run(
            [dvc, "stage", "list", "--name-only"], cwd=args.project, env=env, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    log = args.out.with_suffix(".log")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows, started = [], time.monotonic()
    with open(log, "w") as out:
        for stage in stages:
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            # The report alone, as the flow runs it: with a subset of stages, plain `dvc repro report` would
            # first train every run the report depends on.
            single = ["--single-item"] if stage == "report" else []
            proc = subprocess.Popen(
                [dvc, "repro", *single, stage], cwd=args.project, env=env, stdout=out, stderr=subprocess.STDOUT
            )
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.monotonic() - t0
            row = {
                "stage": stage,
                "wall_s": round(wall, 2),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                "load_before": round(load, 2),
                "exit": os.waitstatus_to_exitcode(status),
            }
            if stage.startswith("pretrain@"):
                metrics = args.project / "metrics" / "pretrain" / f"{stage.split('@')[1]}.json"
                if metrics.exists():
                    loop = json.loads(metrics.read_text()).get("wall_hours", 0.0) * 3600
                    row.update(loop_s=round(loop, 2), overhead_s=round(wall - loop, 2))
            rows.append(row)
            print(json.dumps(row), flush=True)
            if row["exit"] != 0:
                break
    total = time.monotonic() - started

    families: dict[str, dict[str, float]] = {}
    for r in rows:
        f = families.setdefault(
            r["stage"].split("@")[0], {"count": 0, "wall_s": 0.0, "cpu_s": 0.0, "loop_s": 0.0, "overhead_s": 0.0}
        )
        f["count"] += 1
        for k in ("wall_s", "cpu_s", "loop_s", "overhead_s"):
            f[k] += r.get(k, 0.0)
    result = {
        "project": str(args.project),
        "total_wall_s": round(total, 1),
        "stages": rows,
        "families": families,
        "cpu_count": os.cpu_count(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "log": str(log),
    }
    args.out.write_text(json.dumps(result, indent=2))

    print(
        f"\n{len(rows)} stages, {total / 60:.1f} min wall ({os.cpu_count()} cores; mean load average before a "
        f"stage {sum(r['load_before'] for r in rows) / max(len(rows), 1):.1f})\n"
    )
    print("| stages | count | wall min | CPU min | mean wall s | mean loop s | mean start-up + export s |")
    print("|---|---|---|---|---|---|---|")
    for name, f in families.items():
        n = f["count"]
        loop = f"{f['loop_s'] / n:.1f}" if f["loop_s"] else "-"
        over = f"{f['overhead_s'] / n:.1f}" if f["loop_s"] else "-"
        minutes = f"{f['wall_s'] / 60:.1f} | {f['cpu_s'] / 60:.1f}"
        print(f"| {name} | {n} | {minutes} | {f['wall_s'] / n:.1f} | {loop} | {over} |")
    slowest = sorted(rows, key=lambda r: -r["wall_s"])[:8]
    print("\nslowest: " + ", ".join(f"{r['stage']} {r['wall_s']:.0f} s" for r in slowest))
    print(f"-> {args.out}")
    sys.exit(rows[-1]["exit"] if rows else 0)


if __name__ == "__main__":
    main()
