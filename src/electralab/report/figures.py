"""The papers' figures from our runs: one function per figure, each taking DataFrames of logged values
and returning a matplotlib Figure. A figure whose data is absent draws a "no data yet" panel that
names what is missing, instead of failing: the report is useful while runs are still coming in.

Inputs (electralab.report.build):
* history: run, metric, step, value (pretraining metrics over steps, `metric_history`)
* cells: run, task, checkpoint, label_fraction, metric, median, std, min, max (fine-tuning parents)
* cosines: run, pairs ("random" | "similar"), cosine (COCO-LM Fig. 1/5, from exported encoders)
"""

from __future__ import annotations

import random
import textwrap
from pathlib import Path
from typing import Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from electralab.report.build import FINAL, cell_lookup, cell_value, final_cells, hours_at  # noqa: E402
from electralab.tables import FIGURES, GLUE_AVG, MNLI_M, MNLI_MM, SQUAD2, Column  # noqa: E402

NO_DATA = "no data yet"
Series = tuple[str, str, str]  # (run, metric, legend label)


def _no_data(ax, missing: str) -> None:
    ax.text(
        0.5,
        0.5,
        f"{NO_DATA}\n{missing}",
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=9,
        color="0.35",
        wrap=True,
    )
    ax.set_xticks([])
    ax.set_yticks([])


def _figure(panels: int, title: str) -> tuple[Figure, list]:
    fig, axes = plt.subplots(1, panels, figsize=(max(6.0, 4.2 * panels), 3.6), squeeze=False)
    fig.suptitle(title, fontsize=10)
    return fig, list(axes[0])


def _finish(fig: Figure) -> Figure:
    fig.tight_layout()
    return fig


def save(fig: Figure, path: str | Path) -> None:
    """Write a PNG and free the figure (pyplot keeps every open figure alive otherwise)."""
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the headline: every Table 1 row's score per seed, beside the control --------------------------------

HEADLINE_COLUMNS = ("run", "pretraining", "seed", "score", "tasks")


def headline_points(cells: pd.DataFrame, runs: Sequence[str], columns: Sequence[Column]) -> pd.DataFrame:
    """One line per (row's run, pretraining run, fine-tuning seed): the score a claim tests (report/claims.py: the
    mean over the columns), over the columns that every pretraining run with a number has."""
    from electralab.report.claims import common_seeds, pretraining_runs, scores, seed_scores

    final = final_cells(cells)
    values = {run: {p: seed_scores(final, p, list(columns)) for p in pretraining_runs(final, run)} for run in runs}
    present = [by_column for per_run in values.values() for by_column in per_run.values() if by_column]
    shared = [c.name for c in columns if present and all(c.name in by_column for by_column in present)]
    lines = []
    for run, per_run in values.items():
        for pretraining, by_column in per_run.items():
            if not shared or not by_column:
                continue
            seeds = common_seeds([by_column], shared)
            for seed, score in zip(seeds, scores(by_column, shared, seeds)):
                lines.append(
                    {"run": run, "pretraining": pretraining, "seed": seed, "score": float(score), "tasks": len(shared)}
                )
    return pd.DataFrame(lines, columns=list(HEADLINE_COLUMNS))


def headline_figure(points: pd.DataFrame, runs: Sequence[str], control: str, preset: str) -> Figure:
    """One row per run, top to bottom: a dot per (pretraining, fine-tuning) seed, coloured by pretraining run, a bar
    at the row's score (the median of its pretraining runs' medians, as the claims take it), the control's dashed."""
    fig, (ax,) = _figure(1, f"The headline rows' scores, seed by seed ({preset} preset)")
    order = [run for run in runs if run in set(points["run"])]
    if not order:
        _no_data(ax, f"fine-tuned runs of {', '.join(runs)}")
        return _finish(fig)
    jitter = np.random.default_rng(0)  # the same picture for the same numbers
    scores = {}
    for y, run in enumerate(reversed(order)):
        line = points[points["run"] == run]
        by_run = list(line.groupby("pretraining", sort=False)["score"])
        for k, (_, values) in enumerate(by_run):
            ys = y + jitter.uniform(-0.15, 0.15, len(values))
            ax.scatter(
                values, ys, s=14, color=f"C{k}", alpha=0.8, label=f"pretraining seed {k + 1}" if y == 0 else None
            )
        scores[run] = float(np.median([values.median() for _, values in by_run]))
        ax.plot([scores[run]] * 2, [y - 0.3, y + 0.3], color="black", linewidth=2)
    if control in scores:
        ax.axvline(scores[control], color="0.4", linestyle="--", linewidth=1, label="control's score")
    ax.set_yticks(range(len(order)), list(reversed(order)))
    tasks = int(points["tasks"].iloc[0])
    ax.set_xlabel(f"mean over {tasks} GLUE tasks, one dot per fine-tuning seed; bar: the row's score")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    return _finish(fig)


