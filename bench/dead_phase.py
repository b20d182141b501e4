"""The dead-phase sweep: which change ends the detector's dead phase early, measured (docs/findings.md).

At the tiny preset every ELECTRA-family detector sits at its base rate for the first 3,000-4,500 of 8,000
steps. This sweep pretrains the preset's run of a method with each candidate (a named list of --set
overrides of bench/heldout_trace.py, applied alike to every method), the collapse guard measuring every
`--every` steps, and records where the detector leaves the base rate for good: the first check from which on
its gain over the base rate (RTD, or COCO-LM's copy head) stays at the guard's 0.02 or above and its gain on the
unigram task above 0 (it reads context, rather than calling rare words replaced).

    # every candidate on ELECTRA, one at a time (CPU), then the table
    ELECTRALAB_DATA=../shared/data .venv/bin/python bench/dead_phase.py run --methods electra
    .venv/bin/python bench/dead_phase.py table
    # a few candidates on every method, four at a time on one GPU, stopping cleanly after 8 minutes
    python3 bench/dead_phase.py run --methods electra cocolm amos teams --candidates base pre_ln \\
        --set pretrain.use_gpu=true --parallel 4 --minutes 8 --data <dir with shards/ and vocab/>
    # the encoders of finished points, fine-tuned as bench/signal_sweep.py does (STS-B, MRPC, CoLA, 5 seeds; fp32)
    ELECTRALAB_DATA=../shared/data .venv/bin/python bench/dead_phase.py finetune electra-pre_ln-s1
    # the controlled runs of a fair Table 1 (CONTROLS) and their methods' main rows, to the end of the budget
    ELECTRALAB_DATA=../shared/data .venv/bin/python bench/dead_phase.py --out results/controlled run --controls
    # ... the same at the preset as params.yaml states it now (its steps, its start; no SWEEP_BASE)
    ELECTRALAB_DATA=../shared/data .venv/bin/python bench/dead_phase.py --out results/controlled_preset run \
        --controls --at-preset
    # the rows (a run's points: its pretraining seeds) against ELECTRA's and the control's, Welch's t-test over the
    # pretraining seeds as report/claims.py tests a claim: holds, reversed, or within noise
    .venv/bin/python bench/dead_phase.py --out results/controlled_preset compare \
        --against electra-base-s1 control-base-s1

Each point (method, candidate, seed) is one process and one file, `--out/points/<method>-<candidate>-s<seed>.json`
(the trace, where the detector left the base rate, the machine, precision, load and commit); a point with a
file is done, so `run` resumes where it stopped. A point stopped by `--minutes` keeps its partial trace
(`"paused": true`) and is not done: the next `run` carries it on from its checkpoint. One paused by `--stop-at N`
(the loop's step, resumes included) is done for that N; a `run` with a later N, or none, carries it on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from electralab.env import source_commit  # noqa: E402

OUT = ROOT / "bench" / "out" / "dead_phase"
STEPS = 8000  # the tiny preset's main-row budget when the sweep ran (a full pass over the mirror's articles)
# The sweep's base is the tiny preset as it was when the sweep ran, before the preset took up its findings (the
# same-piece prior; the ablation shape at lr 3e-4 and 700 steps, which the documented commands pass as --steps):
# every point starts from it, per budget, so each documented command still measures what it measured.
SWEEP_BASE = {"main": ["model.same_piece_init=null"], "ablation": ["model.same_piece_init=null", "pretrain.lr=3e-4"]}
LEFT = 0.02  # the guard's min_base_rate_gain: the detector has left the base rate


def warmup(fraction: float):
    return lambda steps: [f"pretrain.warmup_steps={max(1, round(fraction * steps))}"]


def short(length: int, share: int) -> list[str]:
    return [f"pretrain.short_seq_len={length}", f"pretrain.short_seq_until={share / 100}"]


# ALiBi's steepest and flattest of 8 heads' slopes (1/2, 1/256) as the relative bias's start.
SPREAD = ["model.relative_init=alibi", "model.alibi_heads=8", "model.alibi_pick=spread"]

# name -> the sets it applies, as a function of the steps (warm-ups are fractions of the budget). Each is a
# parameter of the library, documented in docs/configuration.md; the base is SWEEP_BASE.
CANDIDATES = {
    "base": lambda steps: [],
    "pre_ln": lambda steps: ["model.norm=pre"],
    "qk_norm": lambda steps: ["model.qk_norm=true"],
    "pre_ln_qk_norm": lambda steps: ["model.norm=pre", "model.qk_norm=true"],
    "depth_scaled_init": lambda steps: ["model.residual_init=depth_scaled"],
    "pre_ln_lr2e-3": lambda steps: ["model.norm=pre", "pretrain.lr=2e-3"],
    "pre_ln_lr3e-3": lambda steps: ["model.norm=pre", "pretrain.lr=3e-3"],
    "lr3e-3": lambda steps: ["pretrain.lr=3e-3"],
    "warmup_2pct": warmup(0.02),
    "warmup_30pct": warmup(0.30),
    "pre_ln_warmup_2pct": lambda steps: ["model.norm=pre", *warmup(0.02)(steps)],
    "beta2_0.999": lambda steps: ["pretrain.adam_betas=[0.9, 0.999]"],
    # torch's default epsilon for the papers' 1e-6: in the dead phase the last layer's queries and keys have
    # gradients near 1e-6, and that epsilon keeps 71-77% of their step at step 1,800 (bench/adam_moments.py).
    "adam_eps_1e-8": lambda steps: ["pretrain.adam_eps=1e-8"],
    "no_relative_bias": lambda steps: ["model.relative_positions=false"],
    # The position map every run learns slowly (the previous token up, itself down), started as ALiBi's penalty.
    "alibi_init": lambda steps: ["model.relative_init=alibi"],
    "previous_token_init": lambda steps: ["model.relative_init=previous_token"],  # started at that map itself
    # More locality: the two heads start at the slopes ALiBi gives the first two of 8 (1/2, 1/4; own: 1/16, 1/256).
    "alibi_init_steep": lambda steps: ["model.relative_init=alibi", "model.alibi_heads=8"],
    # One head local, one free: the steepest and the flattest of 8 heads' slopes (1/2, 1/256).
    "alibi_init_spread": lambda steps: [*SPREAD],
    # ...with [CLS] untied from the bias (TUPE): the steep start keeps [CLS], which every sentence task reads, local.
    "alibi_init_steep_cls": lambda steps: ["model.relative_init=alibi", "model.alibi_heads=8", "model.untie_cls=true"],
    # A prior for the head STS-B reads (a piece's attention on its twin across the pair), which forms only late:
    # layer 1's queries and keys start as one map, the token itself held back (`model.same_piece_init`). At the full
    # budget, at half (the signal measured against the half-budget base) and at the first look's quarter.
    "same_piece_init": lambda steps: ["model.same_piece_init=4.0"],
    "same_piece_init_half": lambda steps: ["model.same_piece_init=4.0", f"steps={steps // 2}"],
    "same_piece_init_quarter": lambda steps: ["model.same_piece_init=4.0", f"steps={steps // 4}"],
    "layers_2": lambda steps: ["model.layers=2"],
    "detector_bias_zero": lambda steps: ["model.detector_bias=zero"],
    "init_0.01": lambda steps: ["model.initializer_range=0.01"],
    # Tokens or steps? Every earlier trace used 32 x 128 tokens a step, so the two were one measure.
    **{
        f"batch_{b}": (lambda b: lambda steps: [f"pretrain.batch_size={b}", f"pretrain.micro_batch_size={b}"])(b)
        for b in (8, 16, 64, 128)
    },
    # The schedule's length at the base's tokens: half the batch over twice the steps (its own --steps).
    "batch_16_steps_2x": lambda steps: ["pretrain.batch_size=16", "pretrain.micro_batch_size=16", f"steps={2 * steps}"],
    # Short sequences first (Shortformer's staged training): rows of L tokens for the first share of the steps.
    **{
        f"short_{length}_{share}pct": (lambda length, share: lambda steps: short(length, share))(length, share)
        for length, share in ((16, 5), (16, 10), (16, 25), (32, 25), (32, 50), (64, 25), (64, 50))
    },
    # The generator's task: flatter samples (ELECTRA's released `temperature`), easier to tell from context sooner?
    **{f"temperature_{t}": (lambda t: lambda steps: [f"settings.temperature={t}"])(t) for t in (1.5, 2)},
    # Half the budget (its own schedule over half the steps), as it is and with the best short start.
    "half": lambda steps: [f"steps={steps // 2}"],
    # The first look's budget (a quarter of the steps, its own schedule): does STS-B clear the control there?
    "quarter": lambda steps: [f"steps={steps // 4}"],
    "short_16_25pct_half": lambda steps: [*short(16, 25), f"steps={steps // 2}"],
    "alibi_init_half": lambda steps: ["model.relative_init=alibi", f"steps={steps // 2}"],
    "alibi_init_spread_half": lambda steps: [*SPREAD, f"steps={steps // 2}"],
    # Controlled runs of a fair Table 1 (CONTROLS below): one choice of a method changed, the rest its main row.
    "linear_head": lambda steps: ["model.detector_head=linear"],  # Eq. 6 / Sec. 3.3's sigmoid(w^T h)
    "no_scl": lambda steps: ["settings.scl=false"],
    "scl_projection": lambda steps: ["settings.scl_projection=true"],
    "lm_release": lambda steps: ["settings.lm_form=release"],
    "lm_mask_only": lambda steps: ["settings.lm_positions=mask_token", "settings.masking.mask_special_tokens=false"],
    "rtd_export": lambda steps: ["settings.mws_weight=0", "settings.export=rtd"],
    "mixture_uniform": lambda steps: ["settings.mixture=uniform"],
    "generator_2_layers": lambda steps: ["generators.amos={layers: 2, exits: [1, 2]}"],
    "amos_generator": lambda steps: ["generators.electra={layers: 3}"],  # AMOS's deepest exit: 3 layers, full width
}
# The controlled runs of issue "a fair Table 1" (docs/reproducing.md, "Controlled runs"): candidate -> the
# methods it is run on. Each separates the tiny scale from one implementation choice that could explain a row
# below ELECTRA: the detector's head (the releases differ), COCO-LM's contrastive term and its LM loss's form,
# TEAMS's exported branch (its top layer sees only MWS), AMOS's generator (75% of the main model's layers here).
CONTROLS = {
    "linear_head": ("electra", "teams"),
    "no_scl": ("cocolm",),
    "scl_projection": ("cocolm",),
    "lm_release": ("cocolm",),
    "lm_mask_only": ("cocolm",),
    "rtd_export": ("teams",),
    "mixture_uniform": ("amos",),
    "generator_2_layers": ("amos",),
    "amos_generator": ("electra",),
}
DETECTOR_GAINS = ("rtd_base_rate_gain", "copy_base_rate_gain")  # whichever the method's detector reports
UNIGRAM_GAIN = "detector_unigram_gain"  # the gain on random words by the corpus's frequencies (train/diagnostics.py)


def point_name(method: str, candidate: str, seed: int) -> str:
    return f"{method}-{candidate}-s{seed}"


def known_run(params, method: str) -> dict:
    """params.yaml's run `method` as it states it, or exit naming the run and the runs there are."""
    runs = params.raw["runs"]
    if method not in runs:
        sys.exit(f"error: params.yaml has no run {method!r} (--methods, --points); runs: {', '.join(sorted(runs))}")
    return runs[method]


