"""SQuAD 2.0 with a no-answer option, as BERT's run_squad.py does it: windows over long contexts (doc
stride), start/end logits per token, [CLS] as the "no answer" span, n-best decoding.

    windows = squad_windows(tokenizer, split.examples, max_seq_len=384, cfg=SquadSettings(), train=False)
    ...                                      # a span head gives start/end logits per window token
    predictions = decode(windows, start_logits, end_logits, cfg)   # {question id: answer text or ""}

Every token knows the characters of the context it covers, so answers are exact substrings of the
context and training spans follow the answer's characters (BERT's `_improve_answer_span` without the
search). The context is split on whitespace and each word is encoded alone with the run's Tokenizer
(the same ids as encoding the whole text: sentencepiece splits on whitespace); sentencepiece reports
each piece's offsets in the normalised word, which map back to the original word character for
character whenever normalisation kept its length (lower-casing, accent stripping), and to the whole
word otherwise. A token seen in several windows is a start candidate only in the window where it has
the most context on both sides (`max_context`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from electralab import CLS_ID, SEP_ID
from electralab.config import SquadSettings
from electralab.finetune.features import Encoded, pack
from electralab.finetune.tasks import SquadExample


@dataclass
class SquadWindows:
    """The model inputs of a SQuAD split: windows of [CLS] question [SEP] context piece [SEP]."""

    encoded: Encoded  # labels (N, 2): start and end token of the answer, (0, 0) = none
    example: np.ndarray  # (N,) which example each window belongs to
    qids: list[str]
    answers: list[tuple[str, ...]]  # per example: gold answers (() = unanswerable)
    # For decoding (evaluation windows only): per window, (T,) arrays
    char_start: list[np.ndarray] = field(default_factory=list)  # first context character of each token, -1 elsewhere
    char_end: list[np.ndarray] = field(default_factory=list)  # one past its last character
    max_context: list[np.ndarray] = field(default_factory=list)  # bool: the token's best window is this one
    contexts: list[str] = field(default_factory=list)  # per example
    skipped: int = 0  # training questions whose answer does not match its context


def split_words(context: str) -> list[tuple[int, str]]:
    """The context's whitespace-separated words with their character offsets."""
    words: list[tuple[int, str]] = []
    start = None
    for i, ch in enumerate(context + " "):
        if ch.isspace() or ch == "\u202f":
            if start is not None:
                words.append((start, context[start:i]))
                start = None
        elif start is None:
            start = i
    return words


def word_pieces(tokenizer, word: str) -> list[tuple[int, int, int]]:
    """(id, first character, one past the last) of each piece of `word`, offsets within the word."""
    normalized = tokenizer.normalize(word)
    pieces = tokenizer.sp.encode(normalized, return_type="proto").pieces
    if len(normalized) != len(word):  # normalisation moved characters: each piece covers the word
        return [(p.id, 0, len(word)) for p in pieces]
    if normalized.isascii():
        return [(p.id, p.begin, p.end) for p in pieces]
    char_of_byte = np.repeat(
        np.arange(len(normalized) + 1), [len(c.encode("utf-8")) for c in normalized] + [1]
    )  # sentencepiece gives byte offsets
    return [(p.id, int(char_of_byte[p.begin]), int(char_of_byte[p.end])) for p in pieces]


def max_context(starts: list[int], lengths: list[int]) -> list[np.ndarray]:
    """Per window, whether each of its tokens has its most context there (BERT's _check_is_max_context:
    the score is min(left, right context) + 0.01 x window length; the first window wins a tie)."""
    starts_, ends = np.asarray(starts), np.asarray(starts) + np.asarray(lengths)
    position = np.arange(ends.max(initial=0))[None, :]  # (1, P)
    score = np.minimum(position - starts_[:, None], ends[:, None] - 1 - position) + 0.01 * np.asarray(lengths)[:, None]
    inside = (position >= starts_[:, None]) & (position < ends[:, None])  # (W, P)
    best = np.argmax(np.where(inside, score, -np.inf), axis=0)  # (P,) the best window per token
    return [best[s:e] == w for w, (s, e) in enumerate(zip(starts_, ends))]


def answer_tokens(example: SquadExample, char_start: np.ndarray, char_end: np.ndarray) -> tuple[int, int] | None:
    """The context tokens covering the first gold answer's characters, or None (unanswerable, or an
    answer whose text is not at its answer_start)."""
    if not example.has_answer or example.answer_start is None:
        return None
    text, start = example.answers[0], example.answer_start
    if not text.strip() or example.context[start : start + len(text)] != text:
        return None
    covering = np.flatnonzero((char_end > start) & (char_start < start + len(text)))
    return (int(covering[0]), int(covering[-1])) if len(covering) else None


