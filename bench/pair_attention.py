"""Whether an encoder's words find themselves across a sentence pair: layer by layer, the attention that a piece
of one sentence sends to the same piece in the other, on STS-B dev pairs encoded as fine-tuning encodes them
(`[CLS] a [SEP] b [SEP]`), every encoder frozen (eval mode, fp32).

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/pair_attention.py --threads 1 \
        models/control/encoder models/electra/encoder --out bench/out/pair_attention.json
    python bench/sentence_probe.py --compare results/pair_attention/encoders.json --measure same_piece --peak

Why: at the tiny preset STS-B fine-tuning follows the pretraining tokens, and a local start (ALiBi) that ends the
detector's dead phase early fine-tunes lower than the preset's start at the same budget. What STS-B reads there is
this: the highest layer's same_piece follows fine-tuned STS-B across encoders, a local start suppresses it, and along
one run it grows with the tokens through the detector's exit (docs/findings.md, "What STS-B reads at this scale").
Per layer, over every query piece that also occurs in the other sentence:

- same_piece: the attention mass on those occurrences, the mean over heads;
- best_head: the same for the head that sends the most;
- even: what even attention over the real keys would send (the occurrences over the sequence's length).

The JSON has sentence_probe's layout (`encoders` -> `layers`), so `sentence_probe.py --compare --measure` sets a
measure beside each encoder's fine-tuned STS-B.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from sentence_probe import TOKENIZER_HELP, check_encoders, write_result  # noqa: E402


def across_the_pair(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, T) True where query and key hold the same piece, one in sentence a and the other in sentence b."""
    from electralab import SEP_ID

    seps = ((ids == SEP_ID) & mask).long().cumsum(1)  # a: 0 after [CLS], b: 1 after the first [SEP]
    position = torch.arange(ids.shape[1])
    sentence = torch.where((position > 0) & (ids != SEP_ID) & mask, seps, torch.full_like(seps, -1))
    inside = sentence >= 0
    same = ids[:, :, None] == ids[:, None, :]
    return same & inside[:, :, None] & inside[:, None, :] & (sentence[:, :, None] != sentence[:, None, :])


@torch.no_grad()
def measure(encoder, encoded, batch_size: int = 64) -> list[dict]:
    """Per layer (1..L): same_piece, best_head and even (module docstring), means over the queries of all pairs."""
    from electralab.finetune.features import eval_batches
    from electralab.train.diagnostics import attention_inputs, attention_probs

    layers, heads = encoder.cfg.layers, encoder.cfg.heads
    mass, even, queries = np.zeros((layers, heads)), 0.0, 0
    for index in eval_batches(encoded.lengths, batch_size):
        ids, mask, _ = encoded.batch(index)
        pairs = across_the_pair(ids, mask)
        query = pairs.any(-1)  # (B, T)
        with attention_inputs(encoder) as calls:
            encoder(ids, mask)
        for layer, call in enumerate(calls):
            p = attention_probs(*call)  # (B, heads, T, T)
            on_same = (p * pairs[:, None].float()).sum(-1)  # (B, heads, T)
            mass[layer] += on_same.permute(0, 2, 1)[query].sum(0).double().numpy()
        even += float((pairs.sum(-1).float() / mask.sum(-1, keepdim=True))[query].sum())
        queries += int(query.sum())
    mass, even = mass / queries, even / queries
    return [
        {"layer": layer + 1, "same_piece": float(row.mean()), "best_head": float(row.max()), "even": even}
        for layer, row in enumerate(mass)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("encoders", nargs="+", type=Path, help="exported encoder directories (models/<run>/encoder)")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--tokenizer", type=Path, help=TOKENIZER_HELP)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "pair_attention.json")
    args = ap.parse_args()
    check_encoders(ap, args.encoders)
    torch.set_num_threads(args.threads)
    start, load = time.time(), os.getloadavg()[0]

    from electralab.data.vocab import Tokenizer
    from electralab.env import data_root
    from electralab.export import load_encoder
    from electralab.finetune.features import encode_pairs
    from electralab.finetune.tasks import TASKS, read_split

    dev = read_split(TASKS["stsb"], "dev", data_root())
    result = {"encoders": []}
    print("| encoder | layer | same piece (mean over heads) | best head | even |\n|---|---|---|---|---|")
    for encoder_dir in args.encoders:
        tokenizer, encoder = Tokenizer(args.tokenizer or encoder_dir), load_encoder(encoder_dir).eval()
        encoded = encode_pairs(tokenizer, dev.text_a, dev.text_b, np.zeros(len(dev.labels)), args.max_len)
        rows = measure(encoder, encoded)
        result["encoders"].append({"encoder": str(encoder_dir), "layers": rows})
        for row in rows:
            print(
                f"| {encoder_dir} | {row['layer']} | {row['same_piece']:.3f} | {row['best_head']:.3f} | "
                f"{row['even']:.3f} |",
                flush=True,
            )
    write_result(args.out, result, args.threads, load, start)


if __name__ == "__main__":
    main()
