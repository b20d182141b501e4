"""DVC stage export@<run>: the run's main encoder as a Hugging Face model, with its tokenizer and a model card.

    python stages/export.py cocolm models/cocolm metrics/finetune/cocolm.json exports/cocolm
                                                # what `dvc repro export@cocolm` runs

Reads the model directory (the encoder with its vocabulary, summary.json) and the fine-tuning metrics file
(the GLUE medians the card lists; absent: none); writes the export directory, which transformers loads
(docs/training.md):

    tokenizer = AutoTokenizer.from_pretrained("exports/cocolm")
    model = AutoModel.from_pretrained("exports/cocolm", trust_remote_code=True)   # relative positions
"""

from __future__ import annotations

from pathlib import Path

from electralab.cli import run_stage  # first: it holds a stop signal while the rest imports

# isort: split
from electralab.card import describe, model_card
from electralab.config import Params
from electralab.env import data_root
from electralab.runs import check_run, resolve_all


def main(params: Params, args) -> None:
    runs = resolve_all(params)  # a mistake anywhere in the registry stops here, by key path
    check_run(args.run, runs, source=args.params)
    from electralab.data import read_manifest
    from electralab.export import huggingface_compatible, load_encoder, save_huggingface
    from electralab.tracking import latest_finished_run

    run = runs[args.run]
    summary = read_manifest(args.model / "summary.json", f"pretrain@{run.name}")
    encoder = load_encoder(args.model / "encoder")
    finetune = params.active.finetune
    scores = read_manifest(args.scores, f"finetune@{run.name}") if args.scores.exists() else {}
    card = model_card(
        run,
        describe(params.preset, params.active, mirror=data_root() is not None),
        summary,
        scores,
        len(finetune.seeds) if finetune else 0,
        latest_finished_run(run.preset, run.name, "pretrain"),
        not huggingface_compatible(encoder.cfg),
    )
    save_huggingface(encoder, args.out, vocab_dir=args.model / "encoder", card=card)
    kind = "ElectraModel" if huggingface_compatible(encoder.cfg) else "ElectraModel + relative bias (remote code)"
    print(f"export {run.name}: {kind} with its tokenizer and model card -> {args.out}")


def arguments(parser) -> None:
    parser.add_argument("run", help="a run name from params.yaml runs")
    parser.add_argument("model", type=Path, help="the run's model directory (its pretrain stage's output)")
    parser.add_argument("scores", type=Path, help="the run's fine-tuning metrics file (absent: none)")
    parser.add_argument("out", type=Path, help="the export directory to write")


if __name__ == "__main__":
    run_stage("export", main, arguments=arguments)