def squad_windows(
    tokenizer, examples: list[SquadExample], max_seq_len: int, cfg: SquadSettings, train: bool
) -> SquadWindows:
    """Windows of every example; labels are the first answer's tokens where the window holds all of
    it, else (0, 0). Training skips questions whose answer is not in their context; evaluation keeps
    every question and adds the character maps that `decode` needs."""
    cache: dict[str, list[tuple[int, int, int]]] = {}
    out = SquadWindows(
        pack([], np.zeros((0, 2), np.int64)),
        np.zeros(0, np.int64),
        [x.qid for x in examples],
        [x.answers for x in examples],
    )
    sequences, labels, example_of = [], [], []
    for e, example in enumerate(examples):
        ids, char_start, char_end = [], [], []  # the context's tokens and their characters
        for offset, word in split_words(example.context):
            if word not in cache:
                cache[word] = word_pieces(tokenizer, word)
            for piece, begin, end in cache[word]:
                ids.append(piece)
                char_start.append(offset + begin)
                char_end.append(offset + end)
        char_start, char_end = np.asarray(char_start, dtype=np.int32), np.asarray(char_end, dtype=np.int32)
        span = answer_tokens(example, char_start, char_end)  # the first answer's first and last token
        if train and example.has_answer and span is None:
            out.skipped += 1  # an answer that is not where it says: nothing to learn from
            continue

        query = tokenizer.encode(example.question)[: cfg.max_query_len]
        room = max_seq_len - len(query) - 3
        starts, lengths = [], []
        begin = 0
        while True:  # windows every doc_stride tokens until one reaches the end of the context
            starts.append(begin)
            lengths.append(min(room, len(ids) - begin))
            if begin + lengths[-1] >= len(ids):
                break
            begin += min(lengths[-1], cfg.doc_stride)
        offset = len(query) + 2  # [CLS] query [SEP]
        best = max_context(starts, lengths) if not train else None
        for w, (begin, length) in enumerate(zip(starts, lengths)):
            sequences.append([CLS_ID, *query, SEP_ID, *ids[begin : begin + length], SEP_ID])
            example_of.append(e)
            if span is not None and begin <= span[0] and span[1] < begin + length:
                labels.append((span[0] - begin + offset, span[1] - begin + offset))
            else:
                labels.append((0, 0))  # no answer in this window: the [CLS] span
            if not train:
                n = len(sequences[-1])
                for name, values, fill in (
                    ("char_start", char_start, -1),
                    ("char_end", char_end, -1),
                    ("max_context", best[w], False),
                ):
                    row = np.full(n, fill, dtype=values.dtype)
                    row[offset : offset + length] = values[begin : begin + length] if name != "max_context" else values
                    getattr(out, name).append(row)
    out.encoded = pack(sequences, np.asarray(labels, dtype=np.int64).reshape(-1, 2))
    out.example = np.asarray(example_of, dtype=np.int64)
    if not train:
        out.contexts = [x.context for x in examples]
    return out


def decode(
    windows: SquadWindows, start_logits: list[np.ndarray], end_logits: list[np.ndarray], cfg: SquadSettings
) -> dict[str, str]:
    """Every question's answer: the best-scoring valid span over its windows (start + end logit,
    n_best candidates each side, end >= start, at most max_answer_len tokens, inside the context,
    the start token in its max-context window, at least one character), or "" when the null score (the [CLS] span, the
    smallest over the windows) beats it by more than null_threshold."""
    best_score = np.full(len(windows.qids), -np.inf)
    best_chars = [(0, 0)] * len(windows.qids)
    null = np.full(len(windows.qids), np.inf)
    for w, e in enumerate(windows.example):
        s, t = start_logits[w], end_logits[w]
        null[e] = min(null[e], float(s[0] + t[0]))
        first, last, best = windows.char_start[w], windows.char_end[w], windows.max_context[w]
        k = min(cfg.n_best, len(s))
        si, ei = np.meshgrid(np.argsort(-s, kind="stable")[:k], np.argsort(-t, kind="stable")[:k], indexing="ij")
        # A span must cover at least one character: a lone "▁" piece covers none, and an empty span would
        # read as "no answer" although the null score lost (BERT and transformers skip such spans too).
        ok = (
            (first[si] >= 0)
            & (first[ei] >= 0)
            & best[si]
            & (ei >= si)
            & (ei - si < cfg.max_answer_len)
            & (last[ei] > first[si])
        )
        if not ok.any():
            continue
        scores = np.where(ok, s[si] + t[ei], -np.inf)
        i, j = np.unravel_index(np.argmax(scores), scores.shape)
        if scores[i, j] > best_score[e]:
            best_score[e] = scores[i, j]
            best_chars[e] = (int(first[si[i, j]]), int(last[ei[i, j]]))
    predictions = {}
    for e, qid in enumerate(windows.qids):
        if not np.isfinite(best_score[e]) or null[e] - best_score[e] > cfg.null_threshold:
            predictions[qid] = ""
        else:
            a, b = best_chars[e]
            predictions[qid] = windows.contexts[e][a:b]
    return predictions


__all__ = ["SquadWindows", "answer_tokens", "decode", "max_context", "split_words", "squad_windows", "word_pieces"]
