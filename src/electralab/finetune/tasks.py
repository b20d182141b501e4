"""The fine-tuning tasks and their data: GLUE's eight tasks and SQuAD 2.0, read from the Hugging Face
hub (`nyu-mll/glue`, `rajpurkar/squad_v2`) or, offline, from $ELECTRALAB_DATA in the original formats.

    task = TASKS["mrpc"]
    train = read_split(task, "train", data_root)         # GlueSplit / SquadSplit, or MissingSplit
    dev = read_split(task, task.eval_splits[0].name, data_root)

Offline formats (docs/finetuning.md, ../shared/data/SOURCES.md):
* GLUE: `glue/<TASK>/{train,dev}.tsv` (MNLI: `dev_matched.tsv`, `dev_mismatched.tsv`), tab-separated
  with no quoting (fields hold bare `"`), columns as ELECTRA's readers take them; CoLA has no header;
  MRPC's header starts with a UTF-8 byte order mark; CoLA dev has no final newline.
* SQuAD 2.0: `squad2/{train,dev}-v2.0.json`, the official JSON.

Labels become the hub's ids (the order of `Task.labels`), so both sources give the same numbers.
A split that is not there raises MissingSplit: the stage fails naming it, unless it is one of the offline
mirror's known gaps (MIRROR_GAPS) or ELECTRALAB_ALLOW_MISSING=1 is set, when it records the task as missing
with the reason and fine-tunes the others. A malformed file raises DataError naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from electralab.errors import DataError


class MissingSplit(DataError):
    """A task's split is not available (not in the mirror, or not downloadable). `known_gap`: a file the
    offline mirror is known to lack, which the stage skips without being told to."""

    def __init__(self, message: str, known_gap: bool = False):
        super().__init__(message)
        self.known_gap = known_gap


# What ../shared/data (the offline mirror) does not have: GLUE's QQP dev split (docs/finetuning.md).
MIRROR_GAPS = {"glue/QQP/dev.tsv"}


@dataclass(frozen=True)
class EvalSplit:
    name: str  # our name of the split: "dev", MNLI "dev_matched" / "dev_mismatched"
    suffix: str  # appended to its metric names: "" or "_mm" (MNLI mismatched: accuracy_mm)
    hub_split: str  # the hub's name: "validation", "validation_matched", ...


DEV = (EvalSplit("dev", "", "validation"),)


@dataclass(frozen=True)
class Task:
    name: str  # the MLflow `task` tag (docs/tracking.md)
    kind: Literal["classification", "regression", "span"]
    grid: Literal["glue_small", "glue_large", "squad2"]  # which grid of presets.<p>.finetune.grids
    main_metric: str  # the tables' metric; selects the configuration
    metrics: tuple[str, ...]  # every metric the parent run reports
    labels: tuple[str, ...] = ()  # label names in the hub's id order
    directory: str = ""  # under $ELECTRALAB_DATA/glue/
    text_columns: tuple[int, ...] = ()  # TSV columns of sentence(s) a (and b)
    label_column: int = -1
    header: bool = True
    eval_splits: tuple[EvalSplit, ...] = DEV
    hub_config: str = ""  # nyu-mll/glue config
    hub_fields: tuple[str, ...] = ()  # its text columns

    @property
    def num_outputs(self) -> int:
        return len(self.labels) if self.kind == "classification" else 1 if self.kind == "regression" else 2


BINARY = ("0", "1")
NLI2 = ("entailment", "not_entailment")
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "mnli",
            "classification",
            "glue_large",
            "accuracy",
            ("accuracy", "accuracy_mm"),
            ("entailment", "neutral", "contradiction"),
            "MNLI",
            (8, 9),
            -1,
            eval_splits=(
                EvalSplit("dev_matched", "", "validation_matched"),
                EvalSplit("dev_mismatched", "_mm", "validation_mismatched"),
            ),
            hub_config="mnli",
            hub_fields=("premise", "hypothesis"),
        ),
        Task(
            "qqp",
            "classification",
            "glue_large",
            "accuracy",
            ("accuracy", "f1"),
            BINARY,
            "QQP",
            (3, 4),
            5,
            hub_config="qqp",
            hub_fields=("question1", "question2"),
        ),
        Task(
            "qnli",
            "classification",
            "glue_large",
            "accuracy",
            ("accuracy",),
            NLI2,
            "QNLI",
            (1, 2),
            3,
            hub_config="qnli",
            hub_fields=("question", "sentence"),
        ),
        Task(
            "sst2",
            "classification",
            "glue_large",
            "accuracy",
            ("accuracy",),
            BINARY,
            "SST-2",
            (0,),
            1,
            hub_config="sst2",
            hub_fields=("sentence",),
        ),
        Task(
            "cola",
            "classification",
            "glue_small",
            "mcc",
            ("mcc",),
            BINARY,
            "CoLA",
            (3,),
            1,
            header=False,
            hub_config="cola",
            hub_fields=("sentence",),
        ),
        Task(
            "rte",
            "classification",
            "glue_small",
            "accuracy",
            ("accuracy",),
            NLI2,
            "RTE",
            (1, 2),
            3,
            hub_config="rte",
            hub_fields=("sentence1", "sentence2"),
        ),
        Task(
            "mrpc",
            "classification",
            "glue_small",
            "accuracy",
            ("accuracy", "f1"),
            BINARY,
            "MRPC",
            (3, 4),
            0,
            hub_config="mrpc",
            hub_fields=("sentence1", "sentence2"),
        ),
        Task(
            "stsb",
            "regression",
            "glue_small",
            "spearman",
            ("pearson", "spearman"),
            (),
            "STS-B",
            (-3, -2),
            -1,
            hub_config="stsb",
            hub_fields=("sentence1", "sentence2"),
        ),
        # SQuAD 2.0: F1 selects the configuration (the tables print EM and F1).
        Task(
            "squad2",
            "span",
            "squad2",
            "f1",
            ("exact", "f1", "has_ans_exact", "has_ans_f1", "no_ans_exact", "no_ans_f1"),
        ),
    )
}
GLUE_TASKS = tuple(name for name, t in TASKS.items() if t.kind != "span")
# The official training sets' sizes (examples; SQuAD 2.0: questions): the report says how much of each
# a preset used, so a column trained on a subset (the offline mirror's MNLI, QNLI, QQP) is labelled so.
OFFICIAL_TRAIN_SIZES = {
    "mnli": 392_702,
    "qqp": 363_846,
    "qnli": 104_743,
    "sst2": 67_349,
    "cola": 8_551,
    "rte": 2_490,
    "mrpc": 3_668,
    "stsb": 5_749,
    "squad2": 130_319,
}


# --------------------------------------------------------------------------------------------
# GLUE
# --------------------------------------------------------------------------------------------


@dataclass
class GlueSplit:
    text_a: list[str]
    text_b: list[str] | None  # None for single-sentence tasks (SST-2, CoLA)
    labels: np.ndarray  # int64 label ids, or float32 scores (STS-B)
    source: str  # the file or hub split it came from

    def __len__(self) -> int:
        return len(self.text_a)

    def subset(self, index: np.ndarray) -> "GlueSplit":
        pick = lambda texts: [texts[i] for i in index]  # noqa: E731
        return GlueSplit(
            pick(self.text_a), pick(self.text_b) if self.text_b is not None else None, self.labels[index], self.source
        )


def _label(task: Task, value: str, where: str) -> float | int:
    if task.kind == "regression":
        try:
            return float(value)
        except ValueError:
            raise DataError(f"{where}: score {value!r} is not a number") from None
    try:
        return task.labels.index(value.strip())
    except ValueError:
        raise DataError(f"{where}: label {value!r} is not one of {list(task.labels)}") from None


def read_glue_tsv(task: Task, path: Path) -> GlueSplit:
    """A GLUE TSV as download_glue_data.py wrote it (and ELECTRA reads it): split on tabs, no quoting."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: drops MRPC's byte order mark
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: not UTF-8 text at byte {e.start} (a binary or truncated file?); GLUE files "
            f"are tab-separated UTF-8"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":  # a final newline (CoLA dev has none)
        lines.pop()
    first = 1 if task.header else 0
    if len(lines) <= first:
        raise DataError(f"{path}: no data rows")
    needed = (
        max(
            max(c if c >= 0 else -c - 1 for c in task.text_columns),
            task.label_column if task.label_column >= 0 else -task.label_column - 1,
        )
        + 1
    )
    texts: list[list[str]] = [[] for _ in task.text_columns]
    labels = []
    for number, line in enumerate(lines[first:], start=first + 1):
        fields = line.rstrip("\r").split("\t")
        if len(fields) < needed:
            raise DataError(
                f"{path}:{number}: {len(fields)} tab-separated fields, {task.name} needs at least "
                f"{needed} (a quoted field read with quote handling merges rows; this file has none)"
            )
        for column, out in zip(task.text_columns, texts):
            out.append(fields[column])
        labels.append(_label(task, fields[task.label_column], f"{path}:{number}"))
    dtype = np.float32 if task.kind == "regression" else np.int64
    return GlueSplit(texts[0], texts[1] if len(texts) > 1 else None, np.asarray(labels, dtype=dtype), str(path))


