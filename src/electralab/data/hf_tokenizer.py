"""The run's vocabulary as a Hugging Face tokenizer: `transformers.AutoTokenizer.from_pretrained(dir)` loads
it as is and gives the ids of our Tokenizer (vocab.py) on the same text.

    save_hf_tokenizer("data/vocab", "exports/cocolm", max_length=512)
    # -> tokenizer.json (the `tokenizers` format), tokenizer_config.json, special_tokens_map.json

The `tokenizers` pipeline reproduces ours step by step:
    normalizer      text.normalize: Python's whitespace runs -> one space, stripped; uncased: lowercase, NFD,
                    control/format characters and combining marks (Mn) dropped; cased: NFC, controls/format
                    dropped; NFC; spaces collapsed again. The character classes are generated from the
                    unicodedata of the Python that runs this, the one text.normalize uses.
    pre-tokenizer   sentencepiece's: a "▁" before the text and in place of every space (Metaspace)
    model           the sentencepiece model with our ids: BPE with merges ranked by the merged piece's score
                    (highest first, as sentencepiece merges; runs of unknown characters fused into one [UNK]),
                    or Unigram with the pieces' scores
    post-processor  [CLS] a [SEP] / [CLS] a [SEP] b [SEP], as fine-tuning builds its inputs (no segment ids)
The special tokens are added tokens with their fixed ids ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4).

Known difference: a literal "[MASK]" inside text is one token in both, but where our Tokenizer keeps the
space before it as a lone "▁" piece, the Hugging Face one drops it (as pretraining's masking does).
"""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

from sentencepiece import sentencepiece_model_pb2

from electralab import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID
from electralab.data import read_manifest
from electralab.data.vocab import MODEL_FILE, TOKENIZER_FILE
from electralab.io import write_json

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SPACE = "\u2581"  # sentencepiece's "▁"


def _char_class(codepoints: list[int]) -> str:
    """A regex character class over `codepoints`, as compact ranges: [\\x{0}-\\x{8}\\x{e}...]."""
    ranges: list[list[int]] = []
    for cp in sorted(codepoints):
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "[" + "".join(f"\\x{{{a:x}}}" if a == b else f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in ranges) + "]"


def _categories(*names: str) -> list[int]:
    return [cp for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)) in names]


def normalizer(uncased: bool):
    """text.normalize as a `tokenizers` normalizer (see the module docstring)."""
    from tokenizers import Regex, normalizers

    whitespace = [cp for cp in range(sys.maxunicode + 1) if chr(cp).isspace()]  # what str.split() splits on
    drop = _categories("Cc", "Cf", *(["Mn"] if uncased else [])) + [0xFFFD]
    steps = [normalizers.Replace(Regex(_char_class(whitespace) + "+"), " "), normalizers.Strip()]
    if uncased:
        # Python's lower() turns a word-final capital sigma into "ς"; the per-character lowercase does not.
        steps += [
            normalizers.Replace(Regex("(?<=[\\p{Ll}\\p{Lu}\\p{Lt}])\u03a3(?![\\p{Ll}\\p{Lu}\\p{Lt}])"), "\u03c2"),
            normalizers.Lowercase(),
            normalizers.NFD(),
        ]
    else:
        steps.append(normalizers.NFC())
    steps += [
        normalizers.Replace(Regex(_char_class(drop)), ""),
        normalizers.NFC(),
        normalizers.Replace(Regex(" {2,}"), " "),
        normalizers.Strip(),
    ]
    return normalizers.Sequence(steps)


def model(model_file: Path):
    """The sentencepiece model as a `tokenizers` model with the same ids: a BPE whose merges are ranked by the
    score of the piece they make (sentencepiece merges the highest first), or a Unigram with the pieces' scores."""
    from tokenizers.models import BPE, Unigram

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    if proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
        return Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=UNK_ID, byte_fallback=False)
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    normal = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
    merges = []  # (minus the score of the merged piece, left id, right id, left, right)
    for piece in proto.pieces:
        if piece.type != normal:
            continue
        text = piece.piece
        for k in range(1, len(text)):
            left, right = text[:k], text[k:]
            if left in vocab and right in vocab:
                merges.append((-piece.score, vocab[left], vocab[right], left, right))
    merges.sort()
    return BPE(
        vocab=vocab,
        merges=[(left, right) for *_, left, right in merges],
        unk_token=SPECIAL_TOKENS[UNK_ID],
        fuse_unk=True,
        byte_fallback=False,
    )


def build(vocab_dir: str | Path):
    """The `tokenizers.Tokenizer` of the vocabulary in `vocab_dir` (spm.model + our manifest)."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors

    vocab_dir = Path(vocab_dir)
    info = read_manifest(vocab_dir / TOKENIZER_FILE, "vocab")
    tokenizer = Tokenizer(model(vocab_dir / info.get("model", MODEL_FILE)))
    tokenizer.normalizer = normalizer(bool(info["uncased"]))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    cls, sep = SPECIAL_TOKENS[CLS_ID], SPECIAL_TOKENS[SEP_ID]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}", special_tokens=[(cls, CLS_ID), (sep, SEP_ID)]
    )
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == i, (token, tokenizer.token_to_id(token))
    return tokenizer, info


def save_hf_tokenizer(vocab_dir: str | Path, directory: str | Path, max_length: int) -> None:
    """Write the three files transformers reads (HF_TOKENIZER_FILES) into `directory`."""
    directory = Path(directory)
    tokenizer, info = build(vocab_dir)
    tokenizer.save(str(directory / "tokenizer.json"))
    special = {
        "pad_token": SPECIAL_TOKENS[PAD_ID],
        "unk_token": SPECIAL_TOKENS[UNK_ID],
        "cls_token": SPECIAL_TOKENS[CLS_ID],
        "sep_token": SPECIAL_TOKENS[SEP_ID],
        "mask_token": SPECIAL_TOKENS[MASK_ID],
    }
    write_json(directory / "special_tokens_map.json", special)
    write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "model_max_length": max_length,
            "do_lower_case": bool(info["uncased"]),
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "attention_mask"],  # no segment ids: pretrained without them
        },
    )


__all__ = ["HF_TOKENIZER_FILES", "build", "normalizer", "save_hf_tokenizer"]
