"""What an encoder knows about a sentence pair before any fine-tuning: STS-B probes layer by layer, beside
the lexical-overlap baseline that needs no model at all.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/sentence_probe.py \
        models/control/encoder models/mlm/encoder models/electra/encoder
    # options: --max-len 128  --threads 2  --out bench/out/sentence_probe.json
    python bench/sentence_probe.py --compare results/sentence_probe/*.json   # probe against fine-tuning

Why: at the tiny preset ELECTRA's encoder fine-tunes to STS-B Spearman 75 and MLM's to 13-18, the control's
(no pretraining) to 17 (docs/findings.md). This says where that difference lives. Every encoder is frozen
(eval mode, fp32); STS-B train (5,749 pairs) fits the probes, dev (1,500) scores them, Spearman x 100:

- overlap: the Jaccard overlap of the two sentences' sets of lower-cased words, and of their sets of BPE
  pieces: how much of STS-B a bag of words explains, with no encoder;
- cosine: the cosine of the two sentences' mean-pooled states, each sentence encoded alone (no training);
- ridge [CLS] / ridge mean: a ridge regression on the [CLS] state, or on the mean of the states, of the pair
  encoded as fine-tuning encodes it (`[CLS] a [SEP] b [SEP]`): what a linear head can read from the layer;
- ridge u,v: a ridge regression on (|u - v|, u * v) of the two sentences' mean-pooled states, each encoded
  alone (SentEval's features): sentence-level content, without attention across the pair.

A ridge probe standardises its features and takes its penalty (1e-2 .. 1e4) from the last fifth of the
training pairs, then refits on all of them. Layer 0 is the embeddings.

`--compare` probes nothing: it reads probe results and sets each encoder's final-layer "ridge mean" beside the
five-seed STS-B median of the fine-tuned point that names the encoder (results/*/points/*.json, written by
`bench/dead_phase.py finetune`), and prints the Spearman between the two: whether the probe can screen a sweep
(`--measure`, `--peak`: another measure of the file, e.g. bench/pair_attention.py's, at its highest layer).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TOKENIZER_HELP = (
    "the tokenizer of encoders that carry none (a checkpoint's fractions/<pct>/encoder): the run's exported encoder "
    "or its vocab directory (default: each encoder's own)"
)
PENALTIES = (1e-2, 1e-1, 1.0, 10.0, 1e2, 1e3, 1e4)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    from electralab.finetune.metrics import spearman as ours

    return ours(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))  # already x 100


def jaccard(a: list[set], b: list[set]) -> np.ndarray:
    return np.array([len(x & y) / max(1, len(x | y)) for x, y in zip(a, b)])


@torch.no_grad()
def layer_states(encoder, encoded, batch_size: int = 64) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per layer: the [CLS] states (N, H) and the mean over each sequence's tokens (N, H)."""
    from electralab.finetune.features import eval_batches

    n, layers = len(encoded), encoder.cfg.layers + 1
    cls = [np.zeros((n, encoder.cfg.hidden), np.float32) for _ in range(layers)]
    mean = [np.zeros((n, encoder.cfg.hidden), np.float32) for _ in range(layers)]
    for index in eval_batches(encoded.lengths, batch_size):
        ids, mask, _ = encoded.batch(index)
        weights = mask.float()[..., None] / mask.sum(1, keepdim=True)[..., None]
        for layer, h in enumerate(encoder(ids, mask)):
            cls[layer][index] = h[:, 0].numpy()
            mean[layer][index] = (h * weights).sum(1).numpy()
    return cls, mean


def ridge(train_x: np.ndarray, train_y: np.ndarray, dev_x: np.ndarray) -> np.ndarray:
    """Dev predictions of a ridge regression, its penalty chosen on the last fifth of the training rows."""
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    train_x, dev_x = (train_x - mu) / sd, (dev_x - mu) / sd

    def fit(x: np.ndarray, y: np.ndarray, penalty: float) -> tuple[np.ndarray, float]:
        xc, yc = x - x.mean(0), y - y.mean()
        w = np.linalg.solve(xc.T @ xc + penalty * np.eye(x.shape[1]), xc.T @ yc)
        return w, y.mean() - x.mean(0) @ w

    cut = len(train_x) * 4 // 5
    scores = []
    for penalty in PENALTIES:
        w, b = fit(train_x[:cut], train_y[:cut], penalty)
        scores.append(spearman(train_x[cut:] @ w + b, train_y[cut:]))
    w, b = fit(train_x, train_y, PENALTIES[int(np.argmax(scores))])
    return dev_x @ w + b