def glue_from_hub_rows(task: Task, rows: dict[str, list], source: str) -> GlueSplit:
    """Columns of a `nyu-mll/glue` split (dict of lists, as `Dataset.to_dict()` gives) -> GlueSplit."""
    texts = [list(rows[f]) for f in task.hub_fields]
    dtype = np.float32 if task.kind == "regression" else np.int64
    labels = np.asarray(rows["label"], dtype=dtype)
    if task.kind == "classification" and len(labels) and (labels.min() < 0 or labels.max() >= len(task.labels)):
        raise DataError(f"{source}: labels outside 0..{len(task.labels) - 1} (a test split has no labels)")
    return GlueSplit(texts[0], texts[1] if len(texts) > 1 else None, labels, source)


# --------------------------------------------------------------------------------------------
# SQuAD 2.0
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SquadExample:
    qid: str
    question: str
    context: str
    answers: tuple[str, ...]  # gold answer texts; () = unanswerable
    answer_start: int | None  # character offset of the first answer in the context

    @property
    def has_answer(self) -> bool:
        return bool(self.answers)


@dataclass
class SquadSplit:
    examples: list[SquadExample]
    source: str

    def __len__(self) -> int:
        return len(self.examples)

    def subset(self, index: np.ndarray) -> "SquadSplit":
        return SquadSplit([self.examples[i] for i in index], self.source)


