"""Benchmark: a fine-tuning trial's training step against a plain transformers fine-tuning loop, in one run,
same model size, task, examples and batches.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/finetune_peer.py --vocab models/mlm/encoder
    # options: --tasks sst2 mrpc  --examples 512  --repeat 2  --threads 1
    #          --config tiny (4 x 128) | tiny_ablation (12 x 64) | small

Both sides train one pass over the same `--examples` training examples of each task (a fixed random subset,
tokenised with the vocabulary of `--vocab`, an exported encoder's or a vocab stage's directory), in the same
batches of 32: the stage's own length-grouped batches (features.train_batches), each padded to its longest row.
Ours is exactly finetune.trial's step (FinetuneModel on our Encoder, make_adamw); the peer is what a transformers
user writes: ElectraForSequenceClassification(labels=...) and torch.optim.AdamW (fused, as the Trainer's default),
forward, backward, step. Same shape for both (the tiny preset's main 4 x 128 by default, absolute positions for
both, as the peer has no relative ones; dropout 0.1 in fine-tuning), randomly initialised: the weights do not
change the speed. Each runs in fp32 and, where the CPU computes bf16 natively, under bf16 autocast; all variants
interleaved, the best of `--repeat` passes each; the issue's comparison is each side's best mode (issue 12:
ours >= 2x). One thread by default, as one trial of the stage runs. Also reported, as bench/train_step.py does
for pretraining: each side's executed FLOPs per pass (FlopCounterMode, counted eagerly: matmuls and attention,
forward and backward), its GFLOP/s against the matmul peak measured in the same run at the same thread count
(fp32, and bf16 under bf16 autocast), and its peak memory over a pass of every task (VmHWM of a child process
of its own per side and precision). JSON -> bench/out/finetune_peer.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from finetune_throughput import task_sample  # noqa: E402
from train_step import TINY_RUNS, peak_rss_mb, shape  # noqa: E402

from electralab.config import EncoderConfig  # noqa: E402
from electralab.data.vocab import Tokenizer  # noqa: E402
from electralab.env import data_root  # noqa: E402
from electralab.errors import DataError  # noqa: E402
from electralab.export import huggingface_fields  # noqa: E402
from electralab.finetune.features import train_batches  # noqa: E402
from electralab.finetune.model import FinetuneModel  # noqa: E402
from electralab.finetune.tasks import TASKS  # noqa: E402
from electralab.model.encoder import Encoder, make_token_embedding  # noqa: E402
from electralab.train.common import autocast, make_adamw, resolve_precision  # noqa: E402
from electralab.train.perf import count_flops, peak_flops  # noqa: E402

BATCH = 32


class Ours:
    name = "electralab"

    def __init__(self, cfg: EncoderConfig, vocab: int, task):
        self.model = FinetuneModel(Encoder(cfg, make_token_embedding(vocab, cfg.embedding, 0.02)), task)
        self.opt = make_adamw(self.model, lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)

    def step(self, input_ids, attention_mask, labels, precision: str) -> None:
        with autocast(input_ids.device, precision):
            loss = self.model.loss(self.model(input_ids, attention_mask), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class HuggingFace:
    name = "transformers"

    def __init__(self, cfg: EncoderConfig, vocab: int, task):
        from transformers import ElectraConfig, ElectraForSequenceClassification

        config = ElectraConfig(**huggingface_fields(cfg, vocab), num_labels=task.num_outputs)
        self.model = ElectraForSequenceClassification(config)
        # transformers' Trainer's default optimiser since torch 2.8 (optim="adamw_torch_fused")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def step(self, input_ids, attention_mask, labels, precision: str) -> None:
        with autocast(input_ids.device, precision):
            loss = self.model(input_ids=input_ids, attention_mask=attention_mask.long(), labels=labels).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def training_pass(impl, encoded, batches, precision: str) -> float:
    """Seconds for one pass over the examples."""
    impl.model.train()
    start = time.perf_counter()
    for index in batches:
        impl.step(*encoded.batch(index), precision)
    return time.perf_counter() - start


def peak_memory(which: str, precision: str) -> float:
    """Peak resident memory (MB) of one side training a pass over every task, in a fresh child process."""
    cmd = [sys.executable, __file__, *sys.argv[1:], "--memory-probe", which, precision]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vocab", default=str(ROOT / "models" / "mlm" / "encoder"), help="a directory with a vocabulary"
    )
    parser.add_argument(
        "--tasks", nargs="+", default=["sst2", "mrpc"], choices=[t for t, task in TASKS.items() if task.kind != "span"]
    )
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--config", choices=["small", *TINY_RUNS], default="tiny")
    parser.add_argument("--max-len", type=int, default=128, help="the tiny preset's finetune.max_seq_len")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "finetune_peer.json"))
    parser.add_argument("--memory-probe", nargs=2, metavar=("SIDE", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    precisions = ["fp32", "bf16"] if resolve_precision("auto", device) == "bf16" else ["fp32"]
    root = data_root() or (ROOT / "../shared/data").resolve()
    try:
        tokenizer = Tokenizer(args.vocab)
    except DataError as e:
        sys.exit(f"error: --vocab {args.vocab}: {e}")
    cfg = dataclasses.replace(shape(args.config, pretraining=False)[0], max_positions=512)
    sides = {"electralab": Ours, "transformers": HuggingFace}
    samples = {name: task_sample(name, tokenizer, root, args.examples, args.max_len) for name in args.tasks}

    def batches_of(encoded):
        return train_batches(encoded.lengths, BATCH, np.random.default_rng(0), group_by_length=True)

    if args.memory_probe:  # a child process: one side, one precision, a pass over every task
        which, precision = args.memory_probe
        for name, encoded in samples.items():
            training_pass(sides[which](cfg, tokenizer.vocab_size, TASKS[name]), encoded, batches_of(encoded), precision)
        print(peak_rss_mb())
        return

    # Peak memory first, each in a child process, while this one holds no model yet.
    memory = {(side, p): peak_memory(side, p) for side in sides for p in precisions}
    peaks = {p: peak_flops(device, p) for p in precisions}  # at this process's thread count
    print(
        f"{args.config} ({cfg.layers} x {cfg.hidden}), vocab {tokenizer.vocab_size}; {args.threads} thread(s); "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; precisions {precisions}; "
        f"load average {os.getloadavg()[0]:.2f}; matmul peak GFLOP/s "
        + ", ".join(f"{p} {v / 1e9:.1f}" for p, v in peaks.items())
        + "; peak memory MB "
        + ", ".join(f"{side} {p} {v:.0f}" for (side, p), v in memory.items()),
        flush=True,
    )
    results = []
    for name, encoded in samples.items():
        task = TASKS[name]
        batches = batches_of(encoded)
        torch.manual_seed(0)
        impls = [kind(cfg, tokenizer.vocab_size, task) for kind in sides.values()]
        flops = {}  # executed FLOPs of one pass, counted eagerly (the same in every precision); also a warm-up
        for impl in impls:
            _, flops[impl.name] = count_flops(lambda impl=impl: training_pass(impl, encoded, batches, precisions[0]))
            for precision in precisions:  # first-call allocations and kernel selection
                impl.step(*encoded.batch(batches[0]), precision)
        best: dict[tuple[str, str], float] = {}
        for _ in range(args.repeat):
            for impl in impls:  # interleaved: a load spike hits every variant alike
                for precision in precisions:
                    rate = len(encoded) / training_pass(impl, encoded, batches, precision)
                    best[impl.name, precision] = max(best.get((impl.name, precision), 0.0), rate)
        top = {impl.name: max(precisions, key=lambda p, n=impl.name: best[n, p]) for impl in impls}
        ratio = best["electralab", top["electralab"]] / best["transformers", top["transformers"]]
        # GFLOP/s of a side = its FLOPs per pass x passes per second; of the peak in that precision.
        gflops = {(n, p): flops[n] * v / len(encoded) / 1e9 for (n, p), v in best.items()}
        row = {
            "task": name,
            "examples": len(encoded),
            "mean_tokens": round(float(encoded.lengths.mean()), 1),
            "examples_per_s": {f"{n} {p}": round(v, 1) for (n, p), v in best.items()},
            "gflop_per_pass": {n: round(f / 1e9, 2) for n, f in flops.items()},
            "gflops_per_s": {f"{n} {p}": round(v, 1) for (n, p), v in gflops.items()},
            "of_peak": {f"{n} {p}": round(v * 1e9 / peaks[p], 3) for (n, p), v in gflops.items()},
            "best": top,
            "speedup_best": round(ratio, 2),
        }
        results.append(row)
        rates = ", ".join(
            f"{k} {v} ({row['gflops_per_s'][k]} GFLOP/s, {row['of_peak'][k]:.0%} of the peak)"
            for k, v in row["examples_per_s"].items()
        )
        work = ", ".join(f"{n} {v}" for n, v in row["gflop_per_pass"].items())
        print(f"{name}: {rates} examples/s; GFLOP a pass {work}; each at its best: {ratio:.2f}x", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "config": args.config,
        "threads": args.threads,
        "batch_size": BATCH,
        "matmul_peak_gflops": {p: round(v / 1e9, 1) for p, v in peaks.items()},
        "peak_memory_mb": {f"{side} {p}": round(v) for (side, p), v in memory.items()},
        "results": results,
    }
    out.write_text(json.dumps({**summary, "load_average_end": os.getloadavg()[0]}, indent=2) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
