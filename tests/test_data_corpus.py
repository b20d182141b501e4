"""corpus stage: normalisation, the mirror's two formats, the hub reader (on a local dataset), bad input."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ENWIKI, WIKITEXT, assert_no_output

from electralab.config import CorpusConfig, HubSource, MirrorSource
from electralab.data.corpus import build_corpus, iter_documents, read_corpus_manifest, wikitext_documents
from electralab.data.text import normalize
from electralab.errors import DataError

# ---- normalisation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, uncased, expected",
    [
        ("  Café\tMÜNCHEN\n", True, "cafe munchen"),  # BERT-uncased: lowercase, strip accents
        ("  Café\tMÜNCHEN\n", False, "Café MÜNCHEN"),  # cased keeps them
        ("Cafe\u0301", False, "Café"),  # cased composes (NFC)
        ("Ångström Œuvre naïve", True, "angstrom œuvre naive"),
        ("soft\u00adhyphen zero\u200bwidth ctrl\x01x", False, "softhyphen zerowidth ctrlx"),  # Cf/Cc dropped
        ("a\u3000b\u2028c\xa0d", False, "a b c d"),  # any Unicode whitespace -> one space
        ("한국어", True, "한국어"),  # Hangul recomposed after NFD
        ("", True, ""),
    ],
)
def test_normalize(text, uncased, expected):
    assert normalize(text, uncased) == expected


# ---- reading the mirror -------------------------------------------------------------------------


def count_wikitext_articles(path) -> int:
    return sum(
        1
        for line in open(path, encoding="utf-8")
        if line.strip().startswith("= ") and not line.strip().startswith("= =")
    )


def count_paragraph_documents(path) -> int:
    text = open(path, encoding="utf-8").read()
    return len([d for d in text.split("\n\n") if d.strip()])


def test_corpus_from_mirror(mirror, corpus_dir):
    manifest = read_corpus_manifest(corpus_dir)
    n_wiki = count_wikitext_articles(mirror / "corpus" / WIKITEXT)
    n_enwiki = count_paragraph_documents(mirror / "corpus" / ENWIKI)
    assert (n_wiki, n_enwiki) == (14, 30)
    assert manifest["sources"] == {WIKITEXT: n_wiki, ENWIKI: n_enwiki}
    assert manifest["documents"] == n_wiki + n_enwiki
    assert manifest["uncased"] is True
    assert len(manifest["parts"]) == 3  # shard_documents=20 -> 20 + 20 + 4

    docs = list(iter_documents(corpus_dir))
    assert len(docs) == manifest["documents"]
    assert sum(map(len, docs)) == manifest["characters"]
    assert sum(len(d.encode()) for d in docs) == manifest["bytes"]
    for doc in docs:
        for p in doc.split("\n"):
            assert p and p == normalize(p, uncased=True)  # normalised, non-empty paragraphs
    # Sources are interleaved: WikiText's first article, then Wikipedia's first, ...
    assert docs[0].startswith("robert boulter\n")
    first_enwiki_title = open(mirror / "corpus" / ENWIKI, encoding="utf-8").readline().strip()
    assert docs[1].split("\n")[0] == normalize(first_enwiki_title, True)


def test_wikitext_articles_and_subheadings():
    lines = [
        " = Robert Boulter = \n",
        " Robert is an actor . \n",
        " = = Career = = \n",
        " In 2000 he ... \n",
        " = = = 2000s = = = \n",
        " = Du Fu = \n",
        " Du Fu was a poet . \n",
    ]
    docs = list(wikitext_documents(lines))
    assert [d[0] for d in docs] == ["Robert Boulter", "Du Fu"]
    assert docs[0][2] == "Career" and docs[0][4] == "2000s"  # sub-headings stay inside the article
    assert len(docs[0]) == 5 and len(docs[1]) == 2


def test_max_documents_and_cased(tmp_path, mirror, corpus_cfg):
    cfg = dataclasses.replace(corpus_cfg, max_documents=5, uncased=False)
    stats = build_corpus(cfg, tmp_path / "corpus", mirror)
    assert stats["documents"] == 5
    docs = list(iter_documents(tmp_path / "corpus"))
    assert docs[0].startswith("Robert Boulter\n")  # case kept
    assert read_corpus_manifest(tmp_path / "corpus")["sources"] == {WIKITEXT: 3, ENWIKI: 2}


# ---- the hub reader, on a local dataset (no network here) -----------------------------------------


def test_hub_reader_with_datasets(tmp_path):
    """`datasets.load_dataset(<local dir>, streaming=True)` runs the same code path as a hub dataset."""
    docs_dir = tmp_path / "docs-ds"
    docs_dir.mkdir()
    pq.write_table(
        pa.table({"text": ["Title One\n\nFirst para.\nSecond PARA.", "", "Title Two\nOnly para."], "id": [1, 2, 3]}),
        docs_dir / "train.parquet",
    )
    lines_dir = tmp_path / "lines-ds"
    lines_dir.mkdir()
    pq.write_table(
        pa.table(
            {
                "text": [
                    "",
                    " = Alpha = \n",
                    " Alpha text . \n",
                    " = = Sub = = \n",
                    "",
                    " = Beta = \n",
                    " Beta text . \n",
                ]
            }
        ),
        lines_dir / "train.parquet",
    )
    cfg = CorpusConfig(
        hub=(HubSource(path=str(docs_dir), format="document"), HubSource(path=str(lines_dir), format="wikitext")),
        mirror=(),
        uncased=True,
    )
    stats = build_corpus(cfg, tmp_path / "corpus", None)
    docs = list(iter_documents(tmp_path / "corpus"))
    assert stats["documents"] == 4
    assert docs == [
        "title one\nfirst para.\nsecond para.",
        "alpha\nalpha text .\nsub",
        "title two\nonly para.",
        "beta\nbeta text .",
    ]


def test_hub_sentences_are_grouped(tmp_path):
    """BookCorpus on the hub is one sentence per row with no book boundaries: group them."""
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "books.txt").write_text("one .\ntwo .\n\nthree .\nfour .\nfive .\n")
    cfg = CorpusConfig(
        hub=(HubSource(path=str(tmp_path / "books"), format="sentences", sentences_per_document=2),), mirror=()
    )
    build_corpus(cfg, tmp_path / "corpus", None)
    assert list(iter_documents(tmp_path / "corpus")) == ["one .\ntwo .", "three .\nfour .", "five ."]


def test_hub_missing_dataset_names_it(tmp_path):
    cfg = CorpusConfig(hub=(HubSource(path="electralab-tests/no-such-dataset"),), mirror=())
    with pytest.raises(DataError, match=r"corpus.hub\[0\]: cannot open hub dataset 'electralab-tests/no-such-dataset'"):
        build_corpus(cfg, tmp_path / "corpus", None)
    assert_no_output(tmp_path / "corpus")


def test_hub_wrong_text_field(tmp_path):
    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"content": ["a"]}), tmp_path / "ds" / "train.parquet")
    cfg = CorpusConfig(hub=(HubSource(path=str(tmp_path / "ds")),), mirror=())
    with pytest.raises(DataError, match=r"text_field='text'.*no such column \(columns: content\)"):
        build_corpus(cfg, tmp_path / "corpus", None)
    assert_no_output(tmp_path / "corpus")


# ---- bad input --------------------------------------------------------------------------------


def one_file_cfg(name: str, fmt: str = "paragraphs") -> CorpusConfig:
    return CorpusConfig(hub=(), mirror=(MirrorSource(name, fmt),))


def test_missing_corpus_directory(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path}/corpus: no such directory"):
        build_corpus(one_file_cfg("a.txt"), tmp_path / "out", tmp_path)
    assert_no_output(tmp_path / "out")


def test_missing_file_names_key(tmp_path):
    (tmp_path / "corpus").mkdir()
    with pytest.raises(DataError, match=r"corpus/a.txt: no such file \(named by corpus.mirror\[0\].file='a.txt'\)"):
        build_corpus(one_file_cfg("a.txt"), tmp_path / "out", tmp_path)
    assert_no_output(tmp_path / "out")


@pytest.mark.parametrize("content", [b"", b"\n\n   \n\n"])
def test_empty_corpus(tmp_path, content):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "empty.txt").write_bytes(content)
    with pytest.raises(DataError, match=r"empty.txt: no documents"):
        build_corpus(one_file_cfg("empty.txt"), tmp_path / "out", tmp_path)
    assert_no_output(tmp_path / "out")


def test_non_utf8_file_names_line(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "latin1.txt").write_bytes("Title\nfine line\n\nCaf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt: line 4 is not valid UTF-8 \(byte 3 of the line"):
        build_corpus(one_file_cfg("latin1.txt"), tmp_path / "out", tmp_path)
    assert_no_output(tmp_path / "out")


def test_failure_keeps_previous_output(tmp_path, mirror, corpus_cfg):
    """A failed rebuild leaves the previous, complete output as it was (atomic rename)."""
    out = tmp_path / "corpus"
    build_corpus(dataclasses.replace(corpus_cfg, max_documents=3), out, mirror)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (tmp_path / "bad" / "corpus").mkdir(parents=True)
    (tmp_path / "bad" / "corpus" / "x.txt").write_bytes(b"ok\n\xff\n")
    with pytest.raises(DataError):
        build_corpus(one_file_cfg("x.txt"), out, tmp_path / "bad")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(tmp_path.glob(".tmp-corpus-*"))
