"""DVC stage `corpus`: the active preset's corpora -> data/corpus (Parquet documents) + metrics/corpus.json.

    ELECTRALAB_DATA=../shared/data python stages/corpus.py     # from the local mirror
    python stages/corpus.py                                    # from the Hugging Face hub

Reads presets.<preset>.corpus; docs/data.md describes sources, formats and outputs.
"""

from electralab.cli import run_stage
from electralab.config import Params
from electralab.data.corpus import build_corpus
from electralab.env import data_root
from electralab.io import write_json


def main(params: Params, args=None) -> None:
    stats = build_corpus(params.active.corpus, "data/corpus", data_root(), where=f"presets.{params.preset}.corpus")
    write_json("metrics/corpus.json", stats)


if __name__ == "__main__":
    run_stage("corpus", main)