# --- the headline rows' learning curves: the detector's dead phase, by step and by hour -------------------

# The binary detector's held-out gain over its base rate (train/diagnostics.py): ELECTRA's, AMOS's and TEAMS's
# RTD, COCO-LM's copy head. A run logs one of them; an MLM run none.
DETECTOR_GAINS = ("heldout_rtd_base_rate_gain", "heldout_copy_base_rate_gain")
TOKEN_COSINE = "heldout_token_cosine"  # the final layer's mean cosine between tokens (1.0: one vector)
LEARNING_COLUMNS = ("run", "step", "hours", "detector_gain", "token_cosine")


def learning_points(history: pd.DataFrame, runs: Sequence[str], hours: str = "wall_hours") -> pd.DataFrame:
    """One line per held-out check of each run: its step, the pretraining hours at it (the run's logged `hours`
    interpolated at the step; NaN where none was logged), the detector's gain (NaN for a run without a
    detector) and the final layer's token cosine."""
    lines = []
    for run in runs:
        mine = history[history["run"] == run]
        by_metric = {m: g.set_index("step")["value"] for m, g in mine.groupby("metric")}
        gain = next((by_metric[m] for m in DETECTOR_GAINS if m in by_metric), pd.Series(dtype=float))
        cosine = by_metric.get(TOKEN_COSINE, pd.Series(dtype=float))
        for step in sorted(set(gain.index) | set(cosine.index)):
            lines.append(
                {
                    "run": run,
                    "step": int(step),
                    "hours": hours_at(history, run, step, hours),
                    "detector_gain": float(gain.get(step, np.nan)),
                    "token_cosine": float(cosine.get(step, np.nan)),
                }
            )
    return pd.DataFrame(lines, columns=list(LEARNING_COLUMNS))


