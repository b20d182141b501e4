"""electralab: ELECTRA-style pretraining research (MLM, ELECTRA, COCO-LM, AMOS, TEAMS) end to end.

The library knows nothing about DVC or Prefect: stages/ and flows/ are thin callers.
"""

__version__ = "0.1.0"

# Fixed special token ids (docs/data.md, Vocabulary); the vocab stage builds sentencepiece models
# that honour them and every other part of the code relies on them.
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
