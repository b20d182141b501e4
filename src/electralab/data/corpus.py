"""The corpus stage: documents from the Hugging Face hub or a local mirror -> normalised Parquet parts.

    from electralab.data.corpus import build_corpus
    stats = build_corpus(params.active.corpus, "data/corpus", data_root=Path("../shared/data"))

Sources (docs/data.md lists the hub datasets per preset):
    hub     `datasets.load_dataset(path, name, split=..., streaming=True)`: streaming keeps disk and memory
            bounded; used when ELECTRALAB_DATA is not set.
    mirror  `$ELECTRALAB_DATA/corpus/<file>`, UTF-8 text in one of two formats:
              paragraphs  one paragraph per line, a blank line between documents (first line: the title)
              wikitext    WikiText raw lines; an article starts at a level-1 heading " = Title = ";
                          " = = Section = = " lines are sub-headings inside it
Several sources are interleaved document by document, so `max_documents` takes from all of them.

Output (`out_dir`, written to a temporary directory and renamed at the end):
    part-00000.parquet ...  one row per document: text (normalised paragraphs joined by "\\n"), source
    manifest.json           uncased flag, counts, per-part sha256: what the vocab and shards stages read
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from electralab.config import CorpusConfig, HubSource, to_dict
from electralab.data import MANIFEST, read_manifest
from electralab.data.progress import byte_bar, megabytes, summary
from electralab.data.text import normalize
from electralab.errors import DataError
from electralab.io import atomic_dir, sha256_file, write_json

# Parquet row groups of about this many characters: the unit of work of the shards stage's workers,
# small enough that a worker's memory stays bounded whatever the document lengths.
ROW_GROUP_CHARS = 4_000_000

Document = list[str]  # raw paragraphs of one document, in order


# --------------------------------------------------------------------------------------------
# Reading sources
# --------------------------------------------------------------------------------------------


def mirror_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 file; a byte sequence that is not UTF-8 stops with its line number."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
    with f:
        for number, raw in enumerate(f, 1):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}: line {number} is not valid UTF-8 (byte {e.start} of the line: "
                    f"{raw[e.start : e.start + 4]!r}); the mirror must hold UTF-8 text"
                ) from None


def paragraph_documents(lines: Iterable[str]) -> Iterator[Document]:
    """One paragraph per line, documents separated by blank lines."""
    doc: Document = []
    for line in lines:
        if line.strip():
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def wikitext_documents(lines: Iterable[str]) -> Iterator[Document]:
    """WikiText: " = Title = " starts an article (the title is its first paragraph); " = = Sub = = "
    headings become paragraphs without their "=" marks; blank lines are ignored."""
    doc: Document = []
    for line in lines:
        s = line.strip()
        if not s:
            continue
        if s.startswith("= ") and s.endswith(" =") and not s.startswith("= ="):
            if doc:
                yield doc
            doc = [s.strip(" =")]
        elif s.startswith("= =") and s.endswith("= ="):
            doc.append(s.strip(" ="))
        else:
            doc.append(line)
    if doc:
        yield doc


def hub_documents(src: HubSource, where: str) -> Iterator[Document]:
    """Documents streamed from the Hugging Face hub (rows are documents, WikiText lines or sentences)."""
    import datasets  # imported here: a second of start-up that the mirror path does not need

    try:
        ds = datasets.load_dataset(src.path, src.name, split=src.split, streaming=True)
    except Exception as e:  # network, missing dataset, gated dataset: all end here with the same advice
        raise DataError(
            f"{where}: cannot open hub dataset {src.path!r} (name={src.name!r}, "
            f"split={src.split!r}): {type(e).__name__}: {e}. Offline? Set ELECTRALAB_DATA "
            f"to a local mirror (docs/data.md)"
        ) from None

    def texts() -> Iterator[str]:
        for row in ds:
            if src.text_field not in row:
                raise DataError(
                    f"{where}.text_field={src.text_field!r}: hub dataset {src.path!r} has "
                    f"no such column (columns: {', '.join(row)})"
                )
            yield row[src.text_field] or ""

    if src.format == "wikitext":
        yield from wikitext_documents(texts())
    elif src.format == "sentences":
        doc: Document = []
        for text in texts():
            if text.strip():
                doc.append(text)
            if len(doc) == src.sentences_per_document:
                yield doc
                doc = []
        if doc:
            yield doc
    else:
        for text in texts():
            paragraphs = [p for p in text.split("\n") if p.strip()]
            if paragraphs:
                yield paragraphs


def open_sources(
    cfg: CorpusConfig, root: Path | None, where: str
) -> tuple[list[tuple[str, Iterator[Document]]], int | None]:
    """[(source name, documents)] and the total input bytes when known (mirror files), checked up front
    so that a missing file stops the stage before any work."""
    if root is None:
        if not cfg.hub:
            raise DataError(
                f"{where}.hub is empty and ELECTRALAB_DATA is not set: name a hub dataset "
                f"or point ELECTRALAB_DATA at a local mirror"
            )
        return [
            (f"{s.path}:{s.name or ''}:{s.split}", hub_documents(s, f"{where}.hub[{i}]")) for i, s in enumerate(cfg.hub)
        ], None
    corpus_dir = root / "corpus"
    if not corpus_dir.is_dir():
        raise DataError(
            f"{corpus_dir}: no such directory (ELECTRALAB_DATA={root} must hold corpus/*.txt, see docs/data.md)"
        )
    if not cfg.mirror:
        raise DataError(f"{where}.mirror is empty: name at least one file under {corpus_dir}")
    sources, total = [], 0
    for i, m in enumerate(cfg.mirror):
        path = corpus_dir / m.file
        if not path.is_file():
            raise DataError(f"{path}: no such file (named by {where}.mirror[{i}].file={m.file!r})")
        total += path.stat().st_size
        parse = wikitext_documents if m.format == "wikitext" else paragraph_documents
        sources.append((m.file, parse(mirror_lines(path))))
    return sources, total


def interleave(sources: list[tuple[str, Iterator[Document]]]) -> Iterator[tuple[str, Document]]:
    """Round-robin over sources, one document at a time, until all are exhausted."""
    active = list(sources)
    while active:
        for source in list(active):
            name, docs = source
            doc = next(docs, None)
            if doc is None:
                active.remove(source)
            else:
                yield name, doc


# --------------------------------------------------------------------------------------------
# Writing Parquet parts
# --------------------------------------------------------------------------------------------


class _PartWriter:
    """Documents -> part-NNNNN.parquet files of `per_file` documents, in row groups of ~ROW_GROUP_CHARS."""

    schema = pa.schema([("text", pa.string()), ("source", pa.string())])

    def __init__(self, out_dir: Path, per_file: int):
        self.out_dir, self.per_file = out_dir, per_file
        self.parts: list[dict] = []
        self._writer: pq.ParquetWriter | None = None
        self._texts: list[str] = []
        self._sources: list[str] = []
        self._chars = 0
        self._in_file = 0

    def add(self, text: str, source: str) -> None:
        if self._writer is None:
            name = f"part-{len(self.parts):05d}.parquet"
            self._writer = pq.ParquetWriter(self.out_dir / name, self.schema)
            self.parts.append({"file": name, "documents": 0})
        self._texts.append(text)
        self._sources.append(source)
        self._chars += len(text)
        self._in_file += 1
        if self._chars >= ROW_GROUP_CHARS:
            self._flush()
        if self._in_file == self.per_file:
            self._close_file()

    def _flush(self) -> None:
        if self._texts:
            self._writer.write_table(pa.table({"text": self._texts, "source": self._sources}, self.schema))
            self.parts[-1]["documents"] += len(self._texts)
        self._texts, self._sources, self._chars = [], [], 0

    def _close_file(self) -> None:
        self._flush()
        self._writer.close()
        self._writer, self._in_file = None, 0
        part = self.parts[-1]
        path = self.out_dir / part["file"]
        part["bytes"] = path.stat().st_size
        part["sha256"] = sha256_file(path)

    def close(self) -> list[dict]:
        if self._writer is not None:
            self._close_file()
        return self.parts


# --------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------


def build_corpus(cfg: CorpusConfig, out_dir: str | Path, data_root: Path | None, where: str = "corpus") -> dict:
    """Read, normalise and write the corpus; returns the stats (also the DVC metrics).

    `data_root` is the local mirror ($ELECTRALAB_DATA) or None for the hub; `where` is the config key
    path used in error messages (e.g. "presets.tiny.corpus").
    """
    started = time.perf_counter()
    sources, total_bytes = open_sources(cfg, data_root, where)
    stats = {"documents": 0, "paragraphs": 0, "characters": 0, "bytes": 0, "input_bytes": 0}
    per_source = {name: 0 for name, _ in sources}
    with atomic_dir(out_dir) as tmp, byte_bar("corpus", total_bytes) as bar:
        writer = _PartWriter(tmp, cfg.shard_documents)
        for name, paragraphs in interleave(sources):
            raw_bytes = sum(len(p.encode("utf-8")) for p in paragraphs)
            bar.update(raw_bytes)
            stats["input_bytes"] += raw_bytes
            clean = [p for p in (normalize(p, cfg.uncased) for p in paragraphs) if p]
            if not clean:
                continue
            text = "\n".join(clean)
            writer.add(text, name)
            per_source[name] += 1
            stats["documents"] += 1
            stats["paragraphs"] += len(clean)
            stats["characters"] += len(text)
            stats["bytes"] += len(text.encode("utf-8"))
            if stats["documents"] % 1000 == 0:
                bar.set_postfix_str(f"{stats['documents']:,} docs", refresh=False)
            if cfg.max_documents is not None and stats["documents"] >= cfg.max_documents:
                break
        parts = writer.close()
        if stats["documents"] == 0:
            raise DataError(f"{', '.join(per_source)}: no documents (empty, or only blank lines)")
        write_json(
            tmp / MANIFEST,
            {
                "format": "electralab.corpus/1",
                "uncased": cfg.uncased,
                **stats,
                "sources": per_source,
                "parts": parts,
                "config": to_dict(cfg),
            },
        )
    stats["seconds"] = round(time.perf_counter() - started, 3)
    stats["mb_per_s"] = round(stats["input_bytes"] / 1e6 / max(stats["seconds"], 1e-9), 2)
    summary(
        "corpus",
        f"{stats['documents']:,} documents, {stats['characters']:,} characters, "
        f"{megabytes(stats['bytes'])} from {len(sources)} source(s) -> {out_dir}",
        started,
    )
    return stats


def read_corpus_manifest(corpus_dir: str | Path) -> dict:
    return read_manifest(Path(corpus_dir) / MANIFEST, "corpus")


def iter_documents(corpus_dir: str | Path, manifest: dict | None = None, batch_size: int = 1024) -> Iterator[str]:
    """The corpus's documents (normalised text, paragraphs joined by "\\n") in order, streamed."""
    corpus_dir = Path(corpus_dir)
    manifest = manifest or read_corpus_manifest(corpus_dir)
    for part in manifest["parts"]:
        pf = pq.ParquetFile(corpus_dir / part["file"])
        for batch in pf.iter_batches(batch_size=batch_size, columns=["text"]):
            yield from batch.column(0).to_pylist()