def learning_curves_figure(points: pd.DataFrame, runs: Sequence[str], threshold: float, preset: str) -> Figure:
    """Three panels: the detector's held-out gain over its base rate by step and by pretraining hour (equal
    tokens and equal time: where each method's dead phase ends, and what it costs), with the collapse guard's
    `threshold`; and the final layer's token cosine by step (MLM included)."""
    fig, axes = _figure(3, f"The headline rows' pretraining, held out ({preset} preset)")
    panels = (
        (axes[0], "step", "detector_gain", "pretraining step", "detector's gain over its base rate"),
        (axes[1], "hours", "detector_gain", "pretraining hours (wall clock)", "detector's gain over its base rate"),
        (axes[2], "step", "token_cosine", "pretraining step", "final layer's token cosine"),
    )
    for ax, x, y, xlabel, ylabel in panels:
        drawn = False
        for k, run in enumerate(runs):
            line = points[points["run"] == run].dropna(subset=[x, y])
            if not line.empty:
                ax.plot(line[x], line[y], marker=".", color=f"C{k}", label=run)
                drawn = True
        if not drawn:
            _no_data(ax, f"held-out checks ({y}, {x}) of {', '.join(runs)}")
            continue
        if y == "detector_gain":
            ax.axhline(threshold, color="0.4", linestyle="--", linewidth=1, label=f"the guard's {threshold:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    return _finish(fig)


# --- metrics over pretraining steps ------------------------------------------------------------------


def history_figure(history: pd.DataFrame, panels: Sequence[tuple[str, str, Sequence[Series]]], title: str) -> Figure:
    """Panels of (panel title, y label, series); each series is one run's metric over steps."""
    fig, axes = _figure(len(panels), title)
    for ax, (panel_title, ylabel, series) in zip(axes, panels):
        ax.set_title(panel_title, fontsize=9)
        missing = []
        for run, metric, label in series:
            s = history[(history["run"] == run) & (history["metric"] == metric)]
            if s.empty:
                missing.append(f"{label} ({run}/{metric})")
            else:
                ax.plot(s["step"], s["value"], label=label)
        if len(missing) == len(series):
            _no_data(ax, "\n".join(missing))
            continue
        ax.set_xlabel("pretraining step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        if missing:
            ax.text(
                0.01,
                0.01,
                textwrap.fill(f"{NO_DATA}: {', '.join(missing)}", 70),
                transform=ax.transAxes,
                fontsize=6,
                color="0.35",
                va="bottom",
            )
    return _finish(fig)


def history_frame(history: pd.DataFrame, series: Iterable[Series]) -> pd.DataFrame:
    """The series of a history figure side by side (step, "<run>/<metric>", ...): a DVC plots file.
    Every declared series is a column, empty when not logged, so the file's columns never change."""
    names = [f"{run}/{metric}" for run, metric, _ in series]
    if history.empty:
        return pd.DataFrame(columns=["step", *names])
    wide = history.assign(name=history["run"] + "/" + history["metric"]).pivot_table(
        index="step", columns="name", values="value", aggfunc="last"
    )
    return wide.reindex(columns=names).reset_index()


# The runs of every figure and their labels or x values come from the table registry (electralab.tables).
SCL_SERIES = {
    f"{panel} ({run})": [(run, "scl_pos_cos", "positive pairs"), (run, "scl_neg_cos", "negative pairs")]
    for run, panel in FIGURES["coco-lm/fig7"].series["SCL"].items()
}


def scl_cosine_figure(history: pd.DataFrame, preset: str) -> Figure:
    """COCO-LM Fig. 7a/b: cosine similarity of positive and negative SCL pairs during pretraining."""
    panels = [(t, "cosine similarity", s) for t, s in SCL_SERIES.items()]
    return history_figure(history, panels, f"COCO-LM Fig. 7a/b: [CLS] cosine of SCL pairs ({preset} preset)")


COPY_CLM_PANELS = [
    ("(a) Copy Acc. (Replaced)", "copy_acc_replaced"),
    ("(b) Copy Acc. (Original)", "copy_acc_original"),
    ("(c) CLM Acc. (Replaced)", "clm_acc_replaced"),
    ("(d) CLM Acc. (Original)", "clm_acc_original"),
]
COPY_CLM_RUNS = list(FIGURES["coco-lm/fig8"].series["LM"].items())


def copy_clm_figure(history: pd.DataFrame, preset: str) -> Figure:
    """COCO-LM Fig. 8: copy and CLM accuracy on replaced and original tokens, CLM vs All-Token MLM."""
    panels = [(t, "accuracy", [(run, metric, label) for run, label in COPY_CLM_RUNS]) for t, metric in COPY_CLM_PANELS]
    return history_figure(history, panels, f"COCO-LM Fig. 8: copy and LM accuracy ({preset} preset)")


MIX_PANELS = FIGURES["amos/fig3"].series["mixture"]  # run -> its panel's title
MIX_SERIES = [(run, f"mix_weight_exit{d}", f"layer {d}") for run in MIX_PANELS for d in (4, 6, 8)]


def mix_weights_figure(history: pd.DataFrame, preset: str) -> Figure:
    """AMOS Fig. 3a: the mixture weight of each generator exit over pretraining."""
    panels = [
        (f"{title} ({run})", "mixture weight", [s for s in MIX_SERIES if s[0] == run])
        for run, title in MIX_PANELS.items()
    ]
    return history_figure(history, panels, f"AMOS Fig. 3a: mixture weights per exit ({preset} preset)")


CURRICULUM_SERIES = [
    (run, "rtd_acc_replaced", label) for run, label in FIGURES["amos/fig3"].series["curriculum"].items()
]


def curriculum_figure(history: pd.DataFrame, preset: str) -> Figure:
    """AMOS Fig. 3b: discriminator accuracy on replaced tokens under the curricula."""
    return history_figure(
        history,
        [("(b) RTD accuracy on replaced tokens", "accuracy", CURRICULUM_SERIES)],
        f"AMOS Fig. 3b: discriminator accuracy, replaced tokens ({preset} preset)",
    )


# --- MNLI against pretraining hours (COCO-LM Fig. 3, AMOS Fig. 4) -------------------------------------


def efficiency_points(
    cells: pd.DataFrame, pretrain: pd.DataFrame, history: pd.DataFrame, runs: Sequence[str], hours: str = "wall_hours"
) -> pd.DataFrame:
    """MNLI-m/mm medians of every fine-tuned checkpoint of `runs` against the pretraining hours at it.

    A checkpoint tag is "final" or a percentage of training ("050"); its hours are the run's logged
    `hours` metric interpolated at that step (steps = the run's `pretrain.steps` param)."""
    columns = ["run", "checkpoint", "fraction", "hours", MNLI_M.name, MNLI_MM.name]
    lines = []
    for run in runs:
        mnli = cells[(cells["run"] == run) & (cells["task"] == "mnli") & (cells["label_fraction"] == 1.0)]
        info = pretrain[pretrain["run"] == run]
        if mnli.empty or info.empty or history[(history["run"] == run) & (history["metric"] == hours)].empty:
            continue
        steps = float(info["steps"].iloc[0])
        for checkpoint, g in mnli.groupby("checkpoint"):
            fraction = 1.0 if checkpoint == FINAL else int(checkpoint) / 100
            at = hours_at(history, run, round(fraction * steps), hours)
            medians = dict(zip(g["metric"], g["median"]))
            lines.append(
                {
                    "run": run,
                    "checkpoint": checkpoint,
                    "fraction": fraction,
                    "hours": at,
                    MNLI_M.name: medians.get(MNLI_M.metric, np.nan),
                    MNLI_MM.name: medians.get(MNLI_MM.metric, np.nan),
                }
            )
    return pd.DataFrame(lines, columns=columns).sort_values(["run", "hours"], kind="stable").reset_index(drop=True)


def efficiency_figure(
    points: pd.DataFrame,
    main: str,
    baselines: dict[str, str],
    title: str,
    hours_label: str = "pretraining hours (wall clock)",
) -> Figure:
    """MNLI dev accuracy of `main`'s checkpoints against pretraining hours, with the baselines' end
    points (their final checkpoints) marked."""
    fig, axes = _figure(2, title)
    for ax, column in zip(axes, (MNLI_M.name, MNLI_MM.name)):
        ax.set_title(column, fontsize=9)
        curve = points[(points["run"] == main)].dropna(subset=[column])
        ends = points[points["run"].isin(list(baselines)) & (points["checkpoint"] == FINAL)].dropna(subset=[column])
        if curve.empty and ends.empty:
            _no_data(ax, f"MNLI parents with a checkpoint tag for {main}, {', '.join(baselines)}")
            continue
        if not curve.empty:
            ax.plot(curve["hours"], curve[column], marker="o", label=main)
        for run, label in baselines.items():
            end = ends[ends["run"] == run]
            if not end.empty:
                ax.scatter(end["hours"], end[column], marker="*", s=120, label=f"{label} (end point)", zorder=3)
        ax.set_xlabel(hours_label)
        ax.set_ylabel("MNLI dev accuracy")
        ax.legend(fontsize=8)
    return _finish(fig)


# --- ablation sweeps (COCO-LM Fig. 4, TEAMS Figs. 4 and 5) --------------------------------------------

GLUE_COLUMN = Column("GLUE AVG", None, GLUE_AVG)


def sweep_points(cells: pd.DataFrame, series: dict[str, dict[str, float]], columns: Sequence[Column]) -> pd.DataFrame:
    """series label -> {run: x}: one line per (series, run, column) with the run's final median, min, max."""
    lookup = cell_lookup(final_cells(cells))
    lines = []
    for label, runs in series.items():
        for run, x in runs.items():
            for c in columns:
                value = cell_value(lookup, run, c)
                lines.append(
                    {
                        "series": label,
                        "run": run,
                        "x": x,
                        "column": c.name,
                        "median": value["median"],
                        "min": value["min"],
                        "max": value["max"],
                    }
                )
    return pd.DataFrame(lines, columns=["series", "run", "x", "column", "median", "min", "max"])


def sweep_figure(
    points: pd.DataFrame,
    columns: Sequence[str],
    xlabel: str,
    title: str,
    *,
    logx: bool = False,
    reference: dict[str, float] | None = None,
    reference_label: str = "",
) -> Figure:
    """One panel per column: each series' medians against x, error bars = the seeds' min/max."""
    fig, axes = _figure(len(columns), title)
    for ax, column in zip(axes, columns):
        ax.set_title(column, fontsize=9)
        p = points[(points["column"] == column)].dropna(subset=["median"])
        if p.empty:
            _no_data(ax, f"{column} for runs {', '.join(points['run'].unique())}")
            continue
        for label, s in p.groupby("series", sort=False):
            s = s.sort_values("x")
            err = np.array([s["median"] - s["min"], s["max"] - s["median"]])
            ax.errorbar(s["x"], s["median"], yerr=np.nan_to_num(err), marker="o", capsize=3, label=label)
        if reference and not np.isnan(reference.get(column, np.nan)):
            ax.axhline(reference[column], color="0.4", linestyle="--", label=reference_label)
        if logx:
            ax.set_xscale("log")
            ax.set_xticks(sorted(p["x"].unique()), [f"{x:g}" for x in sorted(p["x"].unique())])
            ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=8)
    return _finish(fig)


def sweep_frame(points: pd.DataFrame) -> pd.DataFrame:
    """x, then one column per (series, column) of medians: a DVC plots file."""
    if points.empty:
        return pd.DataFrame(columns=["x"])
    wide = points.assign(name=points["series"] + "/" + points["column"]).pivot_table(
        index="x", columns="name", values="median", aggfunc="last", dropna=False, sort=True
    )
    order = list(dict.fromkeys(points["series"] + "/" + points["column"]))
    return wide.reindex(columns=order).reset_index()


CROP_RUNS = FIGURES["coco-lm/fig4"].series["COCO-LM"]
GENERATOR_DEPTH_RUNS = FIGURES["teams/fig4"].series["TEAMS"]
NEGATIVES_REFERENCE = FIGURES["teams/fig5"].reference  # TEAMS Fig. 5's ELECTRA line
NEGATIVES_RUNS = FIGURES["teams/fig5"].series
SWEEP_COLUMNS = (GLUE_COLUMN, SQUAD2[1])


CROP_COLUMNS = (MNLI_M, MNLI_MM, GLUE_COLUMN)


# `columns`: the panels; the report leaves out GLUE AVG where its data can never be there (QQP offline).
def crop_figure(points: pd.DataFrame, preset: str, columns: Sequence[Column] = CROP_COLUMNS) -> Figure:
    """COCO-LM Fig. 4: GLUE dev results against the crop fraction (100% = no cropping)."""
    return sweep_figure(
        points,
        [c.name for c in columns],
        "fraction of X^orig kept (%)",
        f"COCO-LM Fig. 4: crop fraction ({preset} preset)",
    )


def generator_depth_figure(points: pd.DataFrame, preset: str, columns: Sequence[Column] = SWEEP_COLUMNS) -> Figure:
    """TEAMS Fig. 4: results against the number of generator layers (bottom half tied)."""
    return sweep_figure(
        points, [c.name for c in columns], "generator layers", f"TEAMS Fig. 4: generator depth ({preset} preset)"
    )


def negatives_figure(
    points: pd.DataFrame, electra: dict[str, float], preset: str, columns: Sequence[Column] = SWEEP_COLUMNS
) -> Figure:
    """TEAMS Fig. 5: "Sampled" vs "Hardest" negatives against K, ELECTRA as the reference line."""
    return sweep_figure(
        points,
        [c.name for c in columns],
        "K (negatives per masked position)",
        f"TEAMS Fig. 5: sampled vs hardest negatives ({preset} preset)",
        logx=True,
        reference=electra,
        reference_label="ELECTRA",
    )


# --- COCO-LM Fig. 1/5: cosine similarity of [CLS] embeddings ------------------------------------------


def read_stsb_similar(path: str | Path, score: float = 5.0) -> list[tuple[str, str]]:
    """The STS-B pairs labelled `score` (the most similar): GLUE's TSV, split on tabs with no quote
    handling (sentences contain bare quotes); columns sentence1, sentence2, score from the header."""
    with open(path, encoding="utf-8-sig") as f:
        header = f.readline().rstrip("\n").split("\t")
        a, b, s = header.index("sentence1"), header.index("sentence2"), header.index("score")
        pairs = []
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) > max(a, b, s) and float(fields[s]) == score:
                pairs.append((fields[a], fields[b]))
    return pairs