def read_squad_json(path: Path) -> SquadSplit:
    """The official SQuAD 2.0 JSON: data[].paragraphs[].{context, qas[].{id, question, answers, is_impossible}}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (ValueError, KeyError, TypeError) as e:  # ValueError: bad JSON, or bytes that are not UTF-8
        raise DataError(f"{path}: not a SQuAD JSON file ({type(e).__name__}: {e})") from None
    examples = []
    for article in data:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = [] if qa.get("is_impossible") else qa["answers"]
                examples.append(
                    SquadExample(
                        qa["id"],
                        qa["question"],
                        context,
                        tuple(a["text"] for a in answers),
                        answers[0]["answer_start"] if answers else None,
                    )
                )
    if not examples:
        raise DataError(f"{path}: no questions")
    return SquadSplit(examples, str(path))


def squad_from_hub_rows(rows: dict[str, list], source: str) -> SquadSplit:
    """Columns of a `rajpurkar/squad_v2` split (id, context, question, answers{text, answer_start})."""
    examples = []
    for qid, question, context, answers in zip(rows["id"], rows["question"], rows["context"], rows["answers"]):
        texts, starts = tuple(answers["text"]), list(answers["answer_start"])
        examples.append(SquadExample(qid, question, context, texts, starts[0] if starts else None))
    return SquadSplit(examples, source)


SQUAD_FILES = {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}


# --------------------------------------------------------------------------------------------
# One entry point for both sources
# --------------------------------------------------------------------------------------------


def read_split(task: Task, split: str, data_root: Path | None) -> GlueSplit | SquadSplit:
    """`split` ("train" or one of task.eval_splits' names) from the mirror, or from the hub when
    data_root is None. Raises MissingSplit when it is not there."""
    if data_root is not None:
        if task.kind == "span":
            path = data_root / "squad2" / SQUAD_FILES[split]
        else:
            path = data_root / "glue" / task.directory / f"{split}.tsv"
        if not path.is_file():  # relative: the message lands in metrics/finetune/<run>.json, kept in git
            relative = path.relative_to(data_root).as_posix()
            raise MissingSplit(
                f"no {split} split: {relative} is not in the ELECTRALAB_DATA mirror", known_gap=relative in MIRROR_GAPS
            )
        return read_squad_json(path) if task.kind == "span" else read_glue_tsv(task, path)
    return _read_hub(task, split)


def _read_hub(task: Task, split: str) -> GlueSplit | SquadSplit:
    import datasets  # lazily: importing datasets costs about a second

    if split == "train":
        hub_split = "train"
    else:
        hub_split = next(s.hub_split for s in task.eval_splits if s.name == split)
    path, name = ("rajpurkar/squad_v2", None) if task.kind == "span" else ("nyu-mll/glue", task.hub_config)
    source = f"{path}{'/' + name if name else ''}:{hub_split}"
    try:
        rows = datasets.load_dataset(path, name, split=hub_split).to_dict()
    except Exception as e:  # offline, unknown split, hub error: the task is missing, the grid goes on
        raise MissingSplit(
            f"no {split} split: {source} could not be loaded ({type(e).__name__}: {e}); "
            f"set ELECTRALAB_DATA to an offline mirror"
        ) from None
    return squad_from_hub_rows(rows, source) if task.kind == "span" else glue_from_hub_rows(task, rows, source)


__all__ = [
    "DEV",
    "EvalSplit",
    "GLUE_TASKS",
    "GlueSplit",
    "MIRROR_GAPS",
    "MissingSplit",
    "SquadExample",
    "SquadSplit",
    "TASKS",
    "Task",
    "glue_from_hub_rows",
    "read_glue_tsv",
    "read_split",
    "read_squad_json",
    "squad_from_hub_rows",
]