def probe(encoder_dir: Path, splits: dict, max_len: int, tokenizer_dir: Path | None = None) -> dict:
    from electralab.data.vocab import Tokenizer
    from electralab.export import load_encoder
    from electralab.finetune.features import encode_pairs

    tokenizer, encoder = Tokenizer(tokenizer_dir or encoder_dir), load_encoder(encoder_dir).eval()
    states = {}
    for name, split in splits.items():
        none = np.zeros(len(split.labels), np.float32)
        states[name] = {
            "pair": layer_states(encoder, encode_pairs(tokenizer, split.text_a, split.text_b, none, max_len)),
            "a": layer_states(encoder, encode_pairs(tokenizer, split.text_a, None, none, max_len))[1],
            "b": layer_states(encoder, encode_pairs(tokenizer, split.text_b, None, none, max_len))[1],
        }
    train, dev = states["train"], states["dev"]
    y_train, y_dev = splits["train"].labels.astype(np.float64), splits["dev"].labels
    rows = []
    for layer in range(encoder.cfg.layers + 1):
        u, v = dev["a"][layer], dev["b"][layer]
        cosine = (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1) + 1e-9)

        def uv(side: dict) -> np.ndarray:
            a, b = side["a"][layer], side["b"][layer]
            return np.concatenate([np.abs(a - b), a * b], axis=1)

        rows.append(
            {
                "layer": layer,
                "cosine": spearman(cosine, y_dev),
                "ridge_cls": spearman(ridge(train["pair"][0][layer], y_train, dev["pair"][0][layer]), y_dev),
                "ridge_mean": spearman(ridge(train["pair"][1][layer], y_train, dev["pair"][1][layer]), y_dev),
                "ridge_uv": spearman(ridge(uv(train), y_train, uv(dev)), y_dev),
            }
        )
    return {"encoder": str(encoder_dir), "layers": rows}


def overlap(splits: dict, tokenizer_dir: Path) -> dict:
    from electralab.data.vocab import Tokenizer

    tokenizer, dev = Tokenizer(tokenizer_dir), splits["dev"]

    def words(texts: list[str]) -> list[set]:
        return [set(re.findall(r"\w+", t.lower())) for t in texts]

    def pieces(texts: list[str]) -> list[set]:
        return [set(x) for x in tokenizer.encode_batch(texts)]

    return {
        "words": spearman(jaccard(words(dev.text_a), words(dev.text_b)), dev.labels),
        "bpe_pieces": spearman(jaccard(pieces(dev.text_a), pieces(dev.text_b)), dev.labels),
    }


def compare(
    probe_files: list[Path], points: list[Path], measure: str = "ridge_mean", peak: bool = False
) -> list[tuple[str, float, float]]:
    """(encoder, its final layer's `measure` (with `peak`, its highest layer's), its fine-tuned STS-B median) for
    each probed encoder that one of the `points` (bench/dead_phase.py's point files) names and has fine-tuned; the
    rest are left out."""
    finetuned = {}
    for path in points:
        point = json.loads(path.read_text())
        if point.get("finetune") and point.get("encoder"):
            finetuned[point["encoder"]] = point["finetune"]["stsb"]["median"]
    rows = []
    for path in probe_files:
        for found in json.loads(path.read_text())["encoders"]:
            if measure not in found["layers"][-1]:
                sys.exit(f"error: {path}: no measure {measure!r}; it has {sorted(found['layers'][-1])}")
            if found["encoder"] in finetuned:
                values = [layer[measure] for layer in found["layers"] if layer[measure] == layer[measure]]  # not NaN
                rows.append((found["encoder"], max(values) if peak else values[-1], finetuned[found["encoder"]]))
    return rows