def corpus_pairs(
    files: Iterable[str | Path], n: int, seed: int = 0, min_words: int = 8, max_paragraphs: int = 20_000
) -> list[tuple[str, str]]:
    """n random pairs of distinct paragraphs from corpus files (one paragraph per line; WikiText
    " = Heading = " lines and short lines skipped). Reads at most `max_paragraphs` paragraphs: the
    featured-articles mirror is 100 MB, and a sample of its start is random enough for a histogram."""
    paragraphs: list[str] = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                text = line.strip()
                if len(text.split()) >= min_words and not text.startswith("="):
                    paragraphs.append(text)
                    if len(paragraphs) >= max_paragraphs:
                        break
    if len(paragraphs) < 2:
        return []
    rng = random.Random(seed)
    return [tuple(rng.sample(paragraphs, 2)) for _ in range(n)]


def encode_texts(tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """[CLS] pieces [SEP] with the run's Tokenizer (electralab.data.vocab: the corpus stage's
    normalisation + its sentencepiece model), truncated to max_len."""
    from electralab import CLS_ID, SEP_ID

    return [[CLS_ID, *tokenizer.encode(t)[: max_len - 2], SEP_ID] for t in texts]


def cls_embeddings(encoder, ids: Sequence[Sequence[int]], batch_size: int = 64):
    """Final-layer [CLS] states (position 0 of the last layer), dropout off, no gradient: (N, H)."""
    import torch

    from electralab import PAD_ID

    encoder.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(ids), batch_size):
            chunk = ids[i : i + batch_size]
            length = max(len(x) for x in chunk)
            batch = torch.full((len(chunk), length), PAD_ID, dtype=torch.long)
            for j, x in enumerate(chunk):
                batch[j, : len(x)] = torch.tensor(x)
            out.append(encoder(batch, batch != PAD_ID)[-1][:, 0])  # (B, H)
    return torch.cat(out)


