"""The data stages and the pretraining loader: corpus -> vocab -> shards -> PretrainLoader.

    text.py      normalisation (cased / uncased like BERT-uncased), shared with fine-tuning text
    corpus.py    documents from the Hugging Face hub or a local mirror -> Parquet parts + stats
    vocab.py     sentencepiece BPE with fixed special ids, and the Tokenizer the rest of the code uses
    shards.py    parallel tokenisation, FULL-SENTENCES packing into seq_len blocks, manifest, static masks
    masking.py   BERT/ELECTRA/RoBERTa-style masking of a batch (dynamic, or at shard time for static)
    loader.py    PretrainLoader: deterministic, rank-split, exactly resumable batches of electralab.batch.Batch

docs/data.md describes formats and choices. Modules are imported on use: this file stays light so that
`stages/corpus.py` does not pay for torch.
"""

from pathlib import Path

from electralab.errors import DataError
from electralab.io import read_json

MANIFEST = "manifest.json"  # in which the corpus and shards stages describe their output (read_manifest)


def read_manifest(path: str | Path, stage: str) -> dict:
    """The JSON file a stage wrote (its manifest), or a DataError saying which stage to run first."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; run the {stage} stage first (dvc repro {stage})")
    try:
        manifest = read_json(path)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError: truncated or overwritten
        raise DataError(
            f"{path}: not a readable manifest ({e}); run the {stage} stage again (dvc repro -f {stage})"
        ) from None
    if not isinstance(manifest, dict):
        raise DataError(
            f"{path}: expected a JSON object, got {type(manifest).__name__}; run the {stage} stage "
            f"again (dvc repro -f {stage})"
        )
    return manifest
