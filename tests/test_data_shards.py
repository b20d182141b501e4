"""shards stage: packing invariants, no token lost or duplicated, the validation split, the manifest,
determinism across worker counts, static masks, corrupt shards."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
from conftest import SHARDS, assert_no_output

from electralab import CLS_ID, PAD_ID, SEP_ID
from electralab.data.corpus import iter_documents, read_corpus_manifest
from electralab.data.shards import build_shards, read_shards_manifest, token_dtype, validation_documents, verify_shards
from electralab.data.vocab import Tokenizer
from electralab.errors import DataError
from electralab.io import sha256_file


def read_split(shards_dir, split) -> np.ndarray:
    """(blocks, seq_len) of a split, all files in order."""
    m = read_shards_manifest(shards_dir)
    parts = [
        np.fromfile(shards_dir / f["file"], np.dtype(m["dtype"])).reshape(-1, m["seq_len"])
        for f in m["splits"][split]["files"]
    ]
    return np.concatenate(parts) if parts else np.empty((0, m["seq_len"]), np.uint16)


def unpack(blocks: np.ndarray) -> np.ndarray:
    """The stream the blocks were cut from: drop [CLS], the final [SEP] and the padding of each block."""
    pieces = []
    for row in blocks:
        real = row[row != PAD_ID] if row[-1] == PAD_ID else row
        pieces.append(real[1:-1])
    return np.concatenate(pieces)


def test_packing_invariants(shards_dir):
    m = read_shards_manifest(shards_dir)
    T = SHARDS.seq_len
    assert m["seq_len"] == T and m["dtype"] == "uint16" and m["packing"] == "full-sentences"
    for split in ("train", "validation"):
        blocks = read_split(shards_dir, split)
        assert blocks.shape == (m["splits"][split]["blocks"], T)  # every block exactly seq_len
        assert (blocks[:, 0] == CLS_ID).all()  # every block starts with [CLS]
        last_real = (blocks != PAD_ID).sum(axis=1) - 1
        assert (blocks[np.arange(len(blocks)), last_real] == SEP_ID).all()  # ... and ends with [SEP]
        assert (blocks[:-1] != PAD_ID).all()  # padding only in the last block
        pad = (blocks[-1] == PAD_ID).sum()
        assert pad == m["splits"][split]["padding"] < T - 2
        assert (blocks[-1, T - pad :] == PAD_ID).all()  # ... at its end
        assert m["splits"][split]["tokens"] == (blocks != PAD_ID).sum()
    assert len(m["splits"]["train"]["files"]) > 1  # blocks_per_shard rolled files over
    assert all(f["blocks"] <= SHARDS.blocks_per_shard for f in m["splits"]["train"]["files"])


def test_no_token_lost_or_duplicated(shards_dir, corpus_dir, vocab_dir):
    """Unpacking each split gives back exactly sentencepiece's ids of its documents, in corpus order, each
    followed by [SEP] (this also checks the word cache against plain Tokenizer.encode)."""
    tok = Tokenizer(vocab_dir)
    docs = list(iter_documents(corpus_dir))
    val = set(validation_documents(len(docs), SHARDS.validation_fraction, SHARDS.seed).tolist())
    for split, chosen in (
        ("train", [d for i, d in enumerate(docs) if i not in val]),
        ("validation", [d for i, d in enumerate(docs) if i in val]),
    ):
        expected = np.concatenate([np.array(tok.encode(d) + [SEP_ID]) for d in chosen])
        assert np.array_equal(unpack(read_split(shards_dir, split)), expected), split
        assert read_shards_manifest(shards_dir)["splits"][split]["documents"] == len(chosen)


def test_validation_split_by_documents(corpus_dir):
    n = read_corpus_manifest(corpus_dir)["documents"]
    val = validation_documents(n, 0.1, seed=1)
    assert len(val) == round(0.1 * n) and len(set(val.tolist())) == len(val)
    assert np.array_equal(val, validation_documents(n, 0.1, seed=1))  # deterministic
    assert not np.array_equal(val, validation_documents(n, 0.1, seed=2))  # seeded
    assert len(validation_documents(3, 0.01, seed=1)) == 1  # at least one ...
    assert len(validation_documents(2, 0.5, seed=1)) == 1  # ... and one left to train
    assert len(validation_documents(100, 0.0, seed=1)) == 0


def test_manifest_checksums_and_hash(shards_dir, corpus_dir, vocab_dir, tmp_path):
    m = read_shards_manifest(shards_dir)
    for split in m["splits"].values():
        for f in split["files"]:
            assert sha256_file(shards_dir / f["file"]) == f["sha256"]
    assert m["vocab_size"] == Tokenizer(vocab_dir).vocab_size
    verify_shards(shards_dir)
    # One worker or two: the same bytes and hash. Another seq_len: another hash.
    build_shards(corpus_dir, vocab_dir, tmp_path / "one", dataclasses.replace(SHARDS, workers=1))
    one = read_shards_manifest(tmp_path / "one")
    assert one["config_hash"] == m["config_hash"] and one["splits"] == m["splits"]
    build_shards(corpus_dir, vocab_dir, tmp_path / "long", dataclasses.replace(SHARDS, seq_len=128))
    assert read_shards_manifest(tmp_path / "long")["config_hash"] != m["config_hash"]


def test_token_dtype():
    assert token_dtype(32768) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_static_masks(static_shards_dir):
    m = read_shards_manifest(static_shards_dir)
    assert m["static_masking"]["duplication"] == 2
    blocks = read_split(static_shards_dir, "train")
    copies = []
    for c in range(2):
        ids = np.concatenate(
            [np.fromfile(static_shards_dir / f["static"][c]["ids"], np.uint16) for f in m["splits"]["train"]["files"]]
        ).reshape(blocks.shape)
        mask = np.concatenate(
            [
                np.fromfile(static_shards_dir / f["static"][c]["mask"], np.uint8).reshape(
                    -1, (blocks.shape[1] + 7) // 8
                )
                for f in m["splits"]["train"]["files"]
            ]
        )
        mask = np.unpackbits(mask, axis=1, count=blocks.shape[1]).astype(bool)
        assert (ids[~mask] == blocks[~mask]).all()  # unselected positions untouched
        assert abs(mask.mean() - 0.15) < 0.01
        copies.append(mask)
    assert (copies[0] != copies[1]).any()  # two different maskings
    verify_shards(static_shards_dir)


# ---- bad input --------------------------------------------------------------------------------


def test_corrupt_shard_is_named(tmp_path, shards_dir):
    broken = tmp_path / "shards"
    shutil.copytree(shards_dir, broken)
    target = broken / "train-00001.bin"
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"train-00001.bin: sha256 [0-9a-f]{64} does not match the manifest's"):
        verify_shards(broken)
    verify_shards(broken, checksums=False)  # sizes still fine


def test_truncated_and_missing_shards(tmp_path, shards_dir):
    broken = tmp_path / "shards"
    shutil.copytree(shards_dir, broken)
    target = broken / "validation-00000.bin"
    target.write_bytes(target.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"validation-00000.bin: \d+ bytes, but the manifest's \d+ blocks make"):
        verify_shards(broken, checksums=False)
    target.unlink()
    with pytest.raises(DataError, match=r"validation-00000.bin: missing, but listed in"):
        verify_shards(broken)


def test_missing_inputs(tmp_path, corpus_dir, vocab_dir):
    with pytest.raises(DataError, match=r"corpus/manifest.json: no such file; run the corpus stage first"):
        build_shards(tmp_path / "corpus", vocab_dir, tmp_path / "shards", SHARDS)
    with pytest.raises(DataError, match=r"vocab/electralab_tokenizer.json: no such file; run the vocab stage first"):
        build_shards(corpus_dir, tmp_path / "vocab", tmp_path / "shards", SHARDS)
    assert_no_output(tmp_path / "shards")


def test_cased_vocab_with_uncased_corpus(tmp_path, corpus_dir, vocab_dir):
    vocab = tmp_path / "vocab"
    shutil.copytree(vocab_dir, vocab)
    info = (vocab / "electralab_tokenizer.json").read_text().replace('"uncased": true', '"uncased": false')
    (vocab / "electralab_tokenizer.json").write_text(info)
    with pytest.raises(DataError, match=r"spm.model: the vocabulary is cased but .*corpus is uncased"):
        build_shards(corpus_dir, vocab, tmp_path / "shards", SHARDS)
    assert_no_output(tmp_path / "shards")


def test_word_cache_matches_sentencepiece_after_resets(corpus_dir, vocab_dir):
    """The cache starts afresh when full; the ids stay exactly sentencepiece's."""
    import pyarrow as pa

    from electralab.data.shards import WordCachedEncoder

    tok = Tokenizer(vocab_dir)
    docs = list(iter_documents(corpus_dir))[:12]
    enc = WordCachedEncoder(tok.model_path, max_entries=50)
    expected = np.concatenate([np.array(tok.encode(d) + [SEP_ID]) for d in docs])
    for _ in range(2):  # the second pass starts with a full cache and resets it
        got = np.concatenate([enc.encode_documents(pa.array(docs[i : i + 3])) for i in range(0, len(docs), 3)])
        assert np.array_equal(got, expected)
