"""Fine-tuning metrics as the official definitions give them, in percentage points (88.5, not 0.885),
the way the papers print them (docs/tracking.md).

GLUE (the GLUE paper / leaderboard, as scikit-learn and scipy compute them; tests compare):
    accuracy, F1 of the positive class (MRPC, QQP), Matthews correlation (CoLA), Pearson and
    Spearman correlation (STS-B; Spearman with average ranks for ties). MNLI's mismatched accuracy is
    `accuracy_mm`.
SQuAD 2.0 (the official evaluate-v2.0.py, without a no-answer probability file):
    answers normalised (lower case, punctuation and a/an/the removed, whitespace collapsed); each
    prediction scored against its best gold answer; an unanswerable question's gold is [""], so
    predicting "" scores 1; `exact`, `f1` and the HasAns / NoAns breakdowns.
GLUE average (COCO-LM Table 1 caption): the mean of the eight tasks with Spearman for STS-B, MCC for
    CoLA and accuracy for the rest, MNLI by its matched accuracy.
"""

from __future__ import annotations

import collections
import re
import string

import numpy as np

# --------------------------------------------------------------------------------------------
# GLUE
# --------------------------------------------------------------------------------------------


def paired(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    """Both sides as 1-D arrays of one length: (N, 1) against (N,) would broadcast to an (N, N) comparison
    and give a plausible-looking wrong number, so it is refused."""
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.ndim != 1 or p.shape != y.shape:
        raise ValueError(f"metric inputs must be 1-D and of one length: predictions {p.shape}, labels {y.shape}")
    return p, y


def finite(x: np.ndarray) -> bool:
    """Whether every value is a finite number (always true for class ids)."""
    return not np.issubdtype(x.dtype, np.floating) or bool(np.isfinite(x).all())


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    p, y = paired(predictions, labels)
    return 100.0 * float(np.mean(p == y))


def f1_positive(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """F1 of the positive class (scikit-learn's f1_score; 0 when there is no true or predicted positive)."""
    p, y = paired(predictions, labels)
    p, y = p == positive, y == positive
    tp, fp, fn = np.sum(p & y), np.sum(p & ~y), np.sum(~p & y)
    denominator = 2 * tp + fp + fn
    return 100.0 * float(2 * tp / denominator) if denominator else 0.0


def matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation (scikit-learn's multiclass form; 0 when either side is constant)."""
    p, y = paired(predictions, labels)
    classes = np.union1d(y, p)
    confusion = np.array([[np.sum((y == a) & (p == b)) for b in classes] for a in classes], dtype=np.float64)
    t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    cov_yp = correct * n - t_sum @ p_sum
    cov_pp = n * n - p_sum @ p_sum
    cov_yy = n * n - t_sum @ t_sum
    if cov_pp * cov_yy == 0:
        return 0.0
    return 100.0 * float(cov_yp / np.sqrt(cov_yy * cov_pp))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r (NaN when either side is constant, as scipy.stats.pearsonr gives, or not finite)."""
    x, y = (a.astype(np.float64) for a in paired(x, y))
    if not (finite(x) and finite(y)):
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
    return 100.0 * float(np.sum(dx * dy) / denominator) if denominator > 0 else float("nan")


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (scipy.stats.rankdata's default)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # first position of each value
    counts = np.diff(np.r_[starts, len(x)])
    group = np.repeat(np.arange(len(starts)), counts)
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = (starts + (counts + 1) / 2.0)[group]
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the average ranks (scipy.stats.spearmanr); NaN when either side has a
    NaN or infinity (ranking would order NaN as the largest value and give a number to a diverged model)."""
    x, y = (a.astype(np.float64) for a in paired(x, y))
    if not (finite(x) and finite(y)):
        return float("nan")
    return pearson(average_ranks(x), average_ranks(y))


def glue_metrics(task: str, outputs: np.ndarray, labels: np.ndarray, suffix: str = "") -> dict[str, float]:
    """The task's metrics from its model outputs (class ids, or STS-B scores) on one eval split."""
    if task == "stsb":
        out = {"pearson": pearson(outputs, labels), "spearman": spearman(outputs, labels)}
    elif task == "cola":
        out = {"mcc": matthews(outputs, labels)}
    elif task in ("mrpc", "qqp"):
        out = {"accuracy": accuracy(outputs, labels), "f1": f1_positive(outputs, labels)}
    else:
        out = {"accuracy": accuracy(outputs, labels)}
    return {f"{name}{suffix}": value for name, value in out.items()}


# The GLUE average's part of each task (COCO-LM Table 1 caption; electralab.tables.GLUE_AVG_PARTS).
GLUE_AVERAGE_METRICS = {
    "mnli": "accuracy",
    "qqp": "accuracy",
    "qnli": "accuracy",
    "sst2": "accuracy",
    "cola": "mcc",
    "rte": "accuracy",
    "mrpc": "accuracy",
    "stsb": "spearman",
}


def glue_average(medians: dict[str, dict[str, float]]) -> float | None:
    """The mean over the eight tasks' medians, or None unless every task has its value."""
    values = [medians.get(task, {}).get(metric) for task, metric in GLUE_AVERAGE_METRICS.items()]
    if any(v is None or not np.isfinite(v) for v in values):
        return None
    return float(np.mean(values))


# --------------------------------------------------------------------------------------------
# SQuAD 2.0 (evaluate-v2.0.py)
# --------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_score(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1_score(gold: str, prediction: str) -> float:
    gold_tokens, pred_tokens = _tokens(gold), _tokens(prediction)
    if not gold_tokens or not pred_tokens:  # unanswerable, or an empty prediction
        return float(gold_tokens == pred_tokens)
    same = sum((collections.Counter(gold_tokens) & collections.Counter(pred_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(golds: dict[str, tuple[str, ...]], predictions: dict[str, str]) -> dict[str, float]:
    """exact/f1 over every question, and the has_ans_/no_ans_ breakdowns (those present): `golds` maps a
    question id to its gold answers (() when unanswerable). A question without a prediction is an error,
    as in the official script (whose breakdowns fail on it): a score over part of the questions would look
    like a score over all of them."""
    missing = [qid for qid in golds if qid not in predictions]
    if missing:
        raise ValueError(
            f"SQuAD: {len(missing)} of {len(golds)} questions have no prediction (first: {', '.join(missing[:3])})"
        )
    exact, f1, has_answer = {}, {}, {}
    for qid, answers in golds.items():
        gold = [a for a in answers if normalize_answer(a)] or [""]
        exact[qid] = max(exact_score(a, predictions[qid]) for a in gold)
        f1[qid] = max(f1_score(a, predictions[qid]) for a in gold)
        has_answer[qid] = bool(answers)
    if not exact:
        return {}

    def mean(scores: dict[str, float], ids: list[str]) -> float:
        return 100.0 * sum(scores[q] for q in ids) / len(ids)

    every = list(exact)
    out = {"exact": mean(exact, every), "f1": mean(f1, every)}
    for prefix, ids in (
        ("has_ans", [q for q in every if has_answer[q]]),
        ("no_ans", [q for q in every if not has_answer[q]]),
    ):
        if ids:
            out[f"{prefix}_exact"], out[f"{prefix}_f1"] = mean(exact, ids), mean(f1, ids)
    return out


__all__ = [
    "GLUE_AVERAGE_METRICS",
    "accuracy",
    "average_ranks",
    "exact_score",
    "f1_positive",
    "f1_score",
    "glue_average",
    "glue_metrics",
    "matthews",
    "normalize_answer",
    "pearson",
    "spearman",
    "squad_metrics",
]
