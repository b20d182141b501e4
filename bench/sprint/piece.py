"""One command of the sprint: continue from the state, stop inside the time limit, hand the state back.

Order of work (what is done already is skipped; the first command does the first three):
1. the data: unpacked from the carry (a fresh machine) or reused;
2. throughput: a timed pretraining step of every method (probe.py), printed;
3. the no-pretraining control: its encoder (the initialisation) and its fine-tuning, which measures what
   every run's fine-tuning costs;
4. the plan (plan.py), printed: steps per method for equal GPU-seconds, and where each unit goes;
5. per method: pretraining, then its fine-tuning, if the unit fits in what is left of this command;
6. at the end of every command, the results table of the runs fine-tuned so far.
The state is saved and packed into $OUT after every step, so a command stopped from outside loses at
most the step it was in.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime, timezone
from pathlib import Path

from electralab.config import load_params
from electralab.errors import EXPECTED_ERRORS, TrainingFailed
from electralab.io import sha256_file
from electralab.tracking import RUNLOG_ENV, backend
from electralab.train.loop import Dist, choose_device, pretrain
from sprint import clock, table, work_dir
from sprint import plan as planning
from sprint import state as states
from sprint.bundle import data_config, ensure_data
from sprint.config import CONTROL, check_runs, load_config, sprint_params, sprint_run
from sprint.probe import probe, probe_table
from sprint.trials import Finetuner

GPU_WORKERS = 8
FINAL = ("done", "failed")  # a unit's statuses that no later command changes
PACK_EVERY = 30.0  # seconds between state packs while trials finish


def say(message: str) -> None:
    print(f"sprint: {message}", flush=True)


class Piece:
    def __init__(self, root: Path, out: Path | None, started: float):
        self.root, self.out, self.started, self.clock = root, out, started, clock()
        self.state = states.State(root)
        self.cfg = load_config(self.state.sprint)
        self.params = load_params(root / "params.yaml")
        check_runs(self.params, self.cfg)
        self.deadline = started + self.cfg.piece_seconds
        self.hard = self.deadline + self.cfg.grace_seconds
        self.log = {
            "piece": len(self.state.pieces) + 1,
            "units": [],
            "stopped": "",
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        self.state.pieces.append(self.log)
        self.finetuner: Finetuner | None = None
        self.saved = started
        # The tracked runs go into the state (they come back with it); the commit comes from the CPU side.
        os.environ.setdefault(RUNLOG_ENV, str(self.state.dir / "runlog"))
        if self.state.source.get("git_sha"):
            os.environ.setdefault("ELECTRALAB_GIT_SHA", self.state.source["git_sha"])

    def now(self) -> float:
        return self.clock()

    def save_now_and_then(self) -> None:
        """The state into $OUT again if the last time was PACK_EVERY ago: a command stopped from outside
        then loses at most that much of its finished trials."""
        if self.now() - self.saved >= PACK_EVERY:
            self.save()

    def save(self) -> None:
        self.saved = self.now()
        self.log["seconds"] = round(self.now() - self.started, 1)
        self.state.save()
        if self.out is not None:
            states.pack(self.state.dir, self.out)
            (self.out / "progress.md").write_text(self.progress(), encoding="utf-8")

    def progress(self) -> str:
        parts = [f"# Sprint progress ({len(self.state.pieces)} command(s))", ""]
        if self.state.probe:
            parts += ["## Throughput", "", probe_table(self.state.probe, self.cfg.methods)]
        if self.state.plan:
            parts += ["## Plan", "", planning.plan_table(self.state.plan)]
        parts += [
            "## Commands",
            "",
            "| # | started | seconds | fresh machine | units | stopped |",
            "|---|---|---|---|---|---|",
        ]
        parts += [
            f"| {p['piece']} | {p['started']} | {p.get('seconds', '')} | {p.get('fresh', '')} | "
            f"{', '.join(p['units'])} | {p['stopped']} |"
            for p in self.state.pieces
        ]
        return "\n".join(parts) + "\n"

    # --- the command ---------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.work()
            return 0
        except EXPECTED_ERRORS as error:
            self.log["stopped"] = f"error: {error}"
            print(f"error: {error}", flush=True)
            return 2
        except BaseException as error:
            self.log["stopped"] = f"{type(error).__name__}: {error}"
            raise
        finally:
            if self.finetuner is not None:  # idle by now, or an error left trials running: end them
                self.finetuner.close(kill=True)
            self.save()
            self.write_results()
            self.report()

    def work(self) -> None:
        cfg, params = self.cfg, self.params
        data, fresh = ensure_data(self.root, data_config(params, cfg.preset, cfg.tasks))
        self.data, self.log["fresh"] = data, fresh
        where = "unpacked the carried data (a fresh machine)" if fresh else "the data is here already"
        tracked = f"file ({os.environ[RUNLOG_ENV]})" if backend() == "file" else backend()
        say(f"command {self.log['piece']}: {where}; tracking: {tracked}")
        self.device = choose_device(sprint_run(params, cfg, CONTROL).pretrain, Dist())
        self.log["setup_s"] = round(self.now() - self.started, 1)
        say(f"device {self.device}; ready after {self.log['setup_s']} s")

        if not self.state.probe:
            for name in cfg.methods:
                self.state.probe[name] = probe(
                    sprint_run(params, cfg, name), data / "shards", cfg.probe_seconds, self.clock
                )
            self.save()
        say(
            "throughput (one pretraining step of each method, before anything trains):\n"
            + probe_table(self.state.probe, cfg.methods)
        )

        if not self.unit(CONTROL, steps=None):
            return
        if not self.state.plan:
            self.state.plan = self.make_plan()
            self.save()
        say("plan:\n" + planning.plan_table(self.state.plan))

        for name in cfg.methods:
            if self.state.units.get(name, {}).get("status") in FINAL:
                continue
            steps = self.state.plan["runs"][name]["steps"]
            need = (
                self.pretrain_left(name, steps)
                + self.state.plan["finetune_seconds"]
                + self.state.plan["unit_overhead_seconds"]
            )
            left = self.deadline - self.now() - cfg.piece_seconds * planning.MARGIN
            if self.log["units"] and left < need:  # a unit starts whole or in the next command (a fresh one)
                self.log["stopped"] = f"{name} needs about {need:.0f} s, {max(left, 0):.0f} s left"
                return
            try:
                if not self.unit(name, steps):
                    return
            except TrainingFailed as error:  # diverged or collapsed: a result too; the other units go on
                self.state.units[name].update(status="failed", error=str(error))
                say(f"{name}: failed: {error}")
                self.save()
        self.finish()

    def make_plan(self) -> dict:
        control = self.state.units[CONTROL]
        capacity = self.cfg.piece_seconds * (1 - planning.MARGIN) - self.log["setup_s"]
        left_now = self.deadline - self.now() - self.cfg.piece_seconds * planning.MARGIN
        overhead = control["pretrain_call_s"] + max(p.get("warmup_s", 0.0) for p in self.state.probe.values())
        later = max(0, self.cfg.pieces - self.log["piece"])
        return planning.make_plan(
            self.state.probe,
            self.cfg.methods,
            control["finetune_seconds"],
            overhead,
            left_now,
            later,
            capacity,
            self.cfg.pretrain_seconds,
            self.log["piece"],
        )

    def pretrain_left(self, name: str, steps: int) -> float:
        """Seconds of pretraining left: less when this machine holds the checkpoint of a paused run."""
        unit = self.state.units.get(name, {})
        seconds = steps * self.state.plan["runs"][name]["step_s"]
        if unit.get("status") == "paused" and (work_dir(self.root) / "checkpoints" / name / "state.pt").is_file():
            return seconds * (1 - unit["paused_at"] / steps)
        return seconds

    def unit(self, name: str, steps: int | None) -> bool:
        """Pretrain `name` (unless its encoder is here) and fine-tune it; whether it is done.

        A unit starts within the command's own budget; once started it may use the grace as well, since
        what it leaves unfinished is usually lost (the next command runs on a fresh machine): pretraining
        pauses only where its fine-tuning would no longer fit before the hard end, and no trial starts
        that would not finish by then (judged by the control's longest trial)."""
        run = sprint_run(self.params, self.cfg, name, steps)
        unit = self.state.units.setdefault(name, {"method": run.method, "status": "not started"})
        if unit["status"] == "done":
            return True
        models, scratch = work_dir(self.root) / "models" / name, work_dir(self.root) / "checkpoints" / name
        weights = models / "encoder" / "weights.pt"
        self.log["units"].append(name)
        if not (weights.is_file() and unit.get("encoder_sha256") == sha256_file(weights)):
            if unit.get("encoder_sha256"):
                say(f"{name}: its encoder is not on this machine (a fresh one): pretraining again")
            elif (scratch / "state.pt").is_file():
                say(f"{name}: resuming from its checkpoint")
            elif unit["status"] == "paused":
                say(f"{name}: its checkpoint is not on this machine (a fresh one): pretraining starts over")
            plan = self.state.plan or {}
            finetune = plan.get("finetune_seconds", 0.0) + plan.get("unit_overhead_seconds", 0.0)
            began = self.now()
            say(
                f"{name}: pretraining ({run.pretrain.steps:,} steps)"
                if run.method != "none"
                else f"{name}: the encoder as initialised (no pretraining)"
            )
            limit = (self.hard if plan else self.deadline) - finetune
            summary = pretrain(
                run,
                self.data / "shards",
                models,
                scratch,
                vocab_dir=self.data / "vocab",
                show_progress=False,
                stop=lambda step: self.now() >= limit,
            )
            if summary.get("paused"):
                unit.update(status="paused", paused_at=summary["steps"])
                self.log["stopped"] = f"{name} paused at step {summary['steps']} (deadline)"
                self.save()
                return False
            unit.update(
                status="fine-tuning",
                encoder_sha256=sha256_file(weights),
                pretrain_call_s=self.now() - began,
                pretrain_run_id=summary["mlflow_run_id"],
                pretrain={k: v for k, v in summary.items() if isinstance(v, (int, float))},
            )
            unit.pop("paused_at", None)
            self.save()
        began, tuner = self.now(), self.tuner()
        longest = self.state.units[CONTROL].get("longest_trial_s") if name != CONTROL else None
        soft = self.hard - 1.2 * longest if longest is not None else self.deadline
        done = tuner.run(
            run,
            models / "encoder",
            self.state.dir / "finetune" / name,
            soft,
            self.hard,
            self.save_now_and_then,
            unit.get("pretrain_run_id", ""),
        )
        unit["finetune_seconds"] = unit.get("finetune_seconds", 0.0) + self.now() - began
        unit["longest_trial_s"] = max(unit.get("longest_trial_s", 0.0), tuner.longest_trial_s)
        if done:
            unit["status"] = "done"
            say(f"{name}: done ({unit['finetune_seconds']:.0f} s of fine-tuning)")
        else:
            self.log["stopped"] = f"{name}'s fine-tuning reached the deadline"
        self.save()
        return done

    def tuner(self) -> Finetuner:
        """The fine-tuning data and workers, made when this command first fine-tunes (a command that only
        pretrains does not pay for tokenising the tasks)."""
        if self.finetuner is None:
            began, cfg = self.now(), self.cfg
            workers = cfg.workers or (GPU_WORKERS if self.device.type == "cuda" else 1)
            self.finetuner = Finetuner(
                sprint_params(self.params, cfg).active.finetune,
                self.data,
                self.data / "vocab",
                self.device,
                workers,
                self.clock,
            )
            say(
                f"fine-tuning: {len(cfg.tasks)} tasks tokenised in {self.now() - began:.1f} s; "
                f"{self.finetuner.trial_steps():,} optimizer steps per run's grid; {workers} worker(s)"
            )
        return self.finetuner

    def finish(self) -> None:
        self.log["stopped"] = "done"

    def write_results(self) -> None:
        """results.csv and results.md of the runs fine-tuned so far, at the end of every command: the first
        command's already sets its first method beside the control, whatever comes of the later ones."""
        if self.state.units.get(CONTROL, {}).get("status") not in FINAL:
            return
        state = self.state.as_dict()
        lines = table.rows(state)
        tasks = tuple(self.cfg.tasks)
        for directory in filter(None, (self.state.dir, self.out)):
            (directory / "results.csv").write_text(table.to_csv(lines, tasks), encoding="utf-8")
            (directory / "results.md").write_text(table.to_markdown(lines, state), encoding="utf-8")
        say("results so far:\n" + table.to_markdown(lines, state))

    def report(self) -> None:
        left = [n for n in (CONTROL, *self.cfg.methods) if self.state.units.get(n, {}).get("status") not in FINAL]
        say(f"command {self.log['piece']} ended after {self.log['seconds']} s: {self.log['stopped'] or 'stopped'}")
        if not left:
            say("all done: results.csv and results.md are in $OUT and .sprint/state")
        else:
            say(
                f"left: {', '.join(left)}; restore the state (python bench/gpu_sprint.py restore <the returned "
                f"folder>) and run the same command again"
            )


def run_piece(root: Path, out: Path | None, started: float, workers: int | None = None) -> int:
    piece = Piece(root, out, started)
    if workers is not None:  # how many trials at a time changes the speed, not the results
        piece.cfg = dataclasses.replace(piece.cfg, workers=workers)
    return piece.run()
