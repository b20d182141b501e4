"""DVC stage `vocab`: the corpus -> a vocabulary directory (sentencepiece BPE, fixed special ids) + metrics.

    python stages/vocab.py data/corpus data/vocab metrics/vocab.json

Reads presets.<preset>.vocab; docs/data.md describes the model and its special ids.
"""

from pathlib import Path

from electralab.cli import run_stage
from electralab.config import Params
from electralab.data.vocab import train_vocab
from electralab.io import write_json


def main(params: Params, args) -> None:
    metrics = train_vocab(args.corpus, args.out, params.active.vocab, where=f"presets.{params.preset}.vocab")
    write_json(args.metrics, metrics)


def arguments(parser) -> None:
    parser.add_argument("corpus", type=Path, help="the corpus directory (the corpus stage's output)")
    parser.add_argument("out", type=Path, help="the vocabulary directory to write")
    parser.add_argument("metrics", type=Path, help="the metrics file to write")


if __name__ == "__main__":
    run_stage("vocab", main, arguments=arguments)
