"""Benchmark: fine-tuning throughput with dynamic padding against fixed 512-token padding, in one run,
on the same examples, with the stage's own training step.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/finetune_throughput.py       # after pretrain@mlm
    # options: --model models/mlm/encoder  --tasks sst2 mnli rte  --examples 256  --repeat 2  --threads 1

Variants, each one training pass (forward, backward, AdamW step, batch 32) over the same examples of
each task, tokenised with the run's vocabulary (max 512 tokens):
- fixed512: every batch padded to 512 tokens (the papers' "sequence length 512" taken literally, as a
  TensorFlow/TPU pipeline with static shapes does);
- dynamic: random batches padded to their longest row;
- dynamic+grouped: what the stage does (features.train_batches): batches of similar lengths within
  windows of 50 batches, padded to their longest row.
The step is exactly finetune.trial's (FinetuneModel + make_adamw; attention masks [PAD], so the
padding changes the speed, not the result: tests check the outputs match). One thread by default, as
one trial of the stage runs. Reported: examples/s, real (non-[PAD]) tokens/s, the [PAD] share, the
speed-up over fixed512; the best of `--repeat` passes, variants interleaved.

With `--trials K` (K > 1), also K trials of one epoch (the same batch size, K learning rates and seeds), one after
another (finetune.trial.run_trial, as the stage's workers run them) against together (finetune.batched.run_trials,
one batched model), each trial's examples/s. JSON -> bench/out/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from electralab.config import load_params  # noqa: E402
from electralab.data.vocab import Tokenizer  # noqa: E402
from electralab.env import data_root  # noqa: E402
from electralab.export import load_encoder  # noqa: E402
from electralab.finetune.batched import run_trials  # noqa: E402
from electralab.finetune.data import TaskData  # noqa: E402
from electralab.finetune.features import Encoded, encode_pairs, train_batches  # noqa: E402
from electralab.finetune.grid import HParams  # noqa: E402
from electralab.finetune.model import FinetuneModel  # noqa: E402
from electralab.finetune.tasks import TASKS, read_split  # noqa: E402
from electralab.finetune.trial import TrialSettings, run_trial  # noqa: E402
from electralab.train.common import make_adamw  # noqa: E402

BATCH = 32
VARIANTS = ("fixed512", "dynamic", "dynamic+grouped")


def task_sample(
    name: str, tokenizer: Tokenizer, root: Path, examples: int, max_len: int, split: str = "train"
) -> Encoded:
    """A fixed random subset of `examples` examples of a task's `split`, tokenised (at most `max_len` tokens)."""
    split = read_split(TASKS[name], split, root)
    keep = np.sort(np.random.default_rng(0).permutation(len(split))[:examples])
    split = split.subset(keep)
    return encode_pairs(tokenizer, split.text_a, split.text_b, split.labels, max_len)


