"""The vocab stage: a sentencepiece BPE model with fixed special ids, and the Tokenizer that uses it.

    from electralab.data.vocab import train_vocab, Tokenizer
    metrics = train_vocab("data/corpus", "data/vocab", params.active.vocab)
    tok = Tokenizer("data/vocab")
    tok.encode("Hello world")            # -> [..] ids, normalised like the corpus (cased/uncased)

Special pieces and ids (electralab.SPECIAL_TOKENS, the data contract): [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3
(sentencepiece's pad/unk/bos/eos) and [MASK]=4 (a user-defined symbol, so "[MASK]" in text encodes to 4).
The ids are checked after training.

Training streams the corpus's paragraphs as sentences through an iterator (never the whole corpus in
memory) and hands sentencepiece at most `input_sentence_size` of them, drawn without replacement with
`seed`, so memory and training time stay bounded for a 16 GB corpus. We sample ourselves because
sentencepiece 0.2.3's own sampling (`shuffle_input_sentence`) does not follow
`spm.set_random_generator_seed` and gives another model in every process; fed no more sentences than
it keeps, it samples nothing. With the same corpus and config (`threads` included: the thread count
changes the merges) the model file is byte-identical.

Output (`out_dir`): spm.model, spm.vocab, electralab_tokenizer.json (uncased flag, vocab size, ids, model sha256).
"""

from __future__ import annotations

import hashlib
import io
import re
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import sentencepiece as spm

from electralab import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID
from electralab.config import VocabConfig
from electralab.data import read_manifest
from electralab.data.corpus import iter_documents, read_corpus_manifest
from electralab.data.progress import byte_bar, summary
from electralab.data.text import normalize
from electralab.errors import ConfigError, DataError
from electralab.io import atomic_dir, write_json

MODEL_FILE = "spm.model"
VOCAB_FILE = "spm.vocab"
# Our manifest; "tokenizer.json" is the name transformers reads as a `tokenizers` file (data/hf_tokenizer.py).
TOKENIZER_FILE = "electralab_tokenizer.json"
# Paragraphs used to report characters per token and the [UNK] rate of the new vocabulary.
EVAL_PARAGRAPHS = 2000


def corpus_sentences(corpus_dir: Path, manifest: dict, cfg: VocabConfig, counts: dict) -> Iterator[str]:
    """The corpus's paragraphs as training sentences, streamed: all of them, or exactly
    `input_sentence_size` drawn without replacement with `seed` when there are more. Paragraphs longer
    than `max_sentence_length` bytes are counted and skipped (sentencepiece would skip them too)."""
    n = manifest["paragraphs"]
    keep = None
    if n > cfg.input_sentence_size:
        keep = np.sort(np.random.default_rng(cfg.seed).choice(n, cfg.input_sentence_size, replace=False))
    index = 0  # of the paragraph in the corpus
    next_keep = 0  # position in `keep` of the next paragraph to use
    with byte_bar("vocab: reading", manifest["bytes"]) as bar:
        for doc in iter_documents(corpus_dir, manifest):
            bar.update(len(doc.encode("utf-8")))
            for p in doc.split("\n"):
                chosen = keep is None or (next_keep < len(keep) and keep[next_keep] == index)
                index += 1
                if not chosen:
                    continue
                next_keep += 1
                if len(p) * 4 > cfg.max_sentence_length and len(p.encode("utf-8")) > cfg.max_sentence_length:
                    counts["skipped_too_long"] += 1
                    continue
                counts["sentences"] += 1
                yield p


def train_vocab(corpus_dir: str | Path, out_dir: str | Path, cfg: VocabConfig, where: str = "vocab") -> dict:
    """Train the BPE model on the corpus and write it to `out_dir`; returns metrics."""
    started = time.perf_counter()
    corpus_dir = Path(corpus_dir)
    manifest = read_corpus_manifest(corpus_dir)
    counts = {"sentences": 0, "skipped_too_long": 0}
    with atomic_dir(out_dir) as tmp:
        spm.set_random_generator_seed(cfg.seed)  # for anything else in sentencepiece that draws
        # model_writer, not model_prefix: the prefix (a random temporary path) would be stored in the
        # model and make two identical trainings differ byte for byte.
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=corpus_sentences(corpus_dir, manifest, cfg, counts),
                model_writer=model,
                model_type=cfg.model_type,
                vocab_size=cfg.size,
                character_coverage=cfg.character_coverage,
                # We sample (corpus_sentences): sentencepiece 0.2.3's own sampling ignores
                # set_random_generator_seed and differs from process to process.
                input_sentence_size=cfg.input_sentence_size,
                shuffle_input_sentence=False,
                max_sentence_length=cfg.max_sentence_length,
                num_threads=cfg.threads,
                # Our text.normalize already did everything; sentencepiece adds nothing.
                normalization_rule_name="identity",
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=CLS_ID,
                eos_id=SEP_ID,
                pad_piece=SPECIAL_TOKENS[PAD_ID],
                unk_piece=SPECIAL_TOKENS[UNK_ID],
                bos_piece=SPECIAL_TOKENS[CLS_ID],
                eos_piece=SPECIAL_TOKENS[SEP_ID],
                user_defined_symbols=[SPECIAL_TOKENS[MASK_ID]],
                minloglevel=2,  # its INFO/WARNING lines drown the progress bar; errors still raise
            )
        except RuntimeError as e:
            raise _explain(e, cfg, where, corpus_dir) from None
        (tmp / MODEL_FILE).write_bytes(model.getvalue())
        sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
        _check_special_ids(sp)
        # What spm would write as spm.vocab (piece <tab> score), for people reading the vocabulary.
        (tmp / VOCAB_FILE).write_text(
            "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.vocab_size())), encoding="utf-8"
        )
        tokenizer_info = {
            "format": "electralab.tokenizer/1",
            "model": MODEL_FILE,
            "model_sha256": hashlib.sha256(model.getvalue()).hexdigest(),
            "uncased": manifest["uncased"],
            "vocab_size": sp.vocab_size(),
            "special_ids": {tok: i for i, tok in enumerate(SPECIAL_TOKENS)},
        }
        write_json(tmp / TOKENIZER_FILE, tokenizer_info)
        metrics = {"vocab_size": sp.vocab_size(), **counts, **_quality(sp, iter_documents(corpus_dir, manifest))}
    metrics["seconds"] = round(time.perf_counter() - started, 3)
    summary(
        "vocab",
        f"{cfg.model_type} {metrics['vocab_size']:,} pieces from {counts['sentences']:,} "
        f"sentences (sampled up to {cfg.input_sentence_size:,}), {metrics['chars_per_token']:.2f} "
        f"chars/token -> {out_dir}",
        started,
    )
    return metrics


