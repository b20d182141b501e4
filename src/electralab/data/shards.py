"""The shards stage: tokenise the corpus in parallel and pack it into memory-mapped seq_len blocks.

    from electralab.data.shards import build_shards
    metrics = build_shards("data/corpus", "data/vocab", "data/shards", params.active.shards)

Packing (RoBERTa's FULL-SENTENCES, at token granularity): the documents of a split form one stream
"doc1 [SEP] doc2 [SEP] ...", cut into consecutive pieces of seq_len - 2 tokens; each block is
[CLS] + piece + [SEP]. A document continues into the next block, no token is dropped and only the very
last block of a split is padded with [PAD]. Unlike RoBERTa we cut at any token, not at a sentence end:
no padding anywhere but once, and the stage needs no sentence splitter (docs/data.md has the reasoning).

Validation split: round(validation_fraction * documents) whole documents (at least one when the fraction
is > 0), drawn with `seed`; no document straddles the two splits.

Output (`out_dir`, written to a temporary directory and renamed at the end):
    train-00000.bin ...        blocks of one split, raw little-endian uint16 (uint32 when the vocabulary
    validation-00000.bin ...   has more than 65,536 ids), row-major (blocks, seq_len): np.memmap-able
    *.copy-NN.ids.bin / .mask.bin   static masking only: copy NN's masked ids (same dtype) and its
                               mlm_mask as np.packbits rows (ceil(seq_len / 8) bytes per block)
    manifest.json              counts, per-file sha256, dtype, seq_len, vocab size, config hash

Speed: workers read Parquet row groups themselves and encode word by word through a cache
(WordCachedEncoder), returning numpy arrays; the main process only packs and writes. docs/findings.md
("Speed") has the figures against a plain `datasets.map` baseline.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sentencepiece as spm

from electralab import CLS_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS
from electralab.config import ShardsConfig, StaticMaskingConfig, to_dict
from electralab.data import MANIFEST, read_manifest
from electralab.data.corpus import read_corpus_manifest
from electralab.data.progress import byte_bar, megabytes, summary
from electralab.data.vocab import Tokenizer
from electralab.errors import DataError
from electralab.io import atomic_dir, sha256_file, write_json

SPLITS = ("train", "validation")
# Words kept by each worker's cache before it starts afresh: bounds the cache (~20 MB of Arrow and numpy
# arrays) on any corpus, while the frequent words that make up most tokens are back within a row group.
WORD_CACHE_MAX = 500_000


def token_dtype(vocab_size: int) -> np.dtype:
    """Little-endian uint16 when every id fits, else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def validation_documents(n_docs: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of the documents that form the validation split."""
    if fraction <= 0 or n_docs < 2:
        return np.empty(0, np.int64)
    k = min(n_docs - 1, max(1, round(fraction * n_docs)))
    return np.sort(np.random.default_rng(seed).choice(n_docs, size=k, replace=False))


# --------------------------------------------------------------------------------------------
# Tokenising (runs in the worker processes)
# --------------------------------------------------------------------------------------------


class WordCachedEncoder:
    """sentencepiece ids of whole documents, word by word through a cache; exactly sentencepiece's output.

    Why it is exact: the BPE model is trained with split_by_whitespace (sentencepiece's default) and
    identity normalisation, so no piece spans a space (U+0020, the only whitespace sentencepiece knows
    then), and the corpus holds single spaces between words (text.normalize). Encoding a paragraph
    therefore equals concatenating the encodings of its space-separated words, each with the "▁" prefix
    it has in the paragraph. tests/test_data_shards.py checks it against Tokenizer.encode on real text.

    Why it is fast: in natural text most tokens come from frequent words. Splitting and looking words up
    run in Arrow's C++ kernels (no Python object per word); sentencepiece sees each distinct word once per
    cache lifetime; the ids are gathered with numpy.

    The cache: known word i (`words[i]`) has ids `store[starts[i] : starts[i] + lengths[i]]`.
    """

    def __init__(self, model_path: str | Path, max_entries: int = WORD_CACHE_MAX):
        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.max_entries = max_entries
        self._reset()

    def _reset(self) -> None:
        self.words = pa.array([], pa.string())
        self.starts = np.zeros(0, np.int32)  # int32: the cache is reset long before 2**31 ids
        self.lengths = np.zeros(0, np.int32)
        self.store = np.zeros(0, np.int32)

    def _add(self, words: pa.Array) -> None:
        encoded = self.sp.encode(words.to_pylist(), num_threads=1)  # parallelism: the worker processes
        lengths = np.fromiter(map(len, encoded), np.int32, count=len(encoded))
        flat = np.fromiter(itertools.chain.from_iterable(encoded), np.int32, count=int(lengths.sum()))
        self.starts = np.concatenate([self.starts, len(self.store) + np.cumsum(lengths, dtype=np.int32) - lengths])
        self.lengths = np.concatenate([self.lengths, lengths])
        self.store = np.concatenate([self.store, flat])
        self.words = pa.concat_arrays([self.words, words])

    def encode_documents(self, docs: pa.Array) -> np.ndarray:
        """Documents (Arrow strings, paragraphs joined by "\\n") -> (N,) int32 stream
        doc1 ids, [SEP], doc2 ids, [SEP], ..."""
        per_doc = pc.split_pattern(pc.replace_substring(docs, "\n", " "), " ")  # list<word> per doc
        words = pc.list_flatten(per_doc)  # (W,)
        if len(self.words) > self.max_entries:
            self._reset()
        found = pc.index_in(words, value_set=self.words)  # (W,) null = new word
        slots = pc.fill_null(found, -1).to_numpy(zero_copy_only=False, writable=True)  # (W,) int32
        if found.null_count:
            new = pc.is_null(found)
            new_words = words.filter(new)
            missing = pc.unique(new_words)
            first = len(self.words)
            self._add(missing)
            # Look the new words up among themselves only: far cheaper than hashing all known words again.
            slots[new.to_numpy(zero_copy_only=False)] = first + pc.index_in(new_words, value_set=missing).to_numpy()
        lengths = self.lengths[slots]  # (W,)
        # Gather: token j of word w sits at store[starts[w] + j] and goes to ids[word_start[w] + j].
        word_end = np.cumsum(lengths, dtype=np.int32)
        shift = self.starts[slots] - (word_end - lengths)  # (W,) store index - ids index
        ids = self.store[np.repeat(shift, lengths) + np.arange(int(lengths.sum()), dtype=np.int32)]
        # A [SEP] after each document's last token.
        words_per_doc = pc.list_value_length(per_doc).to_numpy(zero_copy_only=False)
        doc_end = np.concatenate([[0], word_end])[np.cumsum(words_per_doc)]
        return np.insert(ids, doc_end, SEP_ID)


_encoder: WordCachedEncoder | None = None
_validation: np.ndarray = np.empty(0, np.int64)
_parquet: dict[str, pq.ParquetFile] = {}


def _init_worker(model_path: str, validation: np.ndarray) -> None:
    global _encoder, _validation
    _encoder, _validation = WordCachedEncoder(model_path), validation
    _parquet.clear()


def _encode_row_group(task: tuple[str, int, int]) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """One Parquet row group -> (train stream, validation stream, train docs, validation docs, bytes)."""
    path, row_group, first_doc = task
    if path not in _parquet:
        _parquet[path] = pq.ParquetFile(path)
    texts = _parquet[path].read_row_group(row_group, columns=["text"]).column(0).combine_chunks()
    is_val = np.isin(np.arange(first_doc, first_doc + len(texts)), _validation)
    train, val = texts.filter(pa.array(~is_val)), texts.filter(pa.array(is_val))
    n_bytes = pc.sum(pc.binary_length(texts)).as_py() or 0
    return _encoder.encode_documents(train), _encoder.encode_documents(val), len(train), len(val), n_bytes


def _row_groups(corpus_dir: Path, manifest: dict) -> list[tuple[str, int, int]]:
    """(parquet path, row group, index of its first document) for every row group, in corpus order."""
    tasks, first = [], 0
    for part in manifest["parts"]:
        path = corpus_dir / part["file"]
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            tasks.append((str(path), rg, first))
            first += meta.row_group(rg).num_rows
    return tasks


def encode_corpus(
    corpus_dir: Path, manifest: dict, model_path: Path, validation: np.ndarray, workers: int
) -> Iterator[tuple[np.ndarray, np.ndarray, int, int, int]]:
    """Encoded row groups in corpus order, from `workers` processes (in this process when 1)."""
    tasks = _row_groups(corpus_dir, manifest)
    init_args = (str(model_path), validation)
    if workers == 1 or len(tasks) == 1:  # one process: no start-up cost for small corpora
        _init_worker(*init_args)
        yield from map(_encode_row_group, tasks)
        return
    # fork where there is one: workers start in milliseconds instead of re-importing everything (a second
    # each), which matters for small corpora. Safe here: a worker uses only numpy, Arrow and sentencepiece,
    # never a thread pool inherited from the parent (Arrow re-creates its pools after a fork).
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(min(workers, len(tasks)), initializer=_init_worker, initargs=init_args) as pool:
        yield from pool.imap(_encode_row_group, tasks)
        pool.close()  # the workers end on their own: the `with`'s terminate() then has none to SIGTERM
        pool.join()


# --------------------------------------------------------------------------------------------
# Packing and writing (main process)
# --------------------------------------------------------------------------------------------


class HashedFile:
    """A binary file written in pieces, its sha256 computed on the way (no second read)."""

    def __init__(self, path: Path):
        self._f, self._sha = open(path, "wb"), hashlib.sha256()

    def write(self, data: bytes) -> None:
        self._f.write(data)
        self._sha.update(data)

    def close(self) -> str:
        self._f.close()
        return self._sha.hexdigest()


class BlockWriter:
    """Packs one split's token stream into [CLS] + (seq_len - 2) tokens + [SEP] blocks and writes them to
    <split>-NNNNN.bin files of at most `blocks_per_shard` blocks."""

    def __init__(self, out_dir: Path, split: str, seq_len: int, dtype: np.dtype, blocks_per_shard: int):
        self.out_dir, self.split, self.seq_len, self.dtype = out_dir, split, seq_len, dtype
        self.body = seq_len - 2
        self.blocks_per_shard = blocks_per_shard
        self.rest = np.empty(0, np.int32)  # tokens waiting for the next block, < body of them
        self.files: list[dict] = []  # manifest entries: file, blocks, sha256
        self.documents = self.padding = 0
        self._file: HashedFile | None = None

    def add(self, stream: np.ndarray, documents: int) -> None:
        self.documents += documents
        buf = np.concatenate([self.rest, stream]) if len(self.rest) else stream
        n = len(buf) // self.body
        if n:
            self._write(self._frame(buf[: n * self.body].reshape(n, self.body)))
        self.rest = buf[n * self.body :].copy()

    def _frame(self, body: np.ndarray) -> np.ndarray:
        """(n, body) stream pieces -> (n, seq_len) blocks [CLS] piece [SEP]."""
        out = np.empty((len(body), self.seq_len), self.dtype)
        out[:, 0] = CLS_ID
        out[:, 1:-1] = body
        out[:, -1] = SEP_ID
        return out

    def _write(self, blocks: np.ndarray) -> None:
        while len(blocks):
            if self._file is None:
                name = f"{self.split}-{len(self.files):05d}.bin"
                self._file = HashedFile(self.out_dir / name)
                self.files.append({"file": name, "blocks": 0})
            take = min(len(blocks), self.blocks_per_shard - self.files[-1]["blocks"])
            self._file.write(blocks[:take].tobytes())
            self.files[-1]["blocks"] += take
            blocks = blocks[take:]
            if self.files[-1]["blocks"] == self.blocks_per_shard:
                self._close_file()

    def _close_file(self) -> None:
        self.files[-1]["sha256"] = self._file.close()
        self._file = None

    def close(self) -> dict:
        """Write the last, padded block and return the split's manifest entry."""
        if len(self.rest):
            last = np.full((1, self.seq_len), PAD_ID, self.dtype)
            last[0, 0] = CLS_ID
            last[0, 1 : 1 + len(self.rest)] = self.rest
            last[0, 1 + len(self.rest)] = SEP_ID
            self.padding = self.body - len(self.rest)
            self._write(last)
            self.rest = np.empty(0, np.int32)
        if self._file is not None:
            self._close_file()
        blocks = sum(f["blocks"] for f in self.files)
        return {
            "documents": self.documents,
            "blocks": blocks,
            "tokens": blocks * self.seq_len - self.padding,  # real tokens, [CLS]/[SEP] included
            "padding": self.padding,
            "files": self.files,
        }


# --------------------------------------------------------------------------------------------
# Static masking (TEAMS App. B)
# --------------------------------------------------------------------------------------------


def static_mask_names(block_file: str, copy: int) -> tuple[str, str]:
    stem = block_file.removesuffix(".bin")
    return f"{stem}.copy-{copy:02d}.ids.bin", f"{stem}.copy-{copy:02d}.mask.bin"


def write_static_masks(
    out_dir: Path,
    splits: dict,
    sm: StaticMaskingConfig,
    vocab_size: int,
    seq_len: int,
    dtype: np.dtype,
    seed: int,
    chunk_blocks: int = 4096,
) -> None:
    """For each block file and copy c < duplication: the masked ids and the packed mlm_mask of copy c.
    Adds a "static" list to every file entry of `splits`. Seeded by (seed, split, file, copy)."""
    import torch

    from electralab.data.masking import derive_seed, mask_tokens

    for s, info in enumerate(splits.values()):
        for i, entry in enumerate(info["files"]):
            blocks = np.memmap(out_dir / entry["file"], dtype, mode="r", shape=(entry["blocks"], seq_len))
            entry["static"] = []
            for copy in range(sm.duplication):
                generator = torch.Generator().manual_seed(derive_seed(seed, s, i, copy))
                ids_name, mask_name = static_mask_names(entry["file"], copy)
                ids_file, mask_file = HashedFile(out_dir / ids_name), HashedFile(out_dir / mask_name)
                for start in range(0, len(blocks), chunk_blocks):
                    ids = torch.from_numpy(blocks[start : start + chunk_blocks].astype(np.int64))  # (n, T)
                    masked, mlm = mask_tokens(ids, ids != PAD_ID, sm.masking, vocab_size, generator)
                    ids_file.write(masked.numpy().astype(dtype).tobytes())
                    mask_file.write(np.packbits(mlm.numpy(), axis=1).tobytes())  # (n, ceil(T / 8))
                entry["static"].append(
                    {
                        "ids": ids_name,
                        "ids_sha256": ids_file.close(),
                        "mask": mask_name,
                        "mask_sha256": mask_file.close(),
                    }
                )


# --------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------


def config_hash(cfg: ShardsConfig, corpus_manifest: dict, tokenizer_info: dict) -> str:
    """sha256 of what determines the shards' content: the config (less `workers`, which changes only the
    speed) and the checksums of the corpus parts and the vocabulary model."""
    cfg_dict = to_dict(cfg)
    cfg_dict.pop("workers")
    made_from = {
        "shards": cfg_dict,
        "corpus": [p["sha256"] for p in corpus_manifest["parts"]],
        "vocab": tokenizer_info["model_sha256"],
    }
    return hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()


def build_shards(corpus_dir: str | Path, vocab_dir: str | Path, out_dir: str | Path, cfg: ShardsConfig) -> dict:
    """Tokenise, split, pack and write; returns metrics."""
    started = time.perf_counter()
    corpus_dir = Path(corpus_dir)
    corpus = read_corpus_manifest(corpus_dir)
    tok = Tokenizer(vocab_dir)
    if tok.uncased != corpus["uncased"]:
        raise DataError(
            f"{tok.model_path}: the vocabulary is {'un' if tok.uncased else ''}cased but "
            f"{corpus_dir} is {'un' if corpus['uncased'] else ''}cased; rebuild the vocabulary"
        )
    dtype = token_dtype(tok.vocab_size)
    validation = validation_documents(corpus["documents"], cfg.validation_fraction, cfg.seed)

    with atomic_dir(out_dir) as tmp:
        writers = {split: BlockWriter(tmp, split, cfg.seq_len, dtype, cfg.blocks_per_shard) for split in SPLITS}
        tokens = 0
        with byte_bar("shards", corpus["bytes"]) as bar:
            for train, val, n_train, n_val, n_bytes in encode_corpus(
                corpus_dir, corpus, tok.model_path, validation, cfg.workers
            ):
                writers["train"].add(train, n_train)
                writers["validation"].add(val, n_val)
                tokens += len(train) + len(val)
                bar.update(n_bytes)
                bar.set_postfix_str(f"{tokens / 1e6:.1f}M tokens", refresh=False)
        splits = {split: w.close() for split, w in writers.items()}
        if cfg.static_masking.duplication:
            write_static_masks(tmp, splits, cfg.static_masking, tok.vocab_size, cfg.seq_len, dtype, cfg.seed)
        write_json(
            tmp / MANIFEST,
            {
                "format": "electralab.shards/1",
                "packing": "full-sentences",
                "seq_len": cfg.seq_len,
                "dtype": dtype.name,
                "byteorder": "little",
                "vocab_size": tok.vocab_size,
                "special_ids": {t: i for i, t in enumerate(SPECIAL_TOKENS)},
                "config_hash": config_hash(cfg, corpus, tok.info),
                "config": to_dict(cfg),
                "vocab_model_sha256": tok.info["model_sha256"],
                "static_masking": {
                    "duplication": cfg.static_masking.duplication,
                    "masking": to_dict(cfg.static_masking.masking),
                },
                "splits": splits,
            },
        )
    seconds = time.perf_counter() - started
    metrics = {
        f"{split}_{key}": splits[split][key] for split in SPLITS for key in ("documents", "blocks", "tokens", "padding")
    }
    metrics.update(
        seconds=round(seconds, 3),
        mb_per_s=round(corpus["bytes"] / 1e6 / seconds, 2),
        static_copies=cfg.static_masking.duplication,
    )
    summary(
        "shards",
        f"{metrics['train_blocks']:,} train + {metrics['validation_blocks']:,} validation "
        f"blocks of {cfg.seq_len}, {tokens:,} tokens from {megabytes(corpus['bytes'])} "
        f"({metrics['mb_per_s']} MB/s) -> {out_dir}",
        started,
    )
    return metrics


# --------------------------------------------------------------------------------------------
# Reading back: manifest and checksums
# --------------------------------------------------------------------------------------------


def read_shards_manifest(shards_dir: str | Path) -> dict:
    manifest = read_manifest(Path(shards_dir) / MANIFEST, "shards")
    missing = [k for k in ("seq_len", "vocab_size", "dtype", "splits") if k not in manifest]
    if missing:
        raise DataError(
            f"{Path(shards_dir) / MANIFEST}: no {missing[0]!r}; run the shards stage again (dvc repro -f shards)"
        )
    return manifest


def verify_shards(
    shards_dir: str | Path, manifest: dict | None = None, splits: list[str] | None = None, checksums: bool = True
) -> None:
    """Check every file of `splits` (default: all) against the manifest: present, of the size its block
    count gives, and (when `checksums`) with the recorded sha256. Raises DataError naming the file."""
    shards_dir = Path(shards_dir)
    manifest = manifest or read_shards_manifest(shards_dir)
    seq_len, itemsize = manifest["seq_len"], np.dtype(manifest["dtype"]).itemsize
    rebuild = "the shards are corrupt or were modified; rebuild them (dvc repro shards)"
    for split in splits or list(manifest["splits"]):
        for entry in manifest["splits"][split]["files"]:
            expected = [(entry["file"], entry["sha256"], seq_len * itemsize)]
            for copy in entry.get("static", []):
                expected += [
                    (copy["ids"], copy["ids_sha256"], seq_len * itemsize),
                    (copy["mask"], copy["mask_sha256"], (seq_len + 7) // 8),
                ]
            for name, sha, row_bytes in expected:
                path = shards_dir / name
                if not path.is_file():
                    raise DataError(f"{path}: missing, but listed in {shards_dir / MANIFEST}; {rebuild}")
                size = path.stat().st_size
                if size != entry["blocks"] * row_bytes:
                    raise DataError(
                        f"{path}: {size} bytes, but the manifest's {entry['blocks']} blocks make "
                        f"{entry['blocks'] * row_bytes}; {rebuild}"
                    )
                if checksums and (actual := sha256_file(path)) != sha:
                    raise DataError(f"{path}: sha256 {actual} does not match the manifest's {sha}; {rebuild}")
