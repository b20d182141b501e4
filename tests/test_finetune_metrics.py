"""Fine-tuning metrics against independent computations: scikit-learn and scipy for GLUE, hand-built
SQuAD 2.0 cases (normalisation, several gold answers, unanswerable questions, empty predictions) worked
out from the official evaluate-v2.0.py's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from electralab.finetune import metrics as M


def random_labels(seed: int, n: int = 500, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, classes, n)
    pred = np.where(rng.random(n) < 0.7, gold, rng.integers(0, classes, n))  # correlated with gold
    return pred, gold


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    pred, gold = random_labels(seed)
    assert M.accuracy(pred, gold) == pytest.approx(100 * accuracy_score(gold, pred))
    assert M.f1_positive(pred, gold) == pytest.approx(100 * f1_score(gold, pred))
    assert M.matthews(pred, gold) == pytest.approx(100 * matthews_corrcoef(gold, pred))
    pred3, gold3 = random_labels(seed, classes=3)
    assert M.accuracy(pred3, gold3) == pytest.approx(100 * accuracy_score(gold3, pred3))
    assert M.matthews(pred3, gold3) == pytest.approx(100 * matthews_corrcoef(gold3, pred3))


def test_degenerate_predictions_match_sklearn():
    gold = np.array([0, 1, 1, 0, 1])
    constant = np.ones(5, dtype=int)
    assert M.matthews(constant, gold) == pytest.approx(100 * matthews_corrcoef(gold, constant)) == 0.0
    none = np.zeros(5, dtype=int)  # no predicted positive: F1 0 (sklearn's zero_division)
    assert M.f1_positive(none, gold) == pytest.approx(100 * f1_score(gold, none, zero_division=0)) == 0.0
    assert M.f1_positive(gold, gold) == 100.0


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    gold = np.round(rng.uniform(0, 5, 300) * 5) / 5  # STS-B-like scores: many ties
    pred = gold + rng.normal(0, 1.5, 300)
    pred[:40] = np.round(pred[:40])  # ties in the predictions too
    assert M.pearson(pred, gold) == pytest.approx(100 * stats.pearsonr(pred, gold)[0])
    assert M.spearman(pred, gold) == pytest.approx(100 * stats.spearmanr(pred, gold)[0])
    np.testing.assert_allclose(M.average_ranks(gold), stats.rankdata(gold))


def test_constant_predictions_give_an_undefined_correlation():
    assert np.isnan(M.pearson(np.ones(4), np.arange(4.0)))
    assert np.isnan(M.spearman(np.ones(4), np.arange(4.0)))


def test_glue_metrics_per_task_and_split():
    pred, gold = random_labels(0)
    assert M.glue_metrics("mnli", pred, gold, "_mm") == {"accuracy_mm": M.accuracy(pred, gold)}
    assert set(M.glue_metrics("mrpc", pred, gold)) == {"accuracy", "f1"}
    assert set(M.glue_metrics("qqp", pred, gold)) == {"accuracy", "f1"}
    assert set(M.glue_metrics("cola", pred, gold)) == {"mcc"}
    assert set(M.glue_metrics("stsb", pred.astype(float), gold.astype(float))) == {"pearson", "spearman"}
    assert set(M.glue_metrics("rte", pred, gold)) == {"accuracy"}


def test_glue_average_is_the_papers_eight_task_mean():
    medians = {
        "mnli": {"accuracy": 80.0, "accuracy_mm": 10.0},
        "qqp": {"accuracy": 90.0, "f1": 1.0},
        "qnli": {"accuracy": 85.0},
        "sst2": {"accuracy": 92.0},
        "cola": {"mcc": 60.0},
        "rte": {"accuracy": 70.0},
        "mrpc": {"accuracy": 88.0, "f1": 2.0},
        "stsb": {"pearson": 3.0, "spearman": 89.0},
        "squad2": {"exact": 4.0},
    }
    assert M.glue_average(medians) == pytest.approx((80 + 90 + 85 + 92 + 60 + 70 + 88 + 89) / 8)
    del medians["qqp"]
    assert M.glue_average(medians) is None  # seven tasks: no average
    assert M.glue_average({**medians, "qqp": {"accuracy": None}}) is None


# --- SQuAD 2.0 --------------------------------------------------------------------------------------


def test_answer_normalisation():
    assert M.normalize_answer("The  Normans!") == "normans"
    assert M.normalize_answer("an apple, a pear and THE end.") == "apple pear and end"
    assert M.normalize_answer("theory") == "theory"  # articles only as whole words
    assert M.normalize_answer("Saint-Denis's") == "saintdeniss"  # punctuation removed, not split
    assert M.normalize_answer("  ") == ""


def test_exact_and_f1_by_hand():
    assert M.exact_score("the Normans", "Normans.") == 1
    assert M.exact_score("Normans", "Norman") == 0
    # gold "10th and 11th centuries" (4 tokens), prediction "in the 10th century" -> "in 10th century" (3):
    # one common token: precision 1/3, recall 1/4, F1 = 2/7.
    assert M.f1_score("10th and 11th centuries", "in the 10th century") == pytest.approx(2 / 7)
    # "a" is an article: gold "x b b c" -> [x, b, b, c], "a b b c" -> [b, b, c]; prediction [b, b, d]
    assert M.f1_score("x b b c", "b b d") == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert M.f1_score("a b b c", "b b d") == pytest.approx(2 / 3)
    assert M.f1_score("", "") == 1.0 and M.f1_score("", "something") == 0.0 and M.f1_score("x", "") == 0.0


def test_squad_scores_with_several_golds_unanswerable_and_empty_predictions():
    golds = {
        "q1": ("Denmark, Iceland and Norway", "Denmark", "Norway"),  # several gold answers: the best one counts
        "q2": ("10th century",),
        "q3": (),  # unanswerable: gold [""]
        "q4": (),
        "q5": ("Rollo",),
        "q6": ("a",),  # normalises to "": counts as gold [""] for scoring, but HasAns (answers given)
    }
    predictions = {"q1": "Norway", "q2": "the 10th century AD", "q3": "", "q4": "Rollo", "q5": "", "q6": ""}
    # q1 EM 1 F1 1; q2 EM 0, F1 vs "10th century": pred tokens [10th, century, ad] -> P 2/3, R 1, F1 0.8;
    # q3 EM 1 F1 1; q4 EM 0 F1 0; q5 (empty prediction of an answerable question) 0/0; q6 1/1.
    out = M.squad_metrics(golds, predictions)
    assert out["exact"] == pytest.approx(100 * 3 / 6)
    assert out["f1"] == pytest.approx(100 * (1 + 0.8 + 1 + 0 + 0 + 1) / 6)
    has = ["q1", "q2", "q5", "q6"]
    assert out["has_ans_exact"] == pytest.approx(100 * 2 / len(has))
    assert out["has_ans_f1"] == pytest.approx(100 * (1 + 0.8 + 0 + 1) / len(has))
    assert out["no_ans_exact"] == pytest.approx(50.0) and out["no_ans_f1"] == pytest.approx(50.0)


def test_squad_omits_empty_breakdowns_and_refuses_missing_predictions():
    out = M.squad_metrics({"q1": ("Rollo",), "q2": ("x",)}, {"q1": "rollo", "q2": "x"})
    assert out == {"exact": 100.0, "f1": 100.0, "has_ans_exact": 100.0, "has_ans_f1": 100.0}
    with pytest.raises(ValueError, match="1 of 1 questions have no prediction"):
        M.squad_metrics({"q1": ("x",)}, {})


# --- diverged models and malformed inputs -------------------------------------------------------------


def test_a_non_finite_prediction_has_no_correlation():
    """A model that diverged to NaN: Spearman used to rank NaN as the largest value and score it (8.25
    on STS-B dev); Pearson and Spearman are both undefined, as any metric of a non-finite output."""
    gold = np.linspace(0, 5, 50)
    for bad in (np.full(50, np.nan), np.r_[np.full(10, np.nan), gold[10:]], np.r_[np.inf, gold[1:]]):
        assert np.isnan(M.spearman(bad, gold)) and np.isnan(M.pearson(bad, gold))
    assert M.glue_metrics("stsb", np.full(50, np.nan), gold) == pytest.approx(
        {"pearson": np.nan, "spearman": np.nan}, nan_ok=True
    )


@pytest.mark.parametrize("metric", [M.accuracy, M.f1_positive, M.matthews, M.pearson, M.spearman])
def test_metrics_refuse_mismatched_shapes_instead_of_broadcasting(metric):
    pred, gold = random_labels(0, n=20)
    with pytest.raises(ValueError, match=r"predictions \(20, 1\), labels \(20,\)"):
        metric(pred[:, None], gold)
    with pytest.raises(ValueError, match=r"predictions \(19,\), labels \(20,\)"):
        metric(pred[:19], gold)