def _explain(e: RuntimeError, cfg: VocabConfig, where: str, corpus_dir: Path) -> Exception:
    """sentencepiece's errors, in terms of our config keys."""
    m = re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", str(e))
    if m:
        return ConfigError(
            f"{where}.size={cfg.size} is more than the corpus in {corpus_dir} supports: "
            f"sentencepiece can make at most {m.group(2)} pieces from it; lower the size "
            f"or use a larger corpus"
        )
    if "No valid sentence" in str(e) or "empty" in str(e).lower():
        return DataError(f"{corpus_dir}: no usable sentences for sentencepiece ({e})")
    return DataError(f"sentencepiece failed on {corpus_dir} with {where}: {e}")


def _check_special_ids(sp: spm.SentencePieceProcessor) -> None:
    for i, piece in enumerate(SPECIAL_TOKENS):
        if sp.piece_to_id(piece) != i:
            raise RuntimeError(f"sentencepiece put {piece} at id {sp.piece_to_id(piece)}, not {i}")


def _quality(sp: spm.SentencePieceProcessor, docs: Iterator[str]) -> dict:
    """Characters per token and [UNK] rate on the first EVAL_PARAGRAPHS paragraphs."""
    paragraphs: list[str] = []
    for doc in docs:
        paragraphs.extend(doc.split("\n"))
        if len(paragraphs) >= EVAL_PARAGRAPHS:
            break
    ids = sp.encode(paragraphs[:EVAL_PARAGRAPHS])
    tokens = sum(map(len, ids))
    unk = sum(row.count(UNK_ID) for row in ids)
    chars = sum(map(len, paragraphs[:EVAL_PARAGRAPHS]))
    return {"chars_per_token": round(chars / max(tokens, 1), 4), "unk_rate": round(unk / max(tokens, 1), 6)}


class Tokenizer:
    """The project's tokenizer: text.normalize (cased/uncased as the corpus was) + the sentencepiece BPE.

    tok = Tokenizer("data/vocab")
    ids = tok.encode("The Café")          # list[int], no [CLS]/[SEP] added
    tok.decode(ids)                        # "the cafe" for an uncased vocab
    """

    pad_id, unk_id, cls_id, sep_id, mask_id = PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID

    def __init__(self, vocab_dir: str | Path):
        vocab_dir = Path(vocab_dir)
        self.info = read_manifest(vocab_dir / TOKENIZER_FILE, "vocab")
        self.model_path = vocab_dir / self.info["model"]
        self.uncased: bool = self.info["uncased"]
        self.sp = spm.SentencePieceProcessor(model_file=str(self.model_path))
        _check_special_ids(self.sp)

    @property
    def vocab_size(self) -> int:
        return self.sp.vocab_size()

    def normalize(self, text: str) -> str:
        """text.normalize, except that a literal "[MASK]" survives (uncased would lowercase it)."""
        mask = SPECIAL_TOKENS[MASK_ID]
        if mask not in text:
            return normalize(text, self.uncased)
        return mask.join(self._normalize_keeping_edges(part) for part in text.split(mask)).strip()

    def _normalize_keeping_edges(self, part: str) -> str:
        """normalize(), keeping one space where `part` began or ended with whitespace."""
        core = normalize(part, self.uncased)
        lead = " " if part[:1].isspace() else ""
        trail = " " if part[-1:].isspace() and core else ""
        return lead + core + trail

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(self.normalize(text))

    def encode_batch(self, texts: list[str], num_threads: int = -1) -> list[list[int]]:
        return self.sp.encode([self.normalize(t) for t in texts], num_threads=num_threads)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; [PAD]/[CLS]/[SEP] decode to nothing, [MASK] to "[MASK]"."""
        return self.sp.decode(list(map(int, ids)))

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))