def point_sets(
    method: str, candidate: str, steps: int | None, extra: list[str], seed: int, at_preset: bool = False
) -> tuple[list[str], int]:
    """The --set items of a point (the SWEEP_BASE of the method's budget, none `at_preset`, then the candidate's)
    and its schedule's steps: --steps, else STEPS, or `at_preset` the preset's for the method's run; a candidate's
    `steps=N` replaces them."""
    from electralab.config import MAIN_BUDGET, load_params
    from electralab.runs import resolve_run

    params = load_params(ROOT / "params.yaml")
    budget = known_run(params, method).get("budget", MAIN_BUDGET)
    if steps is None:
        steps = resolve_run(params, method).pretrain.steps if at_preset else STEPS
    base = [] if at_preset else SWEEP_BASE[budget]
    sets = [*base, *CANDIDATES[candidate](steps), *extra, f"pretrain.seed={seed}"]
    for item in sets:
        if item.startswith("steps="):
            steps = int(item.partition("=")[2])
    return [item for item in sets if not item.startswith("steps=")], steps


def detector_gains(trace: dict) -> list[tuple[int, float, float | None]]:
    """(step, the detector's gain over its base rate, its gain on the unigram task) at every check after
    initialisation; the unigram gain is None where the trace has none."""
    rows = sorted((int(step), row) for step, row in trace.items())
    gains = [(step, next((row[k] for k in DETECTOR_GAINS if k in row), None), row) for step, row in rows]
    return [(step, g, row.get(UNIGRAM_GAIN)) for step, g, row in gains if step > 0 and g is not None]


