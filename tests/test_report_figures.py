"""Every figure renders a PNG from values logged to a real MLflow store (and a "no data yet" panel
without them); the data behind the lines is what was logged. COCO-LM Fig. 1/5's cosines come from a
tiny real encoder and sentencepiece model, checked against an unbatched computation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F_
from report_helpers import CORPUS, ENCODER_RUNS, HISTORY_RUNS, STEPS, VOCAB_SIZE, median_of, tiny_encoder

from electralab import CLS_ID, SEP_ID
from electralab.data.vocab import Tokenizer
from electralab.report import Sources, cosines
from electralab.report import figures as F
from electralab.report.build import fetch_results, metric_history

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads only add overhead

PNG = b"\x89PNG\r\n\x1a\n"
EMPTY_HISTORY = pd.DataFrame(columns=["run", "metric", "step", "value"])
EMPTY_CELLS = pd.DataFrame(
    columns=["run", "task", "checkpoint", "label_fraction", "metric", "median", "std", "min", "max", "run_id"]
)


@pytest.fixture(scope="module")
def results(store):
    return fetch_results("tiny", store.uri)


@pytest.fixture(scope="module")
def history(results):
    from electralab.report import HISTORY_METRICS

    return metric_history(results, list(HISTORY_RUNS), HISTORY_METRICS)


def saved(fig, tmp_path, name="f.png") -> bytes:
    path = tmp_path / name
    F.save(fig, path)
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    return data


def texts(fig) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def lines(ax) -> dict[str, np.ndarray]:
    return {line.get_label(): np.asarray(line.get_ydata()) for line in ax.get_lines()}


HISTORY_FIGURES = [F.scl_cosine_figure, F.copy_clm_figure, F.mix_weights_figure, F.curriculum_figure]


@pytest.mark.parametrize("make", HISTORY_FIGURES, ids=lambda f: f.__name__)
def test_history_figures_render_logged_metrics(make, history, tmp_path):
    fig = make(history, "tiny")
    assert "tiny preset" in fig._suptitle.get_text()
    assert any(ax.get_lines() for ax in fig.axes)
    saved(fig, tmp_path)


@pytest.mark.parametrize("make", HISTORY_FIGURES, ids=lambda f: f.__name__)
def test_history_figures_without_data_say_so(make, tmp_path):
    fig = make(EMPTY_HISTORY, "tiny")
    assert all(not ax.get_lines() for ax in fig.axes)
    assert texts(fig).count(F.NO_DATA) == len(fig.axes)
    saved(fig, tmp_path)


def test_history_lines_are_the_logged_values(history):
    fig = F.mix_weights_figure(history, "tiny")
    drawn = lines(fig.axes[0])
    steps = np.arange(10, STEPS + 1, 10)
    np.testing.assert_allclose(drawn["layer 8"], 1 / 3 + 2 * steps / 6000, rtol=1e-6)
    fig = F.curriculum_figure(history, "tiny")  # 2 of 5 runs logged: drawn, the others named as missing
    assert set(lines(fig.axes[0])) == {"AMOS", "4-layer gen."}
    assert "amos_layer_switch/rtd_acc_replaced" in texts(fig)
    frame = F.history_frame(history, F.MIX_SERIES)
    assert list(frame.columns) == [
        "step",
        "amos_ablation/mix_weight_exit4",
        "amos_ablation/mix_weight_exit6",
        "amos_ablation/mix_weight_exit8",
    ]
    assert list(frame["step"]) == list(steps)
    empty = F.history_frame(EMPTY_HISTORY, F.CURRICULUM_SERIES)
    assert empty.empty and len(empty.columns) == 6  # the DVC plots file keeps its columns


def test_efficiency_points_use_the_hours_logged_at_each_checkpoint(results, history, tmp_path):
    points = F.efficiency_points(results.cells, results.pretrain, history, ["cocolm", "mlm", "electra"])
    cocolm = points[points["run"] == "cocolm"]
    # cocolm logged wall_hours = 3 * step / STEPS; checkpoints 025/050/075 are steps 50/100/150
    assert list(cocolm["checkpoint"]) == ["025", "050", "075", "final"]
    np.testing.assert_allclose(cocolm["hours"], [0.75, 1.5, 2.25, 3.0])
    assert list(cocolm["MNLI-m"]) == [40.0, 45.0, 50.0, 66.6]
    mlm = points[points["run"] == "mlm"]
    assert list(mlm["checkpoint"]) == ["final"] and mlm["hours"].iloc[0] == pytest.approx(1.0)
    fig = F.efficiency_figure(points, "cocolm", {"mlm": "RoBERTa (Ours)", "electra": "ELECTRA (Ours)"}, "Fig. 3 (tiny)")
    np.testing.assert_allclose(lines(fig.axes[0])["cocolm"], [40.0, 45.0, 50.0, 66.6])
    assert len(fig.axes[0].collections) == 2  # the two baselines' end points
    saved(fig, tmp_path)
    empty = F.efficiency_figure(
        F.efficiency_points(EMPTY_CELLS, results.pretrain, history, ["amos"]), "amos", {}, "Fig. 4 (tiny)"
    )
    assert texts(empty).count(F.NO_DATA) == 2
    saved(empty, tmp_path, "empty.png")


def test_sweep_figures_plot_final_medians(results, tmp_path):
    crop = F.sweep_points(results.cells, {"COCO-LM": F.CROP_RUNS}, [F.MNLI_M, F.MNLI_MM, F.GLUE_COLUMN])
    at70 = crop[(crop["x"] == 70) & (crop["column"] == "MNLI-m")].iloc[0]
    assert at70["median"] == median_of("cocolm_crop70", "mnli", "accuracy") and at70["min"] == at70["median"] - 0.5
    assert crop[crop["x"] == 80]["median"].isna().all()  # cocolm_crop80 not fine-tuned
    saved(F.crop_figure(crop, "tiny"), tmp_path, "crop.png")
    depth = F.sweep_points(results.cells, {"TEAMS": F.GENERATOR_DEPTH_RUNS}, F.SWEEP_COLUMNS)
    fig = F.generator_depth_figure(depth, "tiny")
    assert list(fig.axes[1].get_lines()[0].get_xdata()) == [2, 6]  # the fine-tuned depths
    saved(fig, tmp_path, "depth.png")
    negatives = F.sweep_points(results.cells, F.NEGATIVES_RUNS, F.SWEEP_COLUMNS)
    fig = F.negatives_figure(negatives, {"GLUE AVG": 60.0, "SQuAD 2.0 F1": 51.5}, "tiny")
    assert [line.get_ydata()[0] for line in fig.axes[1].get_lines() if line.get_label() == "ELECTRA"] == [51.5]
    saved(fig, tmp_path, "negatives.png")
    wide = F.sweep_frame(negatives)
    assert list(wide.columns) == [
        "x",
        "Sampled/GLUE AVG",
        "Sampled/SQuAD 2.0 F1",
        "Hardest/GLUE AVG",
        "Hardest/SQuAD 2.0 F1",
    ]
    none = F.sweep_points(EMPTY_CELLS, {"TEAMS": F.GENERATOR_DEPTH_RUNS}, F.SWEEP_COLUMNS)
    fig = F.generator_depth_figure(none, "tiny")
    assert texts(fig).count(F.NO_DATA) == 2
    saved(fig, tmp_path, "none.png")


def test_the_headline_figure_draws_every_seed_of_every_row_and_the_controls_score(tmp_path):
    from test_report_claims import NOISE_OF_SEED, seeded

    from electralab.tables import GLUE_AVG_PARTS

    res = seeded({"electra": [65.0, 64.0, 66.0], "mlm": [58.0], "control": [40.0]})
    runs = ["mlm", "electra", "cocolm", "control"]
    points = F.headline_points(res.cells, runs, GLUE_AVG_PARTS)
    assert set(points["run"]) == {"mlm", "electra", "control"} and (points["tasks"] == 7).all()  # QQP: none has it
    assert len(points[points["run"] == "electra"]) == 3 * 5 and points["pretraining"].nunique() == 5
    electra2 = points[points["pretraining"] == "electra_seed2"].set_index("seed")["score"]
    assert electra2.to_dict() == pytest.approx({s: 64.0 + NOISE_OF_SEED[s] for s in NOISE_OF_SEED})
    fig = F.headline_figure(points, runs, "control", "tiny")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["control", "electra", "mlm"]  # top to bottom: mlm first
    assert sum(len(c.get_offsets()) for c in ax.collections) == 3 * 5 + 5 + 5  # a dot per seed
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_xdata()[0] for line in dashed] == [pytest.approx(40.0)]  # the control's score
    saved(fig, tmp_path, "headline.png")
    assert texts(F.headline_figure(points.iloc[0:0], runs, "control", "tiny")).count(F.NO_DATA) == 1


def test_learning_curves_are_each_runs_held_out_checks_by_step_and_by_hour(history, tmp_path):
    runs = ["mlm", "electra", "cocolm", "amos", "teams"]  # teams logged nothing
    points = F.learning_points(history, runs)
    assert set(points["run"]) == {"mlm", "electra", "cocolm", "amos"}
    electra = points[points["run"] == "electra"].set_index("step")
    assert list(electra.index) == list(range(10, STEPS + 1, 10))
    assert electra.loc[50, "detector_gain"] == 0.0 and electra.loc[200, "detector_gain"] == pytest.approx(0.1)
    assert electra.loc[100, "hours"] == pytest.approx(100 / STEPS * 2.0)  # its wall_hours at that step
    assert points[points["run"] == "cocolm"].set_index("step").loc[200, "detector_gain"] == pytest.approx(0.1)
    assert points[points["run"] == "mlm"]["detector_gain"].isna().all()  # no detector: token cosine only
    fig = F.learning_curves_figure(points, runs, 0.02, "tiny")
    by_step, by_hour, cosine = fig.axes
    assert set(lines(by_step)) == {"electra", "cocolm", "amos", "the guard's 0.02"}
    np.testing.assert_allclose(lines(by_hour)["electra"], electra["detector_gain"])
    np.testing.assert_allclose(by_hour.get_lines()[0].get_xdata(), electra["hours"])
    assert set(lines(cosine)) == {"mlm", "electra", "cocolm", "amos"}
    saved(fig, tmp_path, "learning.png")
    empty = F.learning_curves_figure(F.learning_points(EMPTY_HISTORY, runs), runs, 0.02, "tiny")
    assert texts(empty).count(F.NO_DATA) == 3


# --- COCO-LM Fig. 1/5 -----------------------------------------------------------------------------------


def test_pair_cosines_match_an_unbatched_computation(store):
    torch.manual_seed(0)
    encoder = tiny_encoder(VOCAB_SIZE, seed=7)
    with torch.no_grad():  # larger weights than BERT's init, so that [CLS] states differ between texts
        for p in encoder.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    pairs = [
        ("A man is playing a guitar.", "A man plays the guitar loudly on a stage tonight."),
        ("The cat sat.", "Stocks fell sharply in early trading on Monday, analysts said."),
        ("Same text here.", "Same text here."),
    ]
    tokenizer = Tokenizer(store.vocab_dir)
    got = F.pair_cosines(encoder, tokenizer, pairs)
    ids = F.encode_texts(tokenizer, [t for p in pairs for t in p], max_len=64)
    assert all(x[0] == CLS_ID and x[-1] == SEP_ID for x in ids)
    encoder.eval()
    with torch.no_grad():  # one sequence at a time: no padding, no mask
        cls = [encoder(torch.tensor([x]))[-1][0, 0] for x in ids]
    expected = [float(F_.cosine_similarity(cls[2 * i], cls[2 * i + 1], dim=0)) for i in range(len(pairs))]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert got[2] == pytest.approx(1.0, abs=1e-6) and got[1] < 0.99


def test_encode_texts_normalises_like_the_corpus(store):
    tokenizer = Tokenizer(store.vocab_dir)  # uncased, like the session corpus
    assert F.encode_texts(tokenizer, ["  Café\tTHE  film "], 64) == F.encode_texts(tokenizer, ["cafe the film"], 64)
    assert len(F.encode_texts(tokenizer, ["word " * 500], 32)[0]) == 32


def test_stsb_reader_and_corpus_pairs(tmp_path):
    tsv = tmp_path / "dev.tsv"
    tsv.write_text(
        "\ufeffindex\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        '0\tnews\tf\t2012\t0\tnone\tnone\tHe said "yes.\tHe said "yes".\t5.000\n'
        "1\tnews\tf\t2012\t1\tnone\tnone\tA b.\tC d.\t4.750\n"
        "2\tnews\tf\t2012\t2\tnone\tnone\tE f.\tE f!\t5.0\n",
        encoding="utf-8",
    )
    assert F.read_stsb_similar(tsv) == [('He said "yes.', 'He said "yes".'), ("E f.", "E f!")]
    corpus = tmp_path / "c.txt"
    corpus.write_text(
        " = Heading = \n"
        + "\n".join(f"paragraph {i} has quite a few words in it ok" for i in range(5))
        + "\nshort line\n",
        encoding="utf-8",
    )
    pairs = F.corpus_pairs([corpus], 20, seed=1)
    assert len(pairs) == 20 and all(a != b and a.startswith("paragraph") for a, b in pairs)
    assert pairs == F.corpus_pairs([corpus], 20, seed=1)


def test_cosines_from_the_logged_encoders_and_the_figure(results, tmp_path):
    tsv = tmp_path / "dev.tsv"
    tsv.write_text(
        "sentence1\tsentence2\tscore\nA man runs.\tA man is running.\t5.0\nA dog.\tA cat.\t1.0\n", encoding="utf-8"
    )
    frame = cosines(results, Sources(stsb_dev=tsv, corpus_files=(CORPUS,), random_pairs=30))
    assert set(frame["run"]) == set(ENCODER_RUNS)
    counts = frame.groupby(["run", "pairs"]).size()
    assert (counts.xs("random", level="pairs") == 30).all() and (counts.xs("similar", level="pairs") == 1).all()
    assert frame["cosine"].between(-1.0001, 1.0001).all()
    fig = F.cosine_figure(frame, "tiny")
    assert all(ax.patches for ax in fig.axes)
    saved(fig, tmp_path)
    empty = cosines(results, Sources())  # no STS-B, no corpus: the figure says so
    fig = F.cosine_figure(empty, "tiny")
    assert texts(fig).count(F.NO_DATA) == 3
    saved(fig, tmp_path, "empty.png")