def training_pass(model: FinetuneModel, encoded: Encoded, variant: str, seed: int) -> tuple[float, int, int]:
    """Seconds for one pass, real tokens and padded positions."""
    opt = make_adamw(model, lr=1e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    batches = train_batches(
        encoded.lengths, BATCH, np.random.default_rng(seed), group_by_length=variant == "dynamic+grouped"
    )
    pad_to = 512 if variant == "fixed512" else None
    model.train()
    real = padded = 0
    start = time.perf_counter()
    for index in batches:
        input_ids, attention_mask, labels = encoded.batch(index, pad_to=pad_to)
        loss = model.loss(model(input_ids, attention_mask), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        real += int(attention_mask.sum())
        padded += attention_mask.numel()
    return time.perf_counter() - start, real, padded


def trials_pass(model_dir: str, name: str, encoded: Encoded, trials: int) -> dict:
    """Seconds for `trials` one-epoch trials one after another, and together; examples/s of a trial each way."""
    data = TaskData(TASKS[name], encoded, [])  # training only: the evaluations are the same work either way
    settings = TrialSettings.of(load_params(ROOT / "params.yaml").presets["tiny"].finetune)
    hps = [HParams(lr, 1, BATCH, 0.06) for lr in np.linspace(1e-5, 1e-4, trials)]
    seeds = list(range(1, trials + 1))
    start = time.perf_counter()
    for hp, seed in zip(hps, seeds):
        run_trial(data, load_encoder(model_dir), hp, seed, settings)
    alone = time.perf_counter() - start
    start = time.perf_counter()
    run_trials(data, load_encoder(model_dir), hps, seeds, settings)
    together = time.perf_counter() - start
    return {"alone_s": alone, "together_s": together, "examples": len(encoded) * trials}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=str(ROOT / "models" / "mlm" / "encoder"), help="an exported encoder (with its vocabulary)"
    )
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mnli", "rte"])
    parser.add_argument("--examples", type=int, default=256, help="training examples per task (a fixed random subset)")
    parser.add_argument(
        "--fixed-examples",
        type=int,
        default=64,
        help="fixed512 is timed on the first N of those examples: every row costs 512 tokens "
        "whichever it is, and a pass over all of them takes minutes on a CPU",
    )
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trials", type=int, default=1, help="K > 1: also K trials one after another and together")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "finetune_throughput.json"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    root = data_root() or (ROOT / "../shared/data").resolve()
    tokenizer = Tokenizer(args.model)
    encoder = load_encoder(args.model)
    if encoder.cfg.max_positions < 512:
        sys.exit(f"{args.model}: max_positions={encoder.cfg.max_positions} < 512, cannot pad to 512")
    print(
        f"{args.model}: {encoder.cfg.layers} layers x {encoder.cfg.hidden}; {args.threads} thread(s); "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}"
    )

    results = []
    for name in args.tasks:
        task = TASKS[name]
        encoded = task_sample(name, tokenizer, root, args.examples, 512)
        fixed_rows = encoded.subset(np.arange(min(args.fixed_examples, len(encoded))))
        best: dict[str, dict] = {}
        for r in range(args.repeat):
            for variant in VARIANTS:  # interleaved: a load spike hits every variant alike
                torch.manual_seed(0)
                model = FinetuneModel(load_encoder(args.model), task)
                rows = fixed_rows if variant == "fixed512" else encoded
                seconds, real, padded = training_pass(model, rows, variant, seed=r)
                rate = {
                    "examples_per_s": len(rows) / seconds,
                    "tokens_per_s": real / seconds,
                    "pad_share": 1 - real / padded,
                    "timed_examples": len(rows),
                }
                if variant not in best or rate["examples_per_s"] > best[variant]["examples_per_s"]:
                    best[variant] = rate
        for variant in VARIANTS:
            rate = best[variant]
            row = {
                "task": name,
                "variant": variant,
                "mean_tokens": round(float(encoded.lengths.mean()), 1),
                "timed_examples": rate["timed_examples"],
                "examples_per_s": round(rate["examples_per_s"], 1),
                "tokens_per_s": round(rate["tokens_per_s"]),
                "pad_share": round(rate["pad_share"], 3),
                "speedup_vs_fixed512": round(rate["examples_per_s"] / best["fixed512"]["examples_per_s"], 1),
            }
            results.append(row)
            print(
                f"{name:5s} {variant:16s} {row['examples_per_s']:8.1f} ex/s {row['tokens_per_s']:8d} tok/s "
                f"pad {row['pad_share']:.0%}  x{row['speedup_vs_fixed512']}",
                flush=True,
            )
        if args.trials > 1:
            timed = min(
                (trials_pass(args.model, name, encoded, args.trials) for _ in range(args.repeat)),
                key=lambda t: t["together_s"],
            )
            row = {
                "task": name,
                "variant": f"{args.trials} trials together",
                "alone_examples_per_s": round(timed["examples"] / timed["alone_s"], 1),
                "together_examples_per_s": round(timed["examples"] / timed["together_s"], 1),
                "speedup_together": round(timed["alone_s"] / timed["together_s"], 2),
            }
            results.append(row)
            print(
                f"{name:5s} {args.trials} trials: one after another {row['alone_examples_per_s']:8.1f} ex/s, "
                f"together {row['together_examples_per_s']:8.1f} ex/s  x{row['speedup_together']}",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "threads": args.threads,
                "batch_size": BATCH,
                "load_average_end": os.getloadavg()[0],
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"-> {out}")


if __name__ == "__main__":
    main()
