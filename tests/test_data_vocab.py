"""vocab stage: real sentencepiece BPE models, fixed special ids, determinism, the Tokenizer, bad input."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import sentencepiece as spm
from conftest import ROOT, VOCAB, assert_no_output

from electralab import SPECIAL_TOKENS
from electralab.data.corpus import iter_documents, read_corpus_manifest
from electralab.data.text import normalize
from electralab.data.vocab import TOKENIZER_FILE, Tokenizer, train_vocab
from electralab.errors import ConfigError, DataError


def test_special_ids_and_size(vocab_dir):
    sp = spm.SentencePieceProcessor(model_file=str(vocab_dir / "spm.model"))
    assert sp.vocab_size() == VOCAB.size
    assert [sp.id_to_piece(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    tok = Tokenizer(vocab_dir)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.info["special_ids"] == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    # Control symbols never come out of text; [MASK] does, even through uncased normalisation.
    ids = tok.encode("The [MASK] sat on [CLS] the [SEP] mat")
    assert ids.count(4) == 1 and not {0, 2, 3} & set(ids)


def test_deterministic_for_a_seed(tmp_path, corpus_dir, vocab_dir):
    """Same corpus + config -> byte-identical model, also in another process (sentencepiece's own sampling
    is not: it differs per process), with sampling active (1,000 of ~2,700 paragraphs) and two threads.
    Another seed samples other sentences and gives another model."""
    code = (
        "import sys; from electralab.data.vocab import train_vocab; from conftest import VOCAB; "
        "train_vocab(sys.argv[1], sys.argv[2], VOCAB)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    subprocess.run(
        [sys.executable, "-c", code, str(corpus_dir), str(tmp_path / "again")], env=env, check=True, capture_output=True
    )
    assert (tmp_path / "again" / "spm.model").read_bytes() == (vocab_dir / "spm.model").read_bytes()
    assert (tmp_path / "again" / TOKENIZER_FILE).read_bytes() == (vocab_dir / TOKENIZER_FILE).read_bytes()

    assert read_corpus_manifest(corpus_dir)["paragraphs"] > VOCAB.input_sentence_size
    metrics = train_vocab(corpus_dir, tmp_path / "seed2", dataclasses.replace(VOCAB, seed=2))
    assert metrics["sentences"] == VOCAB.input_sentence_size
    assert (tmp_path / "seed2" / "spm.model").read_bytes() != (vocab_dir / "spm.model").read_bytes()


def test_tokenizer_normalises_like_the_corpus(vocab_dir):
    tok = Tokenizer(vocab_dir)
    assert tok.uncased
    assert tok.encode("CAFÉ  Crème\tBrûlée") == tok.encode("cafe creme brulee")
    assert tok.normalize("Hello [MASK]world") == "hello [MASK]world"


def test_decode_round_trips_corpus_text(vocab_dir, corpus_dir):
    tok = Tokenizer(vocab_dir)
    checked = 0
    for doc in list(iter_documents(corpus_dir))[:10]:
        for paragraph in doc.split("\n"):
            ids = tok.encode(paragraph)
            if tok.unk_id not in ids:
                assert tok.decode(ids) == normalize(paragraph, uncased=True)
                checked += 1
    assert checked > 100


def test_vocab_too_large_for_corpus(tmp_path, corpus_dir):
    cfg = dataclasses.replace(VOCAB, size=200_000)
    with pytest.raises(
        ConfigError,
        match=r"presets.tiny.vocab.size=200000 is more than the corpus in .* supports: "
        r"sentencepiece can make at most \d+ pieces",
    ):
        train_vocab(corpus_dir, tmp_path / "vocab", cfg, where="presets.tiny.vocab")
    assert_no_output(tmp_path / "vocab")


def test_missing_corpus(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path}/corpus/manifest.json: no such file; run the corpus stage first"):
        train_vocab(tmp_path / "corpus", tmp_path / "vocab", VOCAB)
    assert_no_output(tmp_path / "vocab")