def pair_cosines(encoder, tokenizer, pairs: Sequence[tuple[str, str]], max_len: int = 128) -> np.ndarray:
    """Cosine similarity of the two texts' [CLS] embeddings, per pair."""
    import torch.nn.functional as F

    if not pairs:
        return np.zeros(0)
    max_len = min(max_len, encoder.cfg.max_positions)
    ids = encode_texts(tokenizer, [t for pair in pairs for t in pair], max_len)
    h = cls_embeddings(encoder, ids)
    return F.cosine_similarity(h[0::2], h[1::2], dim=-1).numpy()


COSINE_RUNS = {"electra": "ELECTRA", "mlm": "RoBERTa (MLM)", "cocolm": "COCO-LM"}


def cosine_figure(cosines: pd.DataFrame, preset: str, runs: dict[str, str] = COSINE_RUNS) -> Figure:
    """COCO-LM Fig. 1 (ELECTRA, RoBERTa) and Fig. 5 (COCO-LM): distributions of [CLS] cosine similarity
    for random corpus pairs and the most similar STS-B pairs (score 5)."""
    fig, axes = _figure(len(runs), f"COCO-LM Fig. 1/5: [CLS] cosine similarity, not fine-tuned ({preset} preset)")
    # Bins over the observed range, shared by the panels: an untrained or tiny model can put every pair
    # near cosine 1 (the degeneration Fig. 1 shows), which fixed [-1, 1] bins would squeeze into one bar.
    values = cosines["cosine"].to_numpy(dtype=float)
    low, high = (float(values.min()), float(values.max())) if len(values) else (-1.0, 1.0)
    pad = max(1e-6, 0.02 * (high - low))
    bins = np.linspace(low - pad, high + pad, 41)
    for ax, (run, label) in zip(axes, runs.items()):
        ax.set_title(label, fontsize=9)
        c = cosines[cosines["run"] == run]
        if c.empty:
            _no_data(ax, f"the exported encoder of {run}, or the STS-B/corpus data")
            continue
        for pairs, name in (("random", "random corpus pairs"), ("similar", "STS-B pairs, score 5")):
            values = c.loc[c["pairs"] == pairs, "cosine"]
            if len(values):
                ax.hist(values, bins=bins, density=True, alpha=0.55, label=f"{name} (n={len(values)})")
        ax.set_xlabel("cosine similarity")
        ax.set_ylabel("density")
        ax.legend(fontsize=7)
    return _finish(fig)


__all__ = [
    "COSINE_RUNS",
    "CROP_RUNS",
    "GENERATOR_DEPTH_RUNS",
    "NEGATIVES_REFERENCE",
    "NEGATIVES_RUNS",
    "NO_DATA",
    "cls_embeddings",
    "copy_clm_figure",
    "corpus_pairs",
    "cosine_figure",
    "crop_figure",
    "curriculum_figure",
    "efficiency_figure",
    "efficiency_points",
    "encode_texts",
    "generator_depth_figure",
    "history_figure",
    "history_frame",
    "mix_weights_figure",
    "negatives_figure",
    "pair_cosines",
    "read_stsb_similar",
    "save",
    "scl_cosine_figure",
    "sweep_figure",
    "sweep_frame",
    "sweep_points",
]