def print_comparison(probe_files: list[Path], measure: str, peak: bool) -> None:
    rows = compare(probe_files, sorted(ROOT.glob("results/*/points/*.json")), measure, peak)
    if len(rows) < 3:
        sys.exit(f"error: {len(rows)} probed encoder(s) with a fine-tuned point in results/*/points/; need 3")
    layer = "highest" if peak else "final"
    print(f"| encoder | {measure}, {layer} layer | fine-tuned STS-B (median of 5 seeds) |\n|---|---|---|")
    for encoder, probed, tuned in sorted(rows, key=lambda row: row[2]):
        print(f"| {encoder} | {probed:.3g} | {tuned:.1f} |")
    rho = spearman([row[1] for row in rows], [row[2] for row in rows]) / 100
    print(f"Spearman between {measure} and fine-tuning over {len(rows)} encoders: {rho:.2f}")


def write_result(out: Path, result: dict, threads: int, load: float, start: float) -> None:
    """`result` to `out` as JSON, with what a committed copy says of where it came from (the load at the start, the
    minutes since `start`)."""
    from electralab.env import source_commit
    from electralab.train.common import machine

    result["provenance"] = {
        "commit": source_commit(ROOT),
        "device": machine(torch.device("cpu")),
        "threads": threads,
        "load_at_start": load,
        "minutes": (time.time() - start) / 60,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def check_encoders(ap: argparse.ArgumentParser, encoders: list[Path]) -> None:
    """Before any work, so a wrong path fails by name, not after the first probes."""
    for directory in encoders:
        if not (directory / "config.json").is_file():
            ap.error(
                f"{directory}: not an exported encoder (no config.json; pretrain@<run> writes models/<run>/encoder)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("encoders", nargs="*", type=Path, help="exported encoder directories (models/<run>/encoder)")
    ap.add_argument(
        "--compare", nargs="+", type=Path, metavar="PROBE_JSON", help="probe results to set beside fine-tuning"
    )
    ap.add_argument("--measure", default="ridge_mean", help="with --compare: the measure to read (a key of the layers)")
    ap.add_argument("--peak", action="store_true", help="with --compare: the measure's highest layer, not the final")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--tokenizer", type=Path, help=TOKENIZER_HELP)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "sentence_probe.json")
    args = ap.parse_args()
    if args.compare:
        return print_comparison(args.compare, args.measure, args.peak)
    if not args.encoders:
        ap.error("give encoder directories to probe, or --compare PROBE_JSON ...")
    check_encoders(ap, args.encoders)
    torch.set_num_threads(args.threads)
    start, load = time.time(), os.getloadavg()[0]

    from electralab.env import data_root
    from electralab.finetune.tasks import TASKS, read_split

    stsb = TASKS["stsb"]
    splits = {"train": read_split(stsb, "train", data_root()), "dev": read_split(stsb, "dev", data_root())}
    result = {"overlap": overlap(splits, args.tokenizer or args.encoders[0]), "encoders": []}
    print(f"STS-B dev Spearman x 100 ({len(splits['train'].labels)} train, {len(splits['dev'].labels)} dev pairs)")
    print(
        f"overlap, no model: words {result['overlap']['words']:.1f}, BPE pieces {result['overlap']['bpe_pieces']:.1f}"
    )
    print("| encoder | layer | cosine | ridge [CLS] | ridge mean | ridge u,v |\n|---|---|---|---|---|---|")
    for encoder_dir in args.encoders:
        found = probe(encoder_dir, splits, args.max_len, args.tokenizer)
        result["encoders"].append(found)
        for row in found["layers"]:
            print(
                f"| {encoder_dir} | {row['layer']} | {row['cosine']:.1f} | {row['ridge_cls']:.1f} | "
                f"{row['ridge_mean']:.1f} | {row['ridge_uv']:.1f} |",
                flush=True,
            )
    write_result(args.out, result, args.threads, load, start)


if __name__ == "__main__":
    main()
