"""DVC stage `vocab`: data/corpus -> data/vocab (sentencepiece BPE, fixed special ids) + metrics/vocab.json.

    python stages/vocab.py

Reads presets.<preset>.vocab; docs/data.md describes the model and its special ids.
"""

from electralab.cli import run_stage
from electralab.config import Params
from electralab.data.vocab import train_vocab
from electralab.io import write_json


def main(params: Params, args=None) -> None:
    metrics = train_vocab("data/corpus", "data/vocab", params.active.vocab, where=f"presets.{params.preset}.vocab")
    write_json("metrics/vocab.json", metrics)


if __name__ == "__main__":
    run_stage("vocab", main)
