"""The GPU sprint: the small preset's first real comparison (MLM, ELECTRA, COCO-LM and the no-pretraining
control, fine-tuned on five GLUE tasks) in a few 10-minute commands on a lent GPU machine.

    # CPU machine: build and pack the data, write the sprint's settings (once; 1-3 minutes)
    ELECTRALAB_DATA=../shared/data python bench/gpu_sprint.py prep
    # GPU machine, each command (device tool: carry .sprint/carry and .sprint/state, timeout 600 s)
    PYTHONUNBUFFERED=1 python3 bench/gpu_sprint.py run --out $OUT
    # CPU machine, after each command: take the returned state back, then the next command
    python bench/gpu_sprint.py restore <the command's returned folder>
    # CPU machine, at the end: the tracked runs into MLflow, and the small preset's report
    python bench/gpu_sprint.py import --report .sprint/report
    python bench/gpu_sprint.py status          # where it stands

The GPU machine has torch but not MLflow, DVC, Ray or Prefect: the library tracks to the run log there
(electralab.runlog), fine-tunes in its own worker processes, and never imports the others.
docs/scaling.md ("The GPU sprint") has the budget, the carry and what each command does.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # a command's budget counts from here: interpreter start-up is all before

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from sprint import state_dir  # noqa: E402

from electralab.errors import EXPECTED_ERRORS  # noqa: E402


def prep(args) -> None:
    import shutil

    from sprint.bundle import check_size, pack
    from sprint.config import check_runs, load_config
    from sprint.plan import device_seconds
    from sprint.state import write_source

    from electralab.config import load_params, to_dict
    from electralab.env import data_root
    from electralab.errors import ConfigError
    from electralab.io import read_json, write_json

    cfg = load_config({k: v for k, v in vars(args).items() if k in SETTINGS and v is not None})
    values = to_dict(cfg)  # every setting, defaults included: the state says what ran
    params = load_params(ROOT / "params.yaml")
    check_runs(params, cfg)
    mirror = data_root()
    if mirror is None:
        raise ConfigError(
            "ELECTRALAB_DATA is not set: prep reads the corpus and GLUE from the offline mirror "
            "(ELECTRALAB_DATA=../shared/data)"
        )
    manifest = pack(params, cfg.preset, cfg.tasks, mirror, ROOT)
    total = check_size(ROOT)
    state = state_dir(ROOT)
    old = read_json(state / "sprint.json") if (state / "sprint.json").is_file() else None
    old_data = read_json(state / "bundle.json") if (state / "bundle.json").is_file() else {}
    if args.fresh or old != values or old_data.get("sha256") != manifest["sha256"]:
        shutil.rmtree(state, ignore_errors=True)  # other settings or other data: the old results do not apply
        print(f"prep: a new sprint in {state}")
    else:
        print(f"prep: continuing the sprint in {state} (same settings and data)")
    state.mkdir(parents=True, exist_ok=True)
    write_json(state / "sprint.json", values)
    write_json(state / "bundle.json", manifest)
    write_source(ROOT)
    print(
        f"prep: {len(cfg.methods)} methods + control, tasks {', '.join(cfg.tasks)}, {cfg.seeds} seed(s), "
        f"{cfg.pieces} command(s) of {cfg.piece_seconds:.0f} s (+{cfg.grace_seconds:.0f} s grace): "
        f"{device_seconds(cfg.pieces, cfg.piece_seconds, cfg.grace_seconds) / 60:.1f} device-minutes planned of "
        f"{cfg.device_minutes:g} (one start, then each command at once on the warm machine)"
    )
    print(f"prep: what travels: {total / 2**20:.1f} MiB (tracked files + .sprint/carry) + .sprint/state; limit 64 MiB")
    print(
        "next, on the GPU machine (device tool `run`), once per command:\n"
        "  command: PYTHONUNBUFFERED=1 python3 bench/gpu_sprint.py run --out $OUT\n"
        '  carry:   [".sprint/carry", ".sprint/state"], timeout_s: 600\n'
        "then here: python bench/gpu_sprint.py restore <files_at of that run>"
    )


def run(args) -> int:
    from sprint import clock
    from sprint.piece import run_piece

    started = STARTED if clock() is time.monotonic else 0.0  # CPU time counts from the process's start
    return run_piece(ROOT, Path(args.out) if args.out else None, started, args.workers)


def restore(args) -> None:
    from sprint.state import State
    from sprint.state import restore as restore_state

    target = restore_state(Path(args.source), ROOT)
    pieces = State(ROOT).pieces
    print(
        f"restore: {target} holds the state after command {len(pieces)}"
        f"{' (' + pieces[-1]['stopped'] + ')' if pieces else ''}"
    )


def import_runs(args) -> None:
    from electralab.config import load_params
    from electralab.runlog import import_runlog

    counts = import_runlog(state_dir(ROOT) / "runlog", args.tracking_uri)
    print(
        f"import: {counts['imported']} run(s) imported, {counts['replaced']} replaced (they had grown), "
        f"{counts['unchanged']} unchanged; {counts['artifacts_not_found']} artifact(s) named but not on this machine"
    )
    if args.report:
        from electralab.io import read_json
        from electralab.report import build_report

        preset = read_json(state_dir(ROOT) / "sprint.json").get("preset", "small")
        built = build_report(preset, Path(args.report), args.tracking_uri, runs=load_params(ROOT / "params.yaml").runs)
        filled = sum(c["filled"] for c in built["metrics"]["cells"].values())
        index = Path(args.report) / "index.html"
        print(f"import: report of the {preset} preset -> {index} ({filled} of our cells filled)")


def status(args) -> None:
    from sprint.state import State

    state = State(ROOT)
    for p in state.pieces:
        print(
            f"command {p['piece']}: {p['started']}, {p.get('seconds', '?')} s, units {', '.join(p['units']) or '-'}: "
            f"{p['stopped']}"
        )
    for name, unit in state.units.items():
        print(f"{name}: {unit['status']}")
    if (state.dir / "results.md").is_file():
        print((state.dir / "results.md").read_text(encoding="utf-8"))


SETTINGS = (
    "preset",
    "methods",
    "tasks",
    "seeds",
    "pieces",
    "piece_seconds",
    "grace_seconds",
    "probe_seconds",
    "workers",
    "pretrain_seconds",
    "device_minutes",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prep", help="CPU: build and pack the data, write the sprint's settings")
    p.add_argument("--preset")
    p.add_argument("--methods", type=lambda s: s.split(","), help="runs, comma-separated (default electra,mlm,cocolm)")
    p.add_argument("--tasks", type=lambda s: s.split(","), help="GLUE tasks (default stsb,mrpc; any of sst2,cola,rte)")
    p.add_argument("--seeds", type=int, help="fine-tuning seeds: the first N of the preset's (default 2)")
    p.add_argument("--pieces", type=int, help="commands to plan for (default 2)")
    p.add_argument("--piece-seconds", type=float, help="one command's budget (default 330)")
    p.add_argument("--grace-seconds", type=float, help="then running trials are stopped (default 30)")
    p.add_argument("--device-minutes", type=float, help="the device time to plan within (default 15)")
    p.add_argument("--probe-seconds", type=float, help="timed pretraining steps per method (default 3)")
    p.add_argument("--workers", type=int, help="fine-tuning processes (default 8 on a GPU, 1 on a CPU)")
    p.add_argument("--pretrain-seconds", type=float, help="every method this long instead of the plan's")
    p.add_argument("--fresh", action="store_true", help="start a new sprint even with the same settings")
    p.set_defaults(fn=prep)
    p = sub.add_parser("run", help="GPU: one command of the sprint")
    p.add_argument("--out", help="where the state and results go back ($OUT)")
    p.add_argument("--workers", type=int, help="fine-tuning processes for this command (speed only; default: prep's)")
    p.set_defaults(fn=run)
    p = sub.add_parser("restore", help="CPU: a command's returned state -> .sprint/state")
    p.add_argument("source", help="the folder the command's files came back to, or sprint-state.tar.gz")
    p.set_defaults(fn=restore)
    p = sub.add_parser("import", help="CPU: the run log into MLflow (and the report)")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI or the project's mlflow.db")
    p.add_argument("--report", help="also build the preset's report into this folder")
    p.set_defaults(fn=import_runs)
    p = sub.add_parser("status", help="where the sprint stands")
    p.set_defaults(fn=status)
    args = parser.parse_args(argv)
    try:
        return args.fn(args) or 0
    except EXPECTED_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
