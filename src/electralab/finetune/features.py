"""Text -> token ids with the run's own sentencepiece model, and batches with dynamic padding.

    encoded = encode_pairs(tokenizer, split.text_a, split.text_b, split.labels, max_len=128)
    for index in train_batches(encoded.lengths, batch_size=32, rng=rng):
        input_ids, attention_mask, labels = encoded.batch(index)   # (B, T) padded to the longest row

Sequences are `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` (no segment ids: the encoders are pretrained
without them), truncated longest-first to `max_len` like BERT's `_truncate_seq_pair`. All sequences of a
split live in one flat int32 array with offsets: one buffer that Ray ships to trial workers without
copying, and cheap to slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from electralab import CLS_ID, PAD_ID, SEP_ID


@dataclass
class Encoded:
    """Token ids of N sequences: sequence i is ids[offsets[i]:offsets[i + 1]]."""

    ids: np.ndarray  # (total tokens,) int32
    offsets: np.ndarray  # (N + 1,) int64
    labels: np.ndarray  # (N,) int64 / float32; SQuAD windows: (N, 2) start and end positions

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def batch(self, index: np.ndarray, pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows `index` padded with [PAD] to the longest of them (or to `pad_to`):
        input_ids (B, T) long, attention_mask (B, T) bool, labels (B, ...)."""
        starts, ends = self.offsets[index], self.offsets[index + 1]
        width = pad_to or int((ends - starts).max())
        ids = np.full((len(index), width), PAD_ID, dtype=np.int64)
        for row, (s, e) in enumerate(zip(starts, ends)):
            ids[row, : e - s] = self.ids[s:e]
        input_ids = torch.from_numpy(ids)
        return input_ids, input_ids != PAD_ID, torch.from_numpy(self.labels[index])

    def subset(self, index: np.ndarray) -> "Encoded":
        return pack([self.ids[self.offsets[i] : self.offsets[i + 1]] for i in index], self.labels[index])


def pack(sequences: list, labels: np.ndarray) -> Encoded:
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences]) if sequences else np.zeros(0, np.int32)
    return Encoded(ids, offsets, np.asarray(labels))


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths after BERT's longest-first truncation (pop a token from the longer side, b on ties,
    until the pair fits `budget`), in closed form."""
    excess = len_a + len_b - budget
    if excess <= 0:
        return len_a, len_b
    if len_a > len_b:
        cut = min(excess, len_a - len_b)
        len_a, excess = len_a - cut, excess - cut
    elif len_b > len_a:
        cut = min(excess, len_b - len_a)
        len_b, excess = len_b - cut, excess - cut
    return len_a - excess // 2, len_b - (excess + 1) // 2  # equal now: b loses the odd token


def encode_pairs(tokenizer, text_a: list[str], text_b: list[str] | None, labels: np.ndarray, max_len: int) -> Encoded:
    """[CLS] a [SEP] (b [SEP]) for every example, truncated to max_len tokens."""
    a = tokenizer.encode_batch(text_a)
    if text_b is None:
        sequences = [[CLS_ID, *x[: max_len - 2], SEP_ID] for x in a]
    else:
        sequences = []
        for x, y in zip(a, tokenizer.encode_batch(text_b)):
            la, lb = truncate_pair(len(x), len(y), max_len - 3)
            sequences.append([CLS_ID, *x[:la], SEP_ID, *y[:lb], SEP_ID])
    return pack(sequences, labels)


# --------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------

# Length grouping sorts within windows of this many batches (HF's group_by_length uses 50 too).
GROUP_WINDOW = 50


def train_batches(
    lengths: np.ndarray, batch_size: int, rng: np.random.Generator, group_by_length: bool = True
) -> list[np.ndarray]:
    """One epoch of training batches. Shuffled; with group_by_length, sorted by length within windows
    of GROUP_WINDOW batches (less padding, still random: fairseq batches by size too), and the batches
    shuffled again."""
    order = rng.permutation(len(lengths))
    if group_by_length:
        window = batch_size * GROUP_WINDOW
        order = np.concatenate(
            [
                chunk[np.argsort(-lengths[chunk], kind="stable")]
                for chunk in np.array_split(order, max(1, -(-len(order) // window)))
            ]
        )
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if group_by_length:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def eval_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Every row once, sorted by length (the least padding); results are put back in order by index."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


__all__ = ["Encoded", "encode_pairs", "eval_batches", "pack", "train_batches", "truncate_pair"]