def left_at(trace: dict) -> int | None:
    """The first check from which on the detector's gain stays at LEFT or above and its gain on the unigram task
    above 0: where it left the base rate for good, reading context. A young detector can gain early from a
    shortcut, calling rare words replaced, which the unigram task exposes (below 0) and which fades once the
    generator learns the words' frequencies (not with flatter samples: `temperature_2`); the first check at LEFT
    is `first_at`."""
    gains = detector_gains(trace)
    for i, (step, _, _) in enumerate(gains):
        if all(g >= LEFT and (u is None or u > 0) for _, g, u in gains[i:]):
            return step
    return None


def first_at(trace: dict) -> int | None:
    return next((step for step, g, _ in detector_gains(trace) if g >= LEFT), None)


def project_relative(path: str) -> str:
    """A path inside this checkout as relative to it: a point file names no folder of the machine it ran on."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def run_point(args) -> None:
    """One point in this process: the trace, written to its file (atomically) unless it failed to start."""
    import torch
    from heldout_trace import trace

    from electralab.errors import ConfigError
    from electralab.io import write_json
    from electralab.train.common import machine, resolve_precision

    torch.set_num_threads(args.threads)
    sets, steps = point_sets(args.method, args.candidate, args.steps, args.set, args.seed, args.at_preset)
    deadline = float(os.environ.get("DEAD_PHASE_DEADLINE", "inf"))

    def stop(step: int) -> bool:  # asked after every step; --stop-at is the loop's step, resumes included
        return time.time() >= deadline or (args.stop_at is not None and step >= args.stop_at)

    data = (args.data / "shards", args.data / "vocab") if args.data else None
    name = point_name(args.method, args.candidate, args.seed)
    load = os.getloadavg()[0]
    try:
        result = trace(
            args.method,
            sets,
            steps,
            args.every,
            args.out / "work",
            data=data,
            name=name,
            stop=stop,
        )
    except ConfigError as e:
        sys.exit(f"error: {name}: {e}")
    gpu = result["pretrain_cfg"].use_gpu
    device = torch.device("cuda" if gpu else "cpu")
    record = {
        "method": args.method,
        "candidate": args.candidate,
        "seed": args.seed,
        "sets": sets,
        "steps": steps,
        "every": args.every,
        "left_at": left_at(result["trace"]),
        "first_at": first_at(result["trace"]),
        "stop_at": args.stop_at,
        "stopped_at": result["reached"],
        "trace": result["trace"],
        "guard_stops_at": result["guard_stops_at"],
        "error": result["error"],
        "paused": result["paused"],
        "minutes": result["minutes"],
        "encoder": project_relative(result["encoder"]),
        "device": machine(device),
        "precision": resolve_precision(result["pretrain_cfg"].precision, device),  # a --set may force one
        "threads": args.threads,
        "load_at_start": load,
        "commit": args.commit or source_commit(ROOT),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    write_json(args.out / "points" / f"{name}.json", record)
    print(f"{name}: left the base rate at step {record['left_at']}; {result['minutes']:.1f} min", flush=True)


def load_points(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "points").glob("*.json"))]


def wanted_points(
    methods: list[str], candidates: list[str] | None, points: list[str], seeds: list[int], controls: bool
) -> list[tuple[str, str, int]]:
    """(method, candidate, seed) in the order they run: the cross product, the --points, then with `controls` each
    controlled method's main row and its controls. `candidates` None: every candidate but the controls, which
    are one method's choice each (none with `controls`)."""
    if candidates is None:
        candidates = [] if controls else [c for c in CANDIDATES if c not in CONTROLS]
    wanted = [(m, c, s) for c in candidates for m in methods for s in seeds]
    wanted += [(*item.split("/", 1), s) for item in points for s in seeds]
    if controls:
        controlled = dict.fromkeys(m for ms in CONTROLS.values() for m in ms)
        wanted += [(m, "base", s) for m in controlled for s in seeds]
        wanted += [(m, c, s) for c, ms in CONTROLS.items() for m in ms for s in seeds]
    return list(dict.fromkeys(wanted))


