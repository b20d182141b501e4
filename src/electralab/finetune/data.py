"""A task's data, ready for trials: read (hub or mirror), capped, tokenised with the run's vocabulary.

    data = prepare(TASKS["mnli"], tokenizer, cfg, data_root, fractions=(1.0, 0.01))
    data[1.0].train, data[1.0].evals, data[1.0].counts       # every label; 1% of them in data[0.01]

Caps (the smaller of the task's `train_caps` and `max_train_examples`; `max_eval_examples`; SQuAD:
`squad.max_train_questions`, `squad.max_eval_questions`) and label fractions draw from one fixed permutation of
each split (seed SUBSET_SEED), so every run sees the same examples, and the 1% subset is inside the 10%
one. Counts of what exists and what is used go to MLflow (`num_train_available`, `num_train_examples`,
`num_eval_examples`, ...). A missing split raises MissingSplit before anything is tokenised.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from electralab.config import FinetuneConfig
from electralab.finetune.features import Encoded, encode_pairs
from electralab.finetune.squad import SquadWindows, squad_windows
from electralab.finetune.tasks import EvalSplit, GlueSplit, SquadSplit, Task, read_split

SUBSET_SEED = 0  # caps and label fractions: the same examples for every run and every seed


@dataclass
class TaskData:
    task: Task
    train: Encoded  # SQuAD: the training windows
    evals: list[tuple[EvalSplit, Encoded | SquadWindows]]
    counts: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # split name -> file or hub split
    fingerprint: str = ""  # of every token id and label

    def trial_work(self, epochs: int, evaluations: int) -> int:
        """What a trial of `epochs` with `evaluations` costs, in forward-pass tokens (a trained token costs
        about three: forward and backward): the order of the stage's trials, longest first."""
        evaluated = sum(int((e.encoded if isinstance(e, SquadWindows) else e).lengths.sum()) for _, e in self.evals)
        return 3 * epochs * int(self.train.lengths.sum()) + evaluations * evaluated


def subset(n: int, keep: int | None) -> np.ndarray:
    """The first `keep` of a fixed permutation of range(n), in their original order (all if None)."""
    if keep is None or keep >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(SUBSET_SEED).permutation(n)[:keep])


def _tokenize(task: Task, split: GlueSplit | SquadSplit, tokenizer, cfg: FinetuneConfig, train: bool):
    if task.kind == "span":
        windows = squad_windows(tokenizer, split.examples, cfg.max_seq_len, cfg.squad, train=train)
        return windows.encoded if train else windows, windows.skipped
    return encode_pairs(tokenizer, split.text_a, split.text_b, split.labels, cfg.max_seq_len), 0


def _digest(h, encoded: Encoded) -> None:
    for array in (encoded.ids, encoded.offsets, encoded.labels):
        h.update(np.ascontiguousarray(array).tobytes())


def prepare(
    task: Task, tokenizer, cfg: FinetuneConfig, data_root: Path | None, fractions: Iterable[float] = (1.0,)
) -> dict[float, TaskData]:
    """TaskData per label fraction (evaluation splits shared). Raises MissingSplit."""
    caps = [c for c in (cfg.train_caps.get(task.name), cfg.max_train_examples) if c is not None]
    train_cap, eval_cap = min(caps, default=None), cfg.max_eval_examples  # a global cap (-S, tests) still binds
    if task.kind == "span":
        train_cap = cfg.squad.max_train_questions or train_cap
        eval_cap = cfg.squad.max_eval_questions or eval_cap
    raw_train = read_split(task, "train", data_root)
    raw_evals = [(s, read_split(task, s.name, data_root)) for s in task.eval_splits]
    counts = {"num_train_available": len(raw_train)}
    sources = {"train": raw_train.source}
    evals = []
    for split, raw in raw_evals:
        keep = subset(len(raw), eval_cap)
        encoded, _ = _tokenize(task, raw.subset(keep), tokenizer, cfg, train=False)
        evals.append((split, encoded))
        suffix = split.suffix
        counts[f"num_eval_available{suffix}"] = len(raw)
        counts[f"num_eval_examples{suffix}"] = len(keep)
        sources[split.name] = raw.source
    eval_digest = hashlib.sha256(task.name.encode())
    for _, encoded in evals:
        _digest(eval_digest, encoded.encoded if isinstance(encoded, SquadWindows) else encoded)

    out = {}
    for fraction in fractions:
        wanted = max(1, round(fraction * len(raw_train)))
        if train_cap is not None:
            wanted = min(wanted, train_cap)
        keep = subset(len(raw_train), wanted)
        train, skipped = _tokenize(task, raw_train.subset(keep), tokenizer, cfg, train=True)
        h = eval_digest.copy()
        _digest(h, train)
        out[fraction] = TaskData(
            task,
            train,
            evals,
            {**counts, "num_train_examples": len(keep) - skipped, "num_train_skipped": skipped},
            sources,
            h.hexdigest()[:16],
        )
    return out


__all__ = ["SUBSET_SEED", "TaskData", "prepare", "subset"]
