"""What a run's numbers come from, in words: the preset's one-line description (under every report table)
and the model card (README.md) of a run's Hugging Face export.

    describe("tiny", params.active, mirror=True)   # "tiny preset: corpus ... (offline mirror); 4096-piece ..."
    model_card(run, note, summary, finetune, mlflow_run)
"""

from __future__ import annotations

import math

from electralab.config import Preset
from electralab.runs import ResolvedRun

# metrics/finetune/<run>.json keys -> the GLUE dev metrics the papers print, in their column order
GLUE = [
    ("mnli", "accuracy", "MNLI-m"),
    ("mnli", "accuracy_mm", "MNLI-mm"),
    ("qqp", "accuracy", "QQP"),
    ("qnli", "accuracy", "QNLI"),
    ("sst2", "accuracy", "SST-2"),
    ("cola", "mcc", "CoLA"),
    ("rte", "accuracy", "RTE"),
    ("mrpc", "accuracy", "MRPC"),
    ("stsb", "spearman", "STS-B"),
    ("squad2", "f1", "SQuAD 2.0 F1"),
]


def describe(preset_name: str, preset: Preset, mirror: bool) -> str:
    """The data and model a preset's numbers come from, one line (printed under every table title)."""
    m, p = preset.model, preset.pretrain
    corpus = (
        ", ".join(f.file for f in preset.corpus.mirror) + " (offline mirror)"
        if mirror
        else ", ".join(h.path for h in preset.corpus.hub) + " (Hugging Face hub)"
    )
    cap = f", first {preset.corpus.max_documents} documents" if preset.corpus.max_documents else ""
    others = "".join(
        f" ({name} runs: {b.model.layers} layers x {b.model.hidden} hidden, {b.pretrain.steps} steps)"
        for name, b in ((name, preset.budget(name)) for name in preset.budgets)
    )
    prior = "" if m.same_piece_init is None else f" (layer 1 on the same-piece prior, {m.same_piece_init:g})"
    return (
        f"{preset_name} preset: corpus {corpus}{cap}; {preset.vocab.size}-piece "
        f"{'uncased' if preset.corpus.uncased else 'cased'} {preset.vocab.model_type.upper()}; main model "
        f"{m.layers} layers x {m.hidden} hidden{prior}; {p.steps} steps{others} x {p.batch_size} sequences x "
        f"{preset.shards.seq_len} tokens"
    )


def _glue_table(run: str, finetune: dict, seeds: int) -> list[str]:
    if not any(task in finetune for task, _, _ in GLUE):
        return [f"Not fine-tuned yet: `dvc repro finetune@{run}`, then `dvc repro export@{run}` rewrites this card."]
    lines = [
        f"Dev-set medians over {seeds} fine-tuning seeds, the configuration with the best median selected per "
        "task (docs/finetuning.md), in points as the papers print them.",
        "",
        "| task | median |",
        "|---|---|",
    ]
    missing = finetune.get("missing", {})
    for task, metric, label in GLUE:
        value = finetune.get(task, {}).get(metric)
        if task in finetune:  # fine-tuned, but the seeds' median is no number (a diverged or constant model)
            why = "fine-tuned; no median: a seed gave no score (docs/finetuning.md)"
        else:
            why = next((reason for key, reason in missing.items() if key.split("@")[0] == task), "not fine-tuned")
        lines.append(f"| {label} | {value:.1f} |" if value is not None else f"| {label} | — ({why}) |")
    average = finetune.get("glue_avg")
    lines.append(
        f"| GLUE AVG | {average:.1f} |" if average is not None else "| GLUE AVG | — (needs all eight GLUE tasks) |"
    )
    return lines


def model_card(
    run: ResolvedRun, note: str, summary: dict, finetune: dict, seeds: int, mlflow_run: str | None, remote_code: bool
) -> str:
    """README.md of exports/<run>/: method, preset, data, steps, GLUE medians, the MLflow run, how to load it."""
    trust = ", trust_remote_code=True" if remote_code else ""
    what = "no pretraining (the control)" if run.method == "none" else f"{run.method} pretraining"
    hours, loss = summary.get("wall_hours"), summary.get("loss")
    trained = f"{summary.get('steps', '?')} steps, {summary.get('tokens', 0):,} tokens" + (
        f", {hours * 60:.1f} min on {summary.get('devices', 1)} device(s)" if hours is not None else ""
    )
    architecture = (
        "transformers' `ElectraModel` plus a T5 relative position bias (32 buckets by default), in "
        "`modeling_electralab.py` beside this card: load it with `trust_remote_code=True` (without it "
        "transformers builds a plain ELECTRA and reports `relative_attention_bias.weight` as unexpected)"
        if remote_code
        else "transformers' own `ElectraModel` (absolute positions)"
    )
    tracking = (
        f"MLflow experiment `electralab-{run.preset}`, pretraining run `{mlflow_run}` (tag `run={run.name}`)"
        if mlflow_run
        else f"MLflow experiment `electralab-{run.preset}` (no finished pretraining run found)"
    )
    lines = [
        "---",
        "library_name: transformers",
        f"tags: [electralab, {run.method}, {run.preset}]",
        "---",
        "",
        f"# electralab `{run.name}`: {what}, {run.preset} preset",
        "",
        run.spec.description or "",
        "",
        "```python",
        "from transformers import AutoModel, AutoTokenizer",
        f'tokenizer = AutoTokenizer.from_pretrained("exports/{run.name}")',
        f'model = AutoModel.from_pretrained("exports/{run.name}"{trust})',
        'hidden = model(**tokenizer("A sentence to encode.", return_tensors="pt")).last_hidden_state',
        "```",
        "",
        "## Model",
        "",
        f"- Architecture: {architecture}.",
        f"- Main encoder: {run.model.layers} layers, hidden {run.model.hidden}, {run.model.heads} heads, FFN "
        f"{run.model.ffn}, embeddings {run.model.embedding}; {summary.get('params_main', 0):,} parameters.",
        "- Tokenizer: the run's sentencepiece vocabulary as a `tokenizers` tokenizer; gives the ids electralab "
        "trained and fine-tuned with. Inputs are `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]` with no segment ids "
        "(pretrained without them).",
        "",
        "## Training",
        "",
        f"- Method: `{run.method}` (params.yaml `runs.{run.name}`), seed {run.seed}; tables: "
        f"{', '.join(run.tables) or 'none'}.",
        f"- Preset and data: {note}.",
        f"- Pretraining: {trained}"
        + (f"; final loss {loss:.3f}." if loss is not None and math.isfinite(loss) else "."),
        f"- Tracking: {tracking}.",
        "",
        "## GLUE and SQuAD 2.0 (dev)",
        "",
        *_glue_table(run.name, finetune, seeds),
        "",
    ]
    if run.preset == "tiny":
        lines += [
            "The tiny preset trains miniature models on a tiny corpus in minutes: its numbers show the "
            "machinery and orderings, not the papers' values.",
            "",
        ]
    return "\n".join(lines)


__all__ = ["GLUE", "describe", "model_card"]