def run(args) -> None:
    bad = [item for item in args.points if "/" not in item]
    if bad:
        sys.exit(f"error: --points {bad[0]!r}: give METHOD/CANDIDATE, e.g. cocolm/pre_ln")
    wanted = wanted_points(args.methods, args.candidates, args.points, args.seeds, args.controls)
    unknown = sorted({c for _, c, _ in wanted} - set(CANDIDATES))
    if unknown:
        sys.exit(f"error: unknown candidate(s) {unknown}; choose from {sorted(CANDIDATES)}")
    from electralab.config import load_params

    params = load_params(ROOT / "params.yaml")
    for method in sorted({m for m, _, _ in wanted}):
        known_run(params, method)
    done = {  # a paused point runs on, unless it has reached this --stop-at
        point_name(p["method"], p["candidate"], p["seed"])
        for p in load_points(args.out)
        if not p.get("paused") or (args.stop_at and p["stopped_at"] >= args.stop_at)
    }
    todo = [w for w in wanted if point_name(*w) not in done]
    print(f"{len(wanted) - len(todo)} of {len(wanted)} points done; {len(todo)} to run, {args.parallel} at a time")
    env = dict(os.environ)
    if args.minutes:
        env["DEAD_PHASE_DEADLINE"] = str(time.time() + 60 * args.minutes)
    threads = max(1, (os.cpu_count() or 1) // args.parallel)
    running: list[subprocess.Popen] = []
    started: dict[str, subprocess.Popen] = {}
    base = [sys.executable, __file__, "--out", str(args.out), "point", "--every", str(args.every)]
    base += ["--threads", str(threads), "--commit", source_commit(ROOT)]
    base += ["--steps", str(args.steps)] if args.steps else []
    base += ["--at-preset"] if args.at_preset else []
    base += ["--data", str(args.data)] if args.data else []
    base += ["--stop-at", str(args.stop_at)] if args.stop_at else []
    for item in args.set:
        base += ["--set", item]
    for method, candidate, seed in todo:
        while len(running) >= args.parallel:
            running = [p for p in running if p.poll() is None]
            time.sleep(1)
        if args.minutes and time.time() >= float(env["DEAD_PHASE_DEADLINE"]) - 60:
            print("the time is up: the rest stay for the next run")
            break
        cmd = [*base, "--method", method, "--candidate", candidate, "--seed", str(seed)]
        running.append(subprocess.Popen(cmd, env=env))
        started[point_name(method, candidate, seed)] = running[-1]
    for p in running:
        p.wait()
    table(args)
    failed = [name for name, p in started.items() if p.returncode != 0]
    if failed:
        sys.exit(f"error: {len(failed)} point(s) failed before their trace: {', '.join(failed)} (their output above)")


def tokens_per_step(point: dict, preset) -> int:
    """The point's batch (its sets', else the active preset's) x the preset's sequence length."""
    batch = preset.pretrain.batch_size
    for item in point["sets"]:
        if item.startswith("pretrain.batch_size="):
            batch = int(item.partition("=")[2])
    return batch * preset.shards.seq_len


def table(args) -> None:
    from electralab.config import load_params

    preset = load_params(ROOT / "params.yaml").active
    points = load_points(args.out)
    print(
        "| method | candidate | seed | left the base rate for good at step | of the budget | tokens by then | "
        "first at 0.02 | gain at the last check | on the unigram task there | attention entropy there | minutes | "
        "device, precision | "
        "fine-tuned: signal (STS-B, MRPC, CoLA medians; fine-tuning seeds) |"
    )
    print("|---" * 13 + "|")
    # The exit is read from the trace again (a point's own `left_at` is what the bench's rule was when it ran).
    for p in sorted(points, key=lambda p: (p["method"], left_at(p["trace"]) or 1e9, p["candidate"], p["seed"])):
        last = p["trace"][max(p["trace"], key=int)] if p["trace"] else {}
        gain = next((last[k] for k in DETECTOR_GAINS if k in last), float("nan"))
        left = left_at(p["trace"])
        reached = max(map(int, p["trace"]), default=0)
        share = f"{left / p['steps']:.0%}" if left else f"not by step {reached}" if p["trace"] else "no detector"
        state = (
            f" (stopped at {p.get('stopped_at', reached)})"
            if p.get("paused")
            else f" ({p['error'][:40]})"
            if p.get("error")
            else ""
        )
        print(
            f"| {p['method']} | {p['candidate']}{state} | {p['seed']} | {left or '-'} | {share} | "
            f"{f'{left * tokens_per_step(p, preset) / 1e6:.1f}M' if left else '-'} | "
            f"{first_at(p['trace']) or '-'} | {measured(gain)} | {measured(last.get(UNIGRAM_GAIN))} | "
            f"{measured(last.get('attention_entropy'))} | {p['minutes']:.1f} | "
            f"{p['device']}, {p['precision']} | {finetuned(p)} |"
        )


def measured(value: float | None) -> str:
    """A trace's value, or '-' where the point has none (the control trains no detector)."""
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


def curves(args) -> None:
    """The points' detector gain over its base rate against the tokens seen, a panel per method: the preset as it
    is (`base`) in black, each other candidate a line, the guard's 0.02 dashed. Written to --to (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from electralab.config import load_params

    preset = load_params(ROOT / "params.yaml").active
    points = [p for p in load_points(args.out) if detector_gains(p["trace"])]
    if not points:
        sys.exit(f"error: {args.out / 'points'}: no point with a detector's trace to draw")
    methods = sorted({p["method"] for p in points}, key=lambda m: (m != "electra", m))
    fig, axes = plt.subplots(1, len(methods), figsize=(6.5 * len(methods), 4.2), squeeze=False)
    for ax, method in zip(axes[0], methods):
        mine = sorted((p for p in points if p["method"] == method), key=lambda p: (p["candidate"], p["seed"]))
        for k, p in enumerate(mine):
            steps, gains, _ = zip(*detector_gains(p["trace"]))
            tokens = [s * tokens_per_step(p, preset) / 1e6 for s in steps]
            base = p["candidate"] == "base"
            ax.plot(
                tokens,
                gains,
                color="black" if base else plt.cm.tab20(k % 20),
                linewidth=2.0 if base else 1.0,
                alpha=1.0 if base else 0.8,
                label=f"{p['candidate']} s{p['seed']} ({p['precision']})",
            )
        ax.axhline(LEFT, color="0.4", linestyle="--", linewidth=1, label=f"the guard's {LEFT}")
        ax.set_title(f"{method}: the detector's dead phase", fontsize=10)
        ax.set_xlabel("tokens seen (millions)")
        ax.set_ylabel("held-out gain over the base rate")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    args.to.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.to, dpi=110)
    print(f"{len(points)} points -> {args.to}")


def finetuned(point: dict) -> str:
    """The signal of a fine-tuned point (bench/signal_sweep.py's: the mean of the tasks' medians), or '-'."""
    if "finetune" not in point:
        return "-"
    from signal_sweep import SIGNAL_TASKS, signal

    present = [point["finetune"][t] for t in SIGNAL_TASKS if t in point["finetune"]]
    medians = ", ".join(f"{task['median']:.1f}" for task in present)
    seeds = min(len(task["seeds"]) for task in present)
    # Points fine-tuned before this was recorded were fine-tuned where they were pretrained, at "auto" as well.
    tuned_in = point.get("finetune_precision", point["precision"])
    elsewhere = f", fine-tuned in {tuned_in}" if tuned_in != point["precision"] else ""
    return f"{signal(point, SIGNAL_TASKS)[0]:.1f} ({medians}; {seeds} seeds{elsewhere})"


def finetune(args) -> None:
    import torch
    from signal_sweep import SIGNAL_TASKS, finetune_point

    from electralab.config import load_params
    from electralab.io import write_json
    from electralab.train.common import resolve_precision

    cfg = dataclasses.replace(load_params(ROOT / "params.yaml").active.finetune, precision=args.precision)
    for name in args.points:
        path = args.out / "points" / f"{name}.json"
        point = json.loads(path.read_text())
        encoder = args.encoder or ROOT / point["encoder"]  # relative to the checkout, unless made elsewhere
        started = time.perf_counter()
        scores = finetune_point(encoder, list(SIGNAL_TASKS), args.seeds, workers=2, cfg=cfg)
        point["finetune"] = scores
        point["finetune_minutes"] = (time.perf_counter() - started) / 60
        point["finetune_load"] = os.getloadavg()[0]
        point["finetune_precision"] = resolve_precision(args.precision, torch.device("cpu"))  # the trials run here
        write_json(path, point)
        medians = {t: round(s["median"], 1) for t, s in scores.items()}
        print(f"{name}: {medians}, signal {sum(medians.values()) / len(medians):.1f}")


def row_key(point: dict) -> str:
    """The run a point pretrained, its seed aside: the run params.yaml resolves now from the point's method, sets
    (but `pretrain.seed`) and steps. Points with one key are one row's pretraining seeds, whatever their candidate
    was called: a sweep's `same_piece_init_quarter` is the preset's `base` since the preset took up the prior."""
    from heldout_trace import resolve

    sets = [item for item in point["sets"] if not item.startswith("pretrain.seed=")]
    run, _, vocab_sets = resolve(point["method"], sets, point["steps"], every=1)  # checks' spacing: not the run
    return json.dumps([dataclasses.asdict(run), vocab_sets], sort_keys=True, default=str)


def compare(args) -> None:
    """Each row of --out's fine-tuned points (the points of one run, row_key, are its pretraining seeds; --with adds
    other folders' seeds of those runs, a seed counted once, --out's) against the row of each --against point, as
    report/claims.py checks a claim on STS-B, MRPC and CoLA: ours is the difference of the rows' scores (a row's:
    the median over its pretraining seeds of each seed's median over the fine-tuning seeds of the tasks' mean), the
    verdict Welch's two-sided t-test at claims.ALPHA with the pretraining seed as unit where a row has several
    (`nested_welch`). Its premise is the papers' direction: the row above the one it is compared with (every newer
    objective above ELECTRA in COCO-LM's, AMOS's and TEAMS's Table 1; every pretrained row above the control). The
    control's rows are only compared with."""
    from signal_sweep import SIGNAL_TASKS

    from electralab.report.claims import common_seeds, difference, scores, verdict

    tasks = list(SIGNAL_TASKS)
    empty = [folder for folder in args.with_ if not any((folder / "points").glob("*.json"))]
    if empty:
        sys.exit(f"error: --with {empty[0]}: no points in {empty[0] / 'points'}")
    points = [p for p in load_points(args.out) if "finetune" in p]
    named = {point_name(p["method"], p["candidate"], p["seed"]): p for p in points}
    missing = [name for name in args.against if name not in named]
    if missing:
        sys.exit(f"error: --against {missing[0]!r}: no fine-tuned point of that name in {args.out / 'points'}")
    labels: dict[str, str] = {}  # row_key -> method/candidate of its first point in --out
    seeds_of: dict[str, dict[int, dict]] = {}  # row_key -> {pretraining seed: point}
    for p in points:
        key = row_key(p)
        labels.setdefault(key, f"{p['method']}/{p['candidate']}")
        seeds_of.setdefault(key, {})[p["seed"]] = p
    for p in (p for folder in args.with_ for p in load_points(folder) if "finetune" in p):
        if (key := row_key(p)) in seeds_of:
            seeds_of[key].setdefault(p["seed"], p)

    def seed_scores(point: dict) -> dict[str, dict[int, float]]:
        return {t: {int(s): v for s, v in point["finetune"][t]["seeds"].items()} for t in SIGNAL_TASKS}

    print(
        "| row | pretraining seeds | each seed's score | than | ours | spread | ours / spread | p | verdict |\n"
        + "|---" * 9
        + "|"
    )
    for name in args.against:
        than = row_key(named[name])
        theirs = [seed_scores(p) for _, p in sorted(seeds_of[than].items())]
        for key in sorted(labels, key=lambda k: (not labels[k].startswith("electra/"), labels[k])):
            if key == than or labels[key].startswith("control/"):
                continue
            mine = [seed_scores(p) for _, p in sorted(seeds_of[key].items())]
            seeds = common_seeds(mine + theirs, tasks)
            ours, p_value, spread = difference(mine, theirs, seeds, tasks)
            each = ", ".join(f"{statistics.median(scores(s, tasks, seeds)):.1f}" for s in mine)
            print(
                f"| {labels[key]} | {', '.join(map(str, sorted(seeds_of[key])))} | {each} | "
                f"{labels[than]} ({len(theirs)}) | {ours:+.1f} | {spread:.1f} | {ours / spread:+.1f} | "
                f"{p_value:.3f} | {verdict(ours, p_value, published=1.0)} |"
            )


