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


from electralab.errors import DataError  # noqa: E402,F401  (re-exported: `from electralab.data import DataError`)
