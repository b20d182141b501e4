"""DVC stage `shards`: data/corpus + data/vocab -> data/shards (packed token blocks) + metrics/shards.json.

    python stages/shards.py

Reads presets.<preset>.shards; docs/data.md describes packing, the validation split and the manifest.
"""

from electralab.cli import run_stage
from electralab.config import Params
from electralab.data.shards import build_shards
from electralab.io import write_json


def main(params: Params, args=None) -> None:
    metrics = build_shards("data/corpus", "data/vocab", "data/shards", params.active.shards)
    write_json("metrics/shards.json", metrics)


if __name__ == "__main__":
    run_stage("shards", main)