def pack(args) -> None:
    """What comes back from a machine without this checkout: every point in one archive, and the encoders of
    the `--best` finished points that left the base rate earliest (the base's first), one archive each."""
    import tarfile

    args.to.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.to / "points.tar.gz", "w:gz") as tar:
        tar.add(args.out / "points", arcname="points")
    points = [p for p in load_points(args.out) if not p.get("paused") and not p.get("error")]
    ranked = sorted(points, key=lambda p: (p["candidate"] != "base", left_at(p["trace"]) or 1e9))
    for p in ranked[: args.best]:
        name = point_name(p["method"], p["candidate"], p["seed"])
        with tarfile.open(args.to / f"{name}.tar", "w") as tar:
            tar.add(p["encoder"], arcname=f"{name}/encoder")
        print(f"packed {name} (left at {p['left_at']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the points not yet done")
    r.add_argument("--methods", nargs="+", default=["electra"])
    r.add_argument("--candidates", nargs="+", help="default: every candidate but the controls (none with --controls)")
    r.add_argument("--points", nargs="+", default=[], metavar="METHOD/CANDIDATE", help="more points, run after")
    r.add_argument("--controls", action="store_true", help="then the controlled runs (CONTROLS) and their main rows")
    r.add_argument("--seeds", nargs="+", type=int, default=[1])
    r.add_argument("--parallel", type=int, default=1, help="points at a time (one process each)")
    r.add_argument("--minutes", type=float, help="stop every point cleanly after this many minutes")
    pt = sub.add_parser("point", help="one point in this process (what run starts)")
    for p in (r, pt):
        p.add_argument("--steps", type=int, help=f"the schedule's steps (default {STEPS}; the preset's --at-preset)")
        p.add_argument(
            "--at-preset", action="store_true", help="the active preset's runs as they are, without SWEEP_BASE"
        )
        p.add_argument("--every", type=int, default=250, help="steps between held-out checks")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every point")
        p.add_argument("--data", type=Path, help="a folder with shards/ and vocab/ (default: the preset's, built)")
        p.add_argument("--stop-at", type=int, help="pause at this step of the loop (the schedule stays --steps')")
    pt.add_argument("--method", required=True)
    pt.add_argument("--candidate", required=True, choices=sorted(CANDIDATES))
    pt.add_argument("--seed", type=int, default=1)
    pt.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    pt.add_argument("--commit")
    sub.add_parser("table", help="the table of the points done")
    cv = sub.add_parser("curves", help="the points' detector gain against the tokens seen, as a PNG")
    cv.add_argument("--to", type=Path, required=True)
    pk = sub.add_parser("pack", help="the points and the best encoders into --to (what a GPU machine returns)")
    pk.add_argument("--to", type=Path, required=True)
    pk.add_argument("--best", type=int, default=6)
    cp = sub.add_parser("compare", help="the rows against --against's rows: holds, reversed or within noise")
    cp.add_argument("--against", nargs="+", required=True, metavar="POINT", help="e.g. electra-base-s1 (its row)")
    cp.add_argument(
        "--with", dest="with_", nargs="+", type=Path, default=[], metavar="FOLDER", help="more seeds of --out's rows"
    )
    f = sub.add_parser("finetune", help="fine-tune finished points' encoders (STS-B, MRPC, CoLA)")
    f.add_argument("points", nargs="+", help="point names, e.g. electra-pre_ln-s1")
    f.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    f.add_argument("--encoder", type=Path, help="the encoder's directory, where it is not the point's own")
    # fp32 by default: at this scale bf16 fine-tuning moved STS-B, a third of the signal, by up to 2.2x the seeds'
    # deviation (docs/findings.md, "Precision: bf16 against fp32"), and the points are compared across machines.
    f.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32", help="default: %(default)s")
    args = ap.parse_args()
    commands = {
        "run": run,
        "point": run_point,
        "table": table,
        "curves": curves,
        "finetune": finetune,
        "compare": compare,
        "pack": pack,
    }
    commands[args.command](args)


if __name__ == "__main__":
    main()
