"""Text normalisation: the one place where raw text is cleaned, for pretraining AND fine-tuning.

The corpus stage stores normalised documents and the Tokenizer (vocab.py) applies the same function to
any text it encodes, so a GLUE sentence is seen exactly as the pretraining corpus was.

    cased:   NFC, control/format characters removed, any run of whitespace -> one space, stripped
    uncased: the same, then lowercase + NFD + drop combining marks (Unicode category Mn), like
             BERT-uncased ("Café" -> "cafe"), then NFC again so what is left (e.g. Hangul) is composed

sentencepiece is trained with `normalization_rule_name="identity"`, so it adds nothing on top of this.

    >>> normalize("  Café\\tMÜNCHEN\\n", uncased=True)
    'cafe munchen'
"""

from __future__ import annotations

import functools
import sys
import unicodedata


@functools.cache
def _drop_table(uncased: bool) -> dict[int, None]:
    """str.translate table deleting control (Cc) and format (Cf) characters, and marks (Mn) if uncased.

    Whitespace controls (\\t \\n \\r ...) are deleted too; that is fine because whitespace is collapsed
    before this table is applied. Built once per process (~0.1 s).
    """
    drop = {"Cc", "Cf", "Mn"} if uncased else {"Cc", "Cf"}
    table = {cp: None for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)) in drop}
    table[0xFFFD] = None  # the replacement character marks text that was already broken
    return table


# ASCII controls other than the whitespace that str.split() already removes.
_ASCII_CONTROLS = {cp: None for cp in [*range(0x00, 0x09), *range(0x0E, 0x1C), 0x7F]}


def normalize(text: str, uncased: bool) -> str:
    """Clean one paragraph (or any text): see the module docstring. Newlines become spaces."""
    if text.isascii():  # the common case, ~10x faster than the Unicode path
        text = " ".join(text.translate(_ASCII_CONTROLS).split())
        return text.lower() if uncased else text
    # Collapse whitespace first: the drop table deletes \t and \n, which must become spaces.
    text = " ".join(text.split())
    if uncased:
        # BERT-uncased: lowercase, decompose, drop the accents (and controls).
        text = unicodedata.normalize("NFD", text.lower()).translate(_drop_table(True))
    else:
        text = unicodedata.normalize("NFC", text).translate(_drop_table(False))
    # Recompose what is left; deleting a format character can leave doubled spaces.
    return " ".join(unicodedata.normalize("NFC", text).split())
