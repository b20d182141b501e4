"""Fine-tune one pretraining run on GLUE and SQuAD 2.0 with the preset's grid: the papers' protocol.

    summary = finetune(run, params.active.finetune, Path("models/cocolm"), Path("checkpoints/finetune/cocolm"),
                       data_root())       # -> metrics/finetune/<run>.json

1. Plan the groups (one MLflow parent each): every task of `tasks` on the final encoder with all labels;
   runs of an efficiency figure of the table registry (electralab.tables: COCO-LM Fig. 3, AMOS Fig. 4) add
   `efficiency_tasks` on each pretraining fraction checkpoint (models/<run>/fractions/<pct>/encoder), runs
   of a few-shot figure (COCO-LM Fig. 7) add `few_shot_tasks` on each of `few_shot_fractions` of the
   training labels.
2. Read and tokenise each task once (the run's own vocabulary); a missing split stops the stage before any
   trial, unless it is a known gap of the offline mirror (QQP dev) or allowed (ELECTRALAB_ALLOW_MISSING=1):
   then the task is recorded as missing, with the reason.
3. Phase 1 on Ray Tune: every configuration x seed of the main groups. Per group, the median over the
   seeds per configuration; the best median of the main metric wins.
4. Phase 2: the extras with the configuration phase 1 selected for their task (extras_grid: selected)
   or with the whole grid (extras_grid: grid, then they run in phase 1 already).
5. MLflow: a child per trial as it finishes, the parent's medians and spread when its group is done.

Finished trials are kept in `scratch_dir` (checkpoints/finetune/<run>/, outside DVC's outputs): a
re-run after an interruption runs only what is left, and the metrics' `seconds` count every command's
time (StageClock). The scratch is removed when everything succeeded.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from electralab.config import FinetuneConfig, to_dict
from electralab.data.progress import progress_bar
from electralab.data.vocab import Tokenizer
from electralab.errors import ConfigError, DataError, TrialsFailed
from electralab.finetune.data import TaskData, prepare
from electralab.finetune.grid import FINAL, Group, HParams, ResultStore, Selection, TrialSpec, configurations, select
from electralab.finetune.metrics import glue_average
from electralab.finetune.tasks import TASKS, MissingSplit
from electralab.finetune.track import FinetuneTracker
from electralab.finetune.trial import TrialSettings
from electralab.io import fingerprint, read_json, sha256_file, source_digest, write_json
from electralab.runs import ResolvedRun
from electralab.tables import in_efficiency_figure, in_few_shot_figure
from electralab.tracking import finite


class StageClock:
    """The stage's seconds over every command that worked on its grid, the metrics' `seconds` (make repro's time
    left and docs/operations.md's times read them): a grid stopped and run again counts its earlier commands too,
    a grid of other inputs (its trials stale) does not. Kept in the scratch directory at each finished trial, so
    a crash loses only the time since the last one."""

    def __init__(self, path: Path):
        self.path, self.started, self.grid = path, time.perf_counter(), ""
        try:
            kept = read_json(path)
            self.earlier, self.kept_grid = float(kept["seconds"]), str(kept["grid"])
        except (OSError, ValueError, KeyError, TypeError):  # none yet (the first command), or unreadable
            self.earlier, self.kept_grid = 0.0, ""

    def of_grid(self, grid: str) -> None:
        """The grid this command works on (its trials' fingerprints): the earlier time counts only if the same."""
        self.grid = grid
        if grid != self.kept_grid:
            self.earlier = 0.0

    def seconds(self) -> float:
        return self.earlier + time.perf_counter() - self.started

    def save(self) -> None:
        write_json(self.path, {"seconds": round(self.seconds(), 1), "grid": self.grid})


@dataclass
class Plan:
    groups: list[Group]  # main groups first, then the extras
    encoders: dict[str, Path]  # checkpoint -> encoder directory
    hours: dict[str, dict[str, float]] = field(default_factory=dict)  # checkpoint -> wall/device hours
    missing: dict[str, str] = field(default_factory=dict)  # group key -> why it cannot run
    known_gaps: set[str] = field(default_factory=set)  # of those, the offline mirror's known gaps
    pretrain_run_id: str = ""  # the MLflow run that made model_dir

    @staticmethod
    def is_extra(group: Group) -> bool:
        return group.checkpoint != FINAL or group.label_fraction != 1.0


def plan(run: ResolvedRun, cfg: FinetuneConfig, model_dir: Path) -> Plan:
    encoder = model_dir / "encoder"
    if not (encoder / "config.json").is_file():
        raise DataError(f"{encoder}: no exported encoder; run the pretraining first (dvc repro pretrain@{run.name})")
    out = Plan([Group(task) for task in cfg.tasks], {FINAL: encoder})
    summary = model_dir / "summary.json"
    if summary.is_file():
        made = read_json(summary)
        out.hours[FINAL] = {k: v for k, v in made.items() if k in ("wall_hours", "device_hours")}
        out.pretrain_run_id = str(made.get("mlflow_run_id", ""))
    extras: list[Group] = []
    if in_efficiency_figure(run.name):
        fractions = sorted(p for p in (model_dir / "fractions").glob("*") if (p / "meta.json").is_file())
        for directory in fractions:
            meta = read_json(directory / "meta.json")
            if meta.get("fraction", 0) >= 1.0:
                continue  # the end of pretraining is the `final` encoder itself
            out.encoders[directory.name] = directory / "encoder"
            out.hours[directory.name] = {k: meta[k] for k in ("wall_hours", "device_hours") if k in meta}
            extras += [Group(task, checkpoint=directory.name) for task in cfg.efficiency_tasks]
        if not fractions:
            for task in cfg.efficiency_tasks:
                out.missing[f"{task}@checkpoints"] = (
                    f"no pretraining fraction checkpoints in models/{run.name}/fractions "
                    f"(presets.<preset>.pretrain.checkpoint_fractions)"
                )
    if in_few_shot_figure(run.name):
        extras += [
            Group(task, label_fraction=f) for task in cfg.few_shot_tasks for f in cfg.few_shot_fractions if f < 1
        ]
    if cfg.extras_grid == "selected":
        orphans = sorted({g.task for g in extras} - set(cfg.tasks))
        if orphans:
            raise ConfigError(
                f"finetune.extras_grid=selected fine-tunes the extras with the configuration selected "
                f"for their task, but {orphans[0]!r} is not in finetune.tasks; add it or use extras_grid=grid"
            )
    out.groups += extras
    return out


def load_data(
    the_plan: Plan, cfg: FinetuneConfig, tokenizer: Tokenizer, data_root: Path | None
) -> dict[tuple[str, float], TaskData]:
    """Each task read and tokenised once, for every label fraction its groups use; a task with a
    missing split marks its groups missing in the plan."""
    fractions: dict[str, set[float]] = {}
    for group in the_plan.groups:
        fractions.setdefault(group.task, set()).add(group.label_fraction)
    data: dict[tuple[str, float], TaskData] = {}
    for task, wanted in fractions.items():
        try:
            for fraction, prepared in prepare(TASKS[task], tokenizer, cfg, data_root, sorted(wanted)).items():
                data[(task, fraction)] = prepared
        except MissingSplit as e:
            keys = [g.key for g in the_plan.groups if g.task == task]
            the_plan.missing.update({key: str(e) for key in keys})
            if e.known_gap:
                the_plan.known_gaps.update(keys)
    return data


def check_missing(run: ResolvedRun, the_plan: Plan, allow_missing: bool) -> None:
    """Refuse to start when a requested group cannot run, other than the offline mirror's known gaps: a
    stage that exits 0 would hide it from `dvc repro`, the flow and the report's reader."""
    unexpected = {k: why for k, why in the_plan.missing.items() if k not in the_plan.known_gaps}
    if unexpected and not allow_missing:
        listed = "; ".join(f"{k}: {why}" for k, why in sorted(unexpected.items()))
        raise DataError(
            f"finetune {run.name}: {len(unexpected)} requested task(s) cannot run ({listed}); fix the "
            f"data, or set ELECTRALAB_ALLOW_MISSING=1 to record them as missing and fine-tune the rest"
        )


class GridRun:
    """The trials of one run's groups: which to run, what they gave, the selections, MLflow."""

    def __init__(
        self,
        run: ResolvedRun,
        cfg: FinetuneConfig,
        the_plan: Plan,
        data: dict[tuple[str, float], TaskData],
        scratch_dir: Path,
        clock: StageClock,
        show_progress: bool,
        purpose: str = "",
    ):
        self.run, self.cfg, self.plan, self.data, self.scratch_dir = run, cfg, the_plan, data, scratch_dir
        self.clock = clock
        self.settings = TrialSettings.of(cfg)
        weights = {ckpt: sha256_file(d / "weights.pt") for ckpt, d in the_plan.encoders.items()}
        # What a finished trial depended on: a result with another fingerprint is stale. The library's source
        # is one input: a grid interrupted, then resumed after a code change, must not mix trials of both.
        code = source_digest()
        self.fingerprints = {
            g: fingerprint(
                g.key,
                weights[g.checkpoint],
                data[(g.task, g.label_fraction)].fingerprint,
                asdict(self.settings),
                cfg.max_seq_len,
                code,
            )
            for g in self.runnable
        }
        self.clock.of_grid(fingerprint(sorted(self.fingerprints.values())))
        self.store = ResultStore(scratch_dir / "results")
        self.tracker = FinetuneTracker(
            run, cfg.seeds, scratch_dir / "parents.json", the_plan.pretrain_run_id, purpose=purpose
        )
        self.selections: dict[Group, Selection] = {}
        self.resumed = 0
        self.trial_seconds = 0.0  # the trials' own time (model to last evaluation) of those run now
        # Every trial of both phases counted up front (the extras run the one selected configuration).
        total = sum(
            len(self.cfg.seeds) * (1 if self.uses_selection(g) else len(self.grid_of(g))) for g in self.runnable
        )
        self.bar = progress_bar(
            total=total, desc=f"finetune {run.name}", unit="trial", disable=not show_progress, dynamic_ncols=True
        )
        self.settings_params = {
            k: v
            for k, v in to_dict(cfg).items()
            if k
            in (
                "max_seq_len",
                "max_train_examples",
                "train_caps",
                "max_eval_examples",
                "adam_betas",
                "adam_eps",
                "weight_decay",
                "clip_norm",
                "group_by_length",
                "squad",
            )
        }

    @property
    def runnable(self) -> list[Group]:
        return [g for g in self.plan.groups if g.key not in self.plan.missing]

    def uses_selection(self, group: Group) -> bool:
        return Plan.is_extra(group) and self.cfg.extras_grid == "selected"

    def grid_of(self, group: Group) -> list[HParams]:
        if self.uses_selection(group):
            return [self.selections[Group(group.task)].best]
        return configurations(self.cfg.search_space(TASKS[group.task]))

    def trial_work(self, spec: TrialSpec) -> int:
        evaluations = spec.hparams.epochs if self.settings.eval_every_epoch else 1
        return self.data[(spec.group.task, spec.group.label_fraction)].trial_work(spec.hparams.epochs, evaluations)

    def run_phase(self, groups: list[Group], phase: int, trainable_fn: Callable | None) -> None:
        """Every configuration x seed of `groups` (finished ones from the store), then each group's selection."""
        from electralab.finetune.tuning import run_trials  # imports Ray

        specs = [TrialSpec(g, hp, seed) for g in groups for hp in self.grid_of(g) for seed in self.cfg.seeds]
        finals: dict[TrialSpec, dict[str, float]] = {}

        def record(spec: TrialSpec, result: dict) -> None:
            task = TASKS[spec.group.task]
            parent = self.tracker.parent(spec.group, task, self.fingerprints[spec.group])
            if result.get("mlflow_parent") != parent:  # not logged under this parent yet
                result |= {"mlflow_child": self.tracker.trial(spec, parent, result), "mlflow_parent": parent}
                self.store.put(spec, result)
            last = result["history"][-1]
            finals[spec] = {m: last[m] for m in task.metrics if m in last}
            self.bar.update(1)

        def on_complete(spec: TrialSpec, history: list[dict]) -> None:
            result = {"fingerprint": self.fingerprints[spec.group], "history": history}
            self.store.put(spec, result)  # first: a finished trial is never run again
            self.trial_seconds += result["history"][-1].get("seconds", 0.0)
            self.clock.save()
            record(spec, result)

        todo = []
        for spec in specs:
            done = self.store.get(spec, self.fingerprints[spec.group])
            if done is None:
                todo.append(spec)
            else:
                self.resumed += 1
                record(spec, done)
        # Longest first (LPT): the trials that finish last are short ones, so no worker idles while one long
        # trial runs alone (in the group order, the five 10-epoch STS-B trials ended the grid, one of them
        # alone for a minute).
        todo.sort(key=self.trial_work, reverse=True)
        keys = {(s.group.task, s.group.label_fraction) for s in todo}
        errors = run_trials(
            todo,
            {k: self.data[k] for k in keys},
            self.plan.encoders,
            self.settings,
            self.cfg.resources,
            self.cfg.max_failures,
            self.scratch_dir / "tune",
            f"{self.run.name}-phase{phase}",
            on_complete,
            trainable_fn,
        )
        unfinished = [s for s in specs if s not in finals]
        if errors or unfinished:  # a failed trial, or Tune stopped early (Ctrl-C): never select on part of a grid
            why = (
                f"{len(errors)} trial(s) failed after {self.cfg.max_failures} retries, e.g. {errors[0][0]}: "
                f"{errors[0][1]}"
                if errors
                else f"{len(unfinished)} trial(s) did not finish, e.g. {unfinished[0].key}"
            )
            raise TrialsFailed(
                f"finetune {self.run.name}: {why}; the {len(finals)} finished trials are kept in "
                f"{self.scratch_dir} and a re-run resumes from there"
            )
        for group in groups:
            self.finish(group, {s: m for s, m in finals.items() if s.group == group})

    def finish(self, group: Group, finals: dict[TrialSpec, dict[str, float]]) -> None:
        """The group's selection, and its parent run completed."""
        task = TASKS[group.task]
        self.selections[group] = select(finals, self.grid_of(group), task.main_metric)
        d = self.data[(group.task, group.label_fraction)]
        metrics = {
            **d.counts,
            **self.plan.hours.get(group.checkpoint, {}),
            "configurations": len(self.grid_of(group)),
            "trials": len(finals),
        }
        grid = (
            "the configuration selected on the final checkpoint"
            if self.uses_selection(group)
            else asdict(self.cfg.search_space(task))
        )
        params = {
            "grid": grid,
            "data": d.sources,
            "encoder": str(self.plan.encoders[group.checkpoint]),
            "finetune": self.settings_params,
        }
        self.tracker.finish(
            self.tracker.parent(group, task, self.fingerprints[group]), self.selections[group], metrics, params
        )


def finetune(
    run: ResolvedRun,
    cfg: FinetuneConfig,
    model_dir: Path,
    scratch_dir: Path,
    data_root: Path | None,
    *,
    trainable_fn: Callable | None = None,
    show_progress: bool = True,
    allow_missing: bool = False,
    purpose: str = "",
) -> dict:
    """Fine-tune and evaluate `run` (see the module docstring); returns the metrics file's content.
    `trainable_fn` replaces the Tune trainable (tests inject failures with it). A requested task whose data
    is missing stops it before any trial, unless a known gap of the mirror or `allow_missing`. `purpose` tags
    the MLflow parents of a fine-tuning the report's latest-of-each reading must skip (tracking.PURPOSE_TAG)."""
    from electralab.finetune.tuning import ray_session  # imports Ray

    model_dir, scratch_dir = Path(model_dir).resolve(), Path(scratch_dir).resolve()
    clock = StageClock(scratch_dir / "seconds.json")  # this command's start, and the earlier commands' time
    the_plan = plan(run, cfg, model_dir)
    seconds = {"data": 0.0, "Ray start": 0.0}  # both counted from the start: they run side by side

    def prepare_grid() -> GridRun:
        data = load_data(the_plan, cfg, Tokenizer(model_dir / "encoder"), data_root)
        check_missing(run, the_plan, allow_missing)
        grid = GridRun(run, cfg, the_plan, data, scratch_dir, clock, show_progress, purpose)
        seconds["data"] = time.perf_counter() - clock.started
        return grid

    # A local Ray takes about 4 s to start, most of it waiting on its own processes: the driver tokenises
    # the tasks and opens MLflow meanwhile, in a thread (docs/performance.md, "A stage's fixed cost").
    with ThreadPoolExecutor(max_workers=1) as pool:
        preparing = pool.submit(prepare_grid)
        with ray_session(cfg.resources):
            seconds["Ray start"] = time.perf_counter() - clock.started
            grid = preparing.result()  # bad data or a missing task stops the stage here, before any trial
            try:
                first = [g for g in grid.runnable if not grid.uses_selection(g)]
                for phase, groups in ((1, first), (2, [g for g in grid.runnable if g not in first])):
                    begin = time.perf_counter()
                    grid.run_phase(groups, phase, trainable_fn)
                    seconds[f"phase {phase}"] = time.perf_counter() - begin
                parents = {g.key: grid.tracker.parents[g.key]["run_id"] for g in grid.selections}
                for group in the_plan.groups:
                    if group.key in the_plan.missing:
                        parents[group.key] = grid.tracker.missing(group, TASKS[group.task], the_plan.missing[group.key])
            except BaseException as error:
                grid.bar.close()
                grid.tracker.fail(error)
                raise
    grid.bar.close()
    shutil.rmtree(scratch_dir, ignore_errors=True)
    summary = summarize(grid.selections, the_plan.missing, clock.seconds())
    # Which MLflow runs these numbers are, and of which pretraining run: the report reads only those.
    summary["mlflow"] = {"pretrain_run_id": the_plan.pretrain_run_id, "parents": dict(sorted(parents.items()))}
    parts = ({"earlier commands": clock.earlier} if clock.earlier else {}) | seconds
    print(
        f"finetune {run.name}: {summary['trials']} trials ({grid.resumed} from an earlier run) of "
        f"{len(grid.selections)} groups in {summary['seconds']:.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in parts.items())
        + f"; the trials' own time {grid.trial_seconds:.1f} s); missing: {', '.join(the_plan.missing) or 'none'}"
    )
    return summary


def summarize(selections: dict[Group, Selection], missing: dict[str, str], seconds: float) -> dict:
    """metrics/finetune/<run>.json: {task: {metric: median}} of the final checkpoint with all labels, the
    GLUE average (when all eight tasks have it), the extras under `checkpoints` / `label_fractions`,
    and the missing groups with their reason."""
    out: dict = {}
    for group, selection in selections.items():
        medians = {
            k.removeprefix("median_"): v if finite(v) else None
            for k, v in selection.stats.items()
            if k.startswith("median_")
        }
        if not Plan.is_extra(group):
            out[group.task] = medians
        elif group.checkpoint != FINAL:
            out.setdefault("checkpoints", {}).setdefault(group.checkpoint, {})[group.task] = medians
        else:
            out.setdefault("label_fractions", {}).setdefault(f"{group.label_fraction:g}", {})[group.task] = medians
    average = glue_average({task: v for task, v in out.items() if task in TASKS})
    if average is not None:
        out["glue_avg"] = average
    if missing:
        out["missing"] = dict(sorted(missing.items()))
    out["trials"] = sum(int(s.medians["seeds"].sum()) for s in selections.values())
    out["seconds"] = round(seconds, 1)
    return out


__all__ = ["GridRun", "Plan", "finetune", "load_data", "plan", "summarize"]
