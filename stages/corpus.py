"""DVC stage `corpus`: the active preset's corpora -> the corpus directory (Parquet documents) + its metrics.

    ELECTRALAB_DATA=../shared/data python stages/corpus.py data/corpus metrics/corpus.json   # from the mirror
    python stages/corpus.py data/corpus metrics/corpus.json                                  # from the hub

Reads presets.<preset>.corpus; docs/data.md describes sources, formats and outputs.
"""

from pathlib import Path

from electralab.cli import run_stage
from electralab.config import Params
from electralab.data.corpus import build_corpus
from electralab.env import data_root
from electralab.io import write_json


def main(params: Params, args) -> None:
    stats = build_corpus(params.active.corpus, args.out, data_root(), where=f"presets.{params.preset}.corpus")
    write_json(args.metrics, stats)


def arguments(parser) -> None:
    parser.add_argument("out", type=Path, help="the corpus directory to write")
    parser.add_argument("metrics", type=Path, help="the metrics file to write")


if __name__ == "__main__":
    run_stage("corpus", main, arguments=arguments)
