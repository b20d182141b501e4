"""DVC stage export@<run>: the run's main encoder as a Hugging Face model, with its tokenizer and a model card.

    python stages/export.py cocolm              # what `dvc repro export@cocolm` runs

Reads models/<run>/ (the encoder with its vocabulary, summary.json) and metrics/finetune/<run>.json (the GLUE
medians the card lists); writes exports/<run>/, which transformers loads (docs/training.md):

    tokenizer = AutoTokenizer.from_pretrained("exports/cocolm")
    model = AutoModel.from_pretrained("exports/cocolm", trust_remote_code=True)   # relative positions
"""

from __future__ import annotations

from electralab.card import describe, model_card
from electralab.cli import run_stage
from electralab.config import Params
from electralab.env import data_root, repo_root
from electralab.io import read_json
from electralab.runs import check_run, resolve_all


def main(params: Params, args) -> None:
    runs = resolve_all(params)          # a mistake anywhere in the registry stops here, by key path
    check_run(args.run, runs, source=args.params)
    from electralab.data import read_manifest
    from electralab.export import huggingface_compatible, load_encoder, save_huggingface
    from electralab.tracking import latest_finished_run

    root, run = repo_root(), runs[args.run]
    model_dir, out = root / "models" / run.name, root / "exports" / run.name
    summary = read_manifest(model_dir / "summary.json", f"pretrain@{run.name}")
    scores = root / "metrics" / "finetune" / f"{run.name}.json"
    encoder = load_encoder(model_dir / "encoder")
    finetune = params.active.finetune
    card = model_card(run, describe(params.preset, params.active, mirror=data_root() is not None), summary,
                      read_json(scores) if scores.exists() else {}, len(finetune.seeds) if finetune else 0,
                      latest_finished_run(run.preset, run.name, "pretrain"), not huggingface_compatible(encoder.cfg))
    save_huggingface(encoder, out, vocab_dir=model_dir / "encoder", card=card)
    kind = "ElectraModel" if huggingface_compatible(encoder.cfg) else "ElectraModel + relative bias (remote code)"
    print(f"export {run.name}: {kind} with its tokenizer and model card -> {out}")


if __name__ == "__main__":
    run_stage("export", main, arguments=lambda p: p.add_argument("run", help="a run name from params.yaml runs"))
