"""DVC stage `shards`: the corpus + the vocabulary -> a shards directory (packed token blocks) + its metrics.

    python stages/shards.py data/corpus data/vocab data/shards metrics/shards.json

Reads presets.<preset>.shards; docs/data.md describes packing, the validation split and the manifest.
"""

from pathlib import Path

from electralab.cli import run_stage
from electralab.config import Params
from electralab.data.shards import build_shards
from electralab.io import write_json


def main(params: Params, args) -> None:
    write_json(args.metrics, build_shards(args.corpus, args.vocab, args.out, params.active.shards))


def arguments(parser) -> None:
    parser.add_argument("corpus", type=Path, help="the corpus directory (the corpus stage's output)")
    parser.add_argument("vocab", type=Path, help="the vocabulary directory (the vocab stage's output)")
    parser.add_argument("out", type=Path, help="the shards directory to write")
    parser.add_argument("metrics", type=Path, help="the metrics file to write")


if __name__ == "__main__":
    run_stage("shards", main, arguments=arguments)
