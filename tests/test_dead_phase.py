"""bench/dead_phase.py, the dead-phase sweep: where a trace says the detector left its base rate, and one point
run end to end at the smallest size (resumable: a point with a file is not run again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import dead_phase  # noqa: E402

from electralab.config import load_params  # noqa: E402
from electralab.runs import resolve_run  # noqa: E402


def gains(*values, key="rtd_base_rate_gain"):
    return {str(250 * i): {key: v} for i, v in enumerate(values)}


@pytest.mark.parametrize("candidate, method", [(c, m) for c, ms in dead_phase.CONTROLS.items() for m in ms])
def test_each_controlled_run_changes_its_methods_main_row_in_that_choice_alone(candidate, method):
    import heldout_trace

    base, _, _ = heldout_trace.resolve(method, [], dead_phase.STEPS, 250)
    run, _, _ = heldout_trace.resolve(method, dead_phase.CANDIDATES[candidate](dead_phase.STEPS), dead_phase.STEPS, 250)
    assert run.pretrain == base.pretrain  # the same schedule, batch and seed
    changed = [part for part in ("settings", "model", "generators") if getattr(run, part) != getattr(base, part)]
    assert len(changed) == 1, changed


def test_the_controls_run_on_their_own_methods_after_those_methods_main_rows():
    wanted = dead_phase.wanted_points(["electra"], None, [], [1], controls=True)
    assert wanted[:4] == [("electra", "base", 1), ("teams", "base", 1), ("cocolm", "base", 1), ("amos", "base", 1)]
    assert ("cocolm", "no_scl", 1) in wanted and ("electra", "no_scl", 1) not in wanted
    assert len(wanted) == 4 + sum(len(ms) for ms in dead_phase.CONTROLS.values())
    plain = dead_phase.wanted_points(["electra"], None, [], [1], controls=False)  # no control on another method
    assert ("electra", "base", 1) in plain and not {c for _, c, _ in plain} & set(dead_phase.CONTROLS)


def test_left_for_good_is_after_the_last_dip_and_first_is_the_shortcut():
    trace = gains(-0.01, 0.05, 0.01, 0.006, 0.03, 0.04, 0.09)  # an early shortcut that fades, then the real exit
    assert dead_phase.first_at(trace) == 250
    assert dead_phase.left_at(trace) == 1000
    assert dead_phase.left_at(gains(0.0, 0.01, 0.03, 0.01)) is None  # it fell back at the last check
    assert dead_phase.left_at(gains(0.5)) is None  # the check at initialisation never counts
    copy = gains(0.0, 0.001, 0.02, key="copy_base_rate_gain")  # COCO-LM's detector is its copy head
    assert dead_phase.left_at(copy) == dead_phase.first_at(copy) == 500
    assert dead_phase.left_at({"250": {"mlm_acc": 0.3}}) is None  # MLM has no detector


def test_a_detector_below_the_unigram_tasks_base_rate_has_not_left_it():
    unigram = (0.0, -0.1, -0.2, 0.05)  # it calls rare words replaced, then, from step 750, reads context
    trace = {str(250 * i): {"rtd_base_rate_gain": 0.15, "detector_unigram_gain": u} for i, u in enumerate(unigram)}
    assert dead_phase.first_at(trace) == 250 and dead_phase.left_at(trace) == 750
    del trace["750"]
    assert dead_phase.left_at(trace) is None


def test_every_candidate_is_a_list_of_sets_and_warmups_follow_the_budget():
    for name, sets in dead_phase.CANDIDATES.items():
        assert all("=" in item for item in sets(8000)), name
    assert dead_phase.CANDIDATES["warmup_2pct"](8000) == ["pretrain.warmup_steps=160"]
    assert dead_phase.CANDIDATES["warmup_2pct"](1000) == ["pretrain.warmup_steps=20"]
    assert dead_phase.CANDIDATES["batch_8"](8000) == ["pretrain.batch_size=8", "pretrain.micro_batch_size=8"]
    assert dead_phase.point_sets("electra", "short_32_25pct", 8000, ["pretrain.use_gpu=true"], 2) == (
        [
            *dead_phase.SWEEP_BASE["main"],
            *["pretrain.short_seq_len=32", "pretrain.short_seq_until=0.25", "pretrain.use_gpu=true", "pretrain.seed=2"],
        ],
        8000,
    )
    # the base's tokens, twice the steps
    sets, steps = dead_phase.point_sets("electra", "batch_16_steps_2x", 8000, [], 1)
    assert steps == 16000 and sets == [
        *dead_phase.SWEEP_BASE["main"],
        *["pretrain.batch_size=16", "pretrain.micro_batch_size=16", "pretrain.seed=1"],
    ]
    # the prior's candidates set it on top of the sweep's base, which has it off
    sets, _ = dead_phase.point_sets("electra", "same_piece_init", 8000, [], 1)
    assert sets.index("model.same_piece_init=null") < sets.index("model.same_piece_init=4.0")
    # the ablation shape's sweep ran at lr 3e-4; a --set comes after it
    sets, _ = dead_phase.point_sets("electra_ablation", "base", 700, ["pretrain.lr=1e-3"], 1)
    assert sets.index("pretrain.lr=3e-4") < sets.index("pretrain.lr=1e-3")
    # without --steps: the sweep's STEPS, or --at-preset the preset's run as it is, at its budget's steps
    assert dead_phase.point_sets("electra", "base", None, [], 1)[1] == dead_phase.STEPS
    params = load_params(ROOT / "params.yaml")
    for method in ("electra", "electra_ablation"):
        sets, steps = dead_phase.point_sets(method, "linear_head", None, [], 3, at_preset=True)
        assert sets == ["model.detector_head=linear", "pretrain.seed=3"]
        assert steps == resolve_run(params, method).pretrain.steps
    assert dead_phase.point_sets("electra", "half", 2000, [], 1, at_preset=True) == (["pretrain.seed=1"], 1000)


def test_an_unknown_run_is_named_before_any_point_starts(tmp_path):
    for args in (["run", "--methods", "electra", "elektra"], ["point", "--method", "elektra", "--candidate", "base"]):
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "dead_phase.py"), "--out", str(tmp_path / "out"), *args],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1
        assert "params.yaml has no run 'elektra'" in done.stderr and "electra_ablation" in done.stderr
        assert not (tmp_path / "out").exists()


def test_a_fine_tuned_point_shows_its_signal_and_the_others_a_dash():
    scores = {"stsb": (70.0, [70.0, 71.0, 69.0]), "mrpc": (71.0, [71.0, 70.0, 72.0]), "cola": (0.0, [0.0, 0.0, 0.0])}
    finetune = {t: {"median": m, "seeds": dict(enumerate(v, 1))} for t, (m, v) in scores.items()}
    point = {"finetune": finetune, "precision": "fp32"}
    assert dead_phase.finetuned(point) == "47.0 (70.0, 71.0, 0.0; 3 seeds)"  # fine-tuned where it was pretrained
    assert dead_phase.finetuned({**point, "finetune_precision": "fp32"}) == "47.0 (70.0, 71.0, 0.0; 3 seeds)"
    mixed = {**point, "finetune_precision": "bf16"}  # e.g. pretrained on a CPU without bf16, fine-tuned on one with
    assert dead_phase.finetuned(mixed) == "47.0 (70.0, 71.0, 0.0; 3 seeds, fine-tuned in bf16)"
    assert dead_phase.finetuned({"trace": {}}) == "-"


def sweep(*args, out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dead_phase.py"), "--out", str(out), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def test_the_curves_draw_each_points_detector_gain_against_the_tokens_a_panel_per_method(tmp_path):
    import argparse

    import matplotlib.pyplot as plt

    points = {
        "electra-base-s1": ("electra", "base", [], gains(0.0, 0.01, 0.05)),
        "electra-batch_64-s1": ("electra", "batch_64", ["pretrain.batch_size=64"], gains(0.0, 0.03, 0.1)),
        "cocolm-base-s1": ("cocolm", "base", [], gains(0.0, 0.02, 0.04, key="copy_base_rate_gain")),
    }
    (tmp_path / "points").mkdir()
    for name, (method, candidate, sets, trace) in points.items():
        record = {
            "method": method,
            "candidate": candidate,
            "seed": 1,
            "sets": sets,
            "trace": trace,
            "precision": "bf16",
        }
        (tmp_path / "points" / f"{name}.json").write_text(json.dumps(record))
    dead_phase.curves(argparse.Namespace(out=tmp_path, to=tmp_path / "figure" / "curves.png"))
    assert (tmp_path / "figure" / "curves.png").read_bytes().startswith(b"\x89PNG")
    electra, cocolm = plt.gcf().axes
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in electra.get_lines()}
    tokens = 32 * 128 / 1e6  # the tiny preset's batch x sequence, in millions, a step
    assert drawn["base s1 (bf16)"] == ([250 * tokens, 500 * tokens], [0.01, 0.05])  # step 0 is not drawn
    assert drawn["batch_64 s1 (bf16)"][0] == [250 * 2 * tokens, 500 * 2 * tokens]  # its own batch
    assert [line.get_label() for line in cocolm.get_lines()] == ["base s1 (bf16)", "the guard's 0.02"]
    plt.close("all")
    with pytest.raises(SystemExit, match="no point with a detector's trace"):
        dead_phase.curves(argparse.Namespace(out=tmp_path / "none", to=tmp_path / "x.png"))


def test_unknown_candidates_and_points_are_named_before_anything_runs(tmp_path):
    bad = sweep("run", "--candidates", "pre_ln", "nope", out=tmp_path)
    assert bad.returncode != 0 and "nope" in bad.stderr and not (tmp_path / "points").exists()
    bad = sweep("run", "--candidates", "base", "--points", "electra-pre_ln", out=tmp_path)
    assert bad.returncode != 0 and "electra-pre_ln" in bad.stderr and "METHOD/CANDIDATE" in bad.stderr


@pytest.mark.slow
def test_a_point_runs_records_its_trace_and_is_not_run_again(tmp_path, shards_dir, vocab_dir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "shards").symlink_to(shards_dir)
    (data / "vocab").symlink_to(vocab_dir)
    small = ["--set", "model={hidden: 16, layers: 2, heads: 1, ffn: 32, embedding: 16}"]
    small += ["--set", "generators.electra={hidden: 16, heads: 1, ffn: 32}", "--set", "pretrain.micro_batch_size=4"]
    small += ["--set", "pretrain.batch_size=4"]
    args = ["run", "--candidates", "pre_ln", "--steps", "6", "--every", "3", "--data", str(data), *small]
    for stop_at in (2, 4):  # --stop-at is the loop's step: the resumed point pauses at 4, not 2 + 4 steps
        paused = sweep(*args, "--stop-at", str(stop_at), out=tmp_path / "sweep")
        assert paused.returncode == 0, paused.stderr[-2000:]
        point = json.loads((tmp_path / "sweep" / "points" / "electra-pre_ln-s1.json").read_text())
        assert point["paused"] and point["stopped_at"] == stop_at and f"(stopped at {stop_at})" in paused.stdout
    again = sweep(*args, "--stop-at", "4", out=tmp_path / "sweep")
    assert again.returncode == 0 and "1 of 1 points done; 0 to run" in again.stdout
    first = sweep(*args, out=tmp_path / "sweep")  # without --stop-at: on to the end
    assert first.returncode == 0, first.stderr[-2000:]
    point = json.loads((tmp_path / "sweep" / "points" / "electra-pre_ln-s1.json").read_text())
    base = dead_phase.SWEEP_BASE["main"]
    assert point["sets"][: len(base) + 1] == [*base, "model.norm=pre"] and point["steps"] == 6 and not point["paused"]
    assert sorted(map(int, point["trace"])) == [0, 3, 6] and "rtd_base_rate_gain" in point["trace"]["6"]
    assert point["precision"] in ("fp32", "bf16") and point["commit"]
    assert "| electra | pre_ln | 1 |" in first.stdout
    again = sweep(*args, out=tmp_path / "sweep")
    assert again.returncode == 0 and "1 of 1 points done; 0 to run" in again.stdout


def docs_block(page: str, marker: str) -> str:
    """What docs/<page> shows between `<!-- marker -->` and `<!-- end marker -->`."""
    text = (ROOT / "docs" / page).read_text()
    return text.split(f"<!-- {marker} -->\n", 1)[1].split(f"\n<!-- end {marker} -->", 1)[0]


@pytest.mark.parametrize(
    "folder, page, marker",
    [
        ("dead_phase", "findings.md", "dead_phase table"),
        ("dead_phase_signal", "findings.md", "signal table"),
        ("controlled", "reproducing.md", "controlled table"),
        ("controlled_preset", "reproducing.md", "controlled_preset table"),
    ],
)
def test_the_docs_show_the_committed_points_as_the_bench_renders_them(capsys, folder, page, marker):
    import argparse

    dead_phase.table(argparse.Namespace(out=ROOT / "results" / folder))
    rendered = capsys.readouterr().out.strip()
    shown = docs_block(page, marker)
    assert shown.strip() == rendered, f"docs/{page}: run `python bench/dead_phase.py --out results/{folder} table`"
    assert (
        rendered.count("\n| electra |")
        >= {"dead_phase": 16, "dead_phase_signal": 2, "controlled": 1, "controlled_preset": 2}[folder]
    )


def test_the_trace_reads_the_run_that_trained_the_encoder_not_an_attempt_killed_before_it(tmp_path):
    import heldout_trace

    from electralab.runlog import FileClient

    client = FileClient(tmp_path)
    killed = client.create_run("electralab-tiny", "electra-base-s1").info.run_id
    client.log_metrics(killed, {"heldout_rtd_base_rate_gain": 0.5, "loss": 9.0}, step=100)
    client.set_terminated(killed, "KILLED")
    time.sleep(0.01)  # the log orders runs by their start, in milliseconds (real attempts are minutes apart)
    trained = client.create_run("electralab-tiny", "electra-base-s1").info.run_id  # again from step 0
    for step, gain in ((200, 0.03), (100, 0.01)):
        client.log_metrics(trained, {"heldout_rtd_base_rate_gain": gain, "loss": 8.0}, step=step)
    assert heldout_trace.held_out(tmp_path) == {100: {"rtd_base_rate_gain": 0.01}, 200: {"rtd_base_rate_gain": 0.03}}


def fine_tuned_point(folder: Path, method: str, candidate: str, seed: int, sets: list[str], level: float) -> None:
    """A point file as `finetune` leaves it: five fine-tuning seeds of STS-B, MRPC and CoLA around `level`."""
    wobble = [0.0, 0.3, -0.3, 0.6, -0.6]
    values = {str(s): level + wobble[s - 1] for s in range(1, 6)}
    tasks = {task: {"median": level, "seeds": values} for task in ("stsb", "mrpc", "cola")}
    point = {"method": method, "candidate": candidate, "seed": seed, "steps": 2000, "finetune": tasks}
    point["sets"] = [*sets, f"pretrain.seed={seed}"]
    (folder / "points").mkdir(parents=True, exist_ok=True)
    (folder / "points" / f"{dead_phase.point_name(method, candidate, seed)}.json").write_text(json.dumps(point))


def test_compare_tests_rows_over_their_pretraining_seeds_a_run_under_two_names_being_one_row(tmp_path, capsys):
    import argparse

    out, elsewhere = tmp_path / "preset", tmp_path / "sweep"
    for seed, level in ((1, 40.0), (2, 41.0), (3, 39.5)):
        fine_tuned_point(out, "control", "base", seed, [], level)
    for seed, level in ((2, 50.0), (3, 51.0)):
        fine_tuned_point(out, "electra", "base", seed, [], level)
    fine_tuned_point(out, "cocolm", "base", 2, [], 50.5)
    # seed 1 of both under the sweep's name for what the preset now is (its prior, its steps): the same run
    fine_tuned_point(elsewhere, "electra", "same_piece_init_quarter", 1, ["model.same_piece_init=4.0"], 50.5)
    fine_tuned_point(elsewhere, "cocolm", "same_piece_init_quarter", 1, ["model.same_piece_init=4.0"], 49.5)
    fine_tuned_point(elsewhere, "electra", "base", 2, [], 10.0)  # a seed --out has: not counted again
    fine_tuned_point(elsewhere, "electra", "pre_ln", 1, ["model.norm=pre"], 60.0)  # not a run of --out's: left out

    dead_phase.compare(argparse.Namespace(out=out, with_=[elsewhere], against=["control-base-s1", "electra-base-s2"]))
    lines = capsys.readouterr().out.strip().splitlines()[2:]
    assert [line.split(" | ")[:4] for line in lines] == [
        ["| electra/base", "1, 2, 3", "50.5, 50.0, 51.0", "control/base (3)"],
        ["| cocolm/base", "1, 2", "49.5, 50.5", "control/base (3)"],
        ["| cocolm/base", "1, 2", "49.5, 50.5", "electra/base (3)"],
    ]
    cells = [line.split(" | ") for line in lines]
    assert cells[0][4] == "+10.5" and cells[0][-1] == "holds |"  # 50.5 against 40.0, pretraining seeds as units
    assert cells[2][4] == "-0.5" and cells[2][-1] == "within noise |"
    with pytest.raises(SystemExit, match="--against 'electra-pre_ln-s1': no fine-tuned point"):
        dead_phase.compare(argparse.Namespace(out=out, with_=[], against=["electra-pre_ln-s1"]))
    with pytest.raises(SystemExit, match=f"--with {tmp_path / 'nowhere'}: no points"):
        dead_phase.compare(argparse.Namespace(out=out, with_=[tmp_path / "nowhere"], against=["control-base-s1"]))


def test_the_docs_show_the_presets_rows_compared_as_the_bench_compares_them(capsys):
    import argparse

    folders = ROOT / "results" / "controlled_preset", [ROOT / "results" / "dead_phase_signal"]
    against = ["electra-base-s1", "control-base-s1"]
    dead_phase.compare(argparse.Namespace(out=folders[0], with_=folders[1], against=against))
    rendered = capsys.readouterr().out.strip()
    shown = docs_block("reproducing.md", "controlled_preset compare")
    command = "python bench/dead_phase.py --out results/controlled_preset compare --against electra-base-s1"
    assert shown.strip() == rendered, f"docs/reproducing.md: run `{command} control-base-s1 --with ...`"
    assert command in (ROOT / "docs" / "reproducing.md").read_text()
    assert rendered.count("| control/base (") >= 4  # every main row against the control, several seeds each
