"""Benchmark: our ELECTRA training step against Hugging Face transformers' ELECTRA, side by side in
one process, identical configuration.

    python bench/train_step.py                     # CPU, ELECTRA-Small, seq 128, batch 32: fp32 and bf16
    python bench/train_step.py --config tiny       # the tiny preset's main rows (4 x 128, vocab 8,192, no dropout)
    python bench/train_step.py --config tiny_ablation  # its ablation tables' shape (12 x 64)
    python bench/train_step.py --device cuda --precision bf16   # GPU: the same comparison under bf16 autocast
    python bench/train_step.py --device cuda --precision bf16 --config base --seq-len 512 --ours-only
    python bench/train_step.py --device cuda --precision bf16 --compile --steps 20   # eager and compiled, both sides
    python bench/train_step.py --device cuda --precision bf16 --static --steps 20    # + our static step, CUDA graphs
    python bench/train_step.py --profile           # where our step's time goes (torch.profiler, by operator)

Peer: ElectraForMaskedLM (generator) + ElectraForPreTraining (discriminator) with tied embeddings,
the same sampling and a 50x RTD weight, SDPA attention; both sides use fused AdamW.
`--precision best` (the default) times each implementation in fp32 and, where the device computes bf16
natively (`electralab.train.common.resolve_precision("auto")`), under bf16 autocast too, all interleaved
in one run, and compares each implementation's best mode (issue 12: ours >= 2x the peer's best).
`--compile` adds each implementation under torch.compile (ours: the objective; the peer: its generator
and discriminator), timed beside the eager ones. Reported per variant and precision: tokens/s, step
time, executed GFLOP/s (FlopCounterMode, counted eagerly: matmuls and attention, forward + backward)
and, against the device's peak in that precision (the CPU's matmul peak measured in the same run; the
data-sheet bf16 peak on GPU), model FLOP utilisation. Peak memory comes from a child process each (RSS
on CPU, max allocated on GPU; eager). Results are printed and written to bench/out/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from electralab.batch import Batch  # noqa: E402
from electralab.config import EncoderConfig, GeneratorSize, GeneratorSizes, load_params  # noqa: E402
from electralab.data.masking import mask_tokens  # noqa: E402
from electralab.export import huggingface_fields  # noqa: E402
from electralab.objectives.common import set_static, sized  # noqa: E402
from electralab.objectives.electra import Electra, Settings  # noqa: E402
from electralab.runs import resolve_run  # noqa: E402
from electralab.train.common import autocast, resolve_precision  # noqa: E402
from electralab.train.perf import count_flops, peak_flops  # noqa: E402

CONFIGS = {  # name -> (main model, generator, vocabulary size)
    # ELECTRA-Small (Clark et al. 2020 Table 6; TEAMS Table 5): generator 1/4 width.
    "small": (
        EncoderConfig(hidden=256, layers=12, heads=4, ffn=1024, embedding=128, relative_positions=False),
        GeneratorSize(hidden=64, heads=1, ffn=256),
        30522,
    ),
    # BERT-base main model, ELECTRA-Base generator (1/3 width).
    "base": (
        EncoderConfig(hidden=768, layers=12, heads=12, ffn=3072, embedding=768, relative_positions=False),
        GeneratorSize(hidden=256, heads=4, ffn=1024),
        30522,
    ),
}


# The tiny preset's shapes, read from params.yaml through the run that trains at each: its main rows
# (4 x 128, generator 1/4 wide) and its ablation tables (12 x 64, generator 1/2 wide).
TINY_RUNS = {"tiny": "electra", "tiny_ablation": "electra_ablation"}


def shape(config: str, pretraining: bool = True) -> tuple[EncoderConfig, GeneratorSize, int]:
    """(main model, generator, vocabulary size) of `--config`, with absolute positions (the peer has no
    relative ones); a tiny one `pretraining` with the run's pretraining dropout (none at the tiny preset)."""
    if config not in TINY_RUNS:
        return CONFIGS[config]
    params = dataclasses.replace(load_params(ROOT / "params.yaml"), preset="tiny")
    run = resolve_run(params, TINY_RUNS[config])
    main = dataclasses.replace(run.model, relative_positions=False)
    if pretraining and run.pretrain.dropout is not None:
        main = dataclasses.replace(main, dropout=run.pretrain.dropout, attention_dropout=run.pretrain.dropout)
    return main, run.generators.electra, params.active.vocab.size


def make_batch(batch_size: int, seq_len: int, vocab: int, device: torch.device, seed: int = 0) -> Batch:
    """Random full rows [CLS] ... [SEP], masked as the loader masks them (ELECTRA's scheme: exactly 15% of
    each row selected, the bound the static step's fixed number of predictions relies on)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch_size, seq_len), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    attention = torch.ones_like(ids, dtype=torch.bool)
    masked, mlm = mask_tokens(ids, attention, Settings().masking, vocab, g)
    return Batch(ids, attention, masked, mlm).to(device)


def adamw(params, device: torch.device) -> torch.optim.AdamW:
    """The same optimiser for both sides: the fused kernel (transformers' Trainer's default since torch 2.8)."""
    return torch.optim.AdamW(params, lr=1e-4, fused=True)


class Implementation:
    """One side of the comparison; `name` tells its eager and compiled variants apart."""

    side: str
    variant = ""  # "", "+compile", and ours also "+static" (fullgraph) and "+cudagraphs" (fullgraph, CUDA graphs)

    @property
    def name(self) -> str:
        return self.side + self.variant

    @property
    def compiled(self) -> bool:
        return bool(self.variant)


class Ours(Implementation):
    side = "electralab"

    def __init__(self, main: EncoderConfig, gen: GeneratorSize, vocab: int, device: torch.device):
        self.device = device
        self.model = Electra(main, GeneratorSizes(electra=gen), vocab, Settings()).to(device)
        self.opt = adamw(self.model.parameters(), device)

    def compile(self) -> None:
        self.variant = "+compile"
        self.model = torch.compile(self.model)

    def compile_static(self, cuda_graphs: bool = False) -> None:
        """The static step (objectives/positions.py) in one graph, fullgraph=True failing on any break; with
        `cuda_graphs`, replayed as CUDA graphs (mode="reduce-overhead")."""
        set_static(self.model)
        self.variant = "+cudagraphs" if cuda_graphs else "+static"
        self.model = torch.compile(self.model, fullgraph=True, mode="reduce-overhead" if cuda_graphs else None)

    def step(self, batch: Batch, precision: str) -> float:
        with autocast(self.device, precision):
            loss = self.model(batch).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())


class HuggingFace(Implementation):
    side = "transformers"

    def __init__(self, main: EncoderConfig, gen: GeneratorSize, vocab: int, device: torch.device):
        from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

        self.device = device
        # The generator as ours builds it (objectives/common.py `sized`): the main config, its size replaced.
        # SDPA attention (fused kernels on CUDA), as ours uses; transformers' default where it supports it.
        disc_cfg = ElectraConfig(**huggingface_fields(main, vocab), attn_implementation="sdpa")
        gen_cfg = ElectraConfig(**huggingface_fields(sized(main, gen), vocab), attn_implementation="sdpa")
        self.disc = ElectraForPreTraining(disc_cfg).to(device)
        self.gen = ElectraForMaskedLM(gen_cfg).to(device)
        # ELECTRA ties the generator's and discriminator's embeddings (and the generator's LM head).
        self.gen.electra.embeddings = self.disc.electra.embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight
        params = {id(p): p for m in (self.disc, self.gen) for p in m.parameters()}
        self.opt = adamw(params.values(), device)

    def compile(self) -> None:
        self.variant = "+compile"
        self.gen, self.disc = torch.compile(self.gen), torch.compile(self.disc)

    def step(self, batch: Batch, precision: str) -> float:
        labels = batch.input_ids.masked_fill(~batch.mlm_mask, -100)
        with autocast(self.device, precision):
            gen = self.gen(input_ids=batch.masked_ids, attention_mask=batch.attention_mask.long(), labels=labels)
            with torch.no_grad():
                logits = gen.logits[batch.mlm_mask].float()
                sampled = (logits - torch.empty_like(logits).exponential_().log()).argmax(-1)
            replaced = batch.input_ids.clone()
            replaced[batch.mlm_mask] = sampled
            disc = self.disc(
                input_ids=replaced,
                attention_mask=batch.attention_mask.long(),
                labels=(replaced != batch.input_ids).long(),
            )
            loss = gen.loss + 50.0 * disc.loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(runs, batch, steps: int, device: torch.device) -> dict[tuple[str, str], list[float]]:
    """Interleave every (implementation, precision) step by step so drift affects all alike."""
    times = {(impl.name, precision): [] for impl, precision in runs}
    for _ in range(steps):
        for impl, precision in runs:
            sync(device)
            start = time.perf_counter()
            impl.step(batch, precision)
            sync(device)
            times[impl.name, precision].append(time.perf_counter() - start)
    return times


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux carries that over from the
    parent through fork and exec, so every probe would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: no fork inheritance issue


def peak_memory(args, which: str, precision: str) -> float:
    """Peak memory (MB) of `which` in a fresh child process: RSS on CPU, max allocated on GPU."""
    cmd = [sys.executable, __file__, "--memory-probe", which, "--device", args.device, "--config", args.config]
    cmd += ["--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--precision", precision]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def precisions(choice: str, device: torch.device) -> list[str]:
    """`best`: fp32, and bf16 where the device computes it natively; otherwise the one asked for."""
    if choice == "best":
        return ["fp32", "bf16"] if resolve_precision("auto", device) == "bf16" else ["fp32"]
    return [resolve_precision(choice, device)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", default="small", choices=sorted(CONFIGS | TINY_RUNS))
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant (the median is reported)")
    ap.add_argument("--precision", default="best", choices=["best", "auto", "fp32", "bf16"])
    ap.add_argument("--ours-only", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time both implementations under torch.compile")
    ap.add_argument(
        "--static",
        action="store_true",
        help="also time our static step compiled whole (fullgraph), and on CUDA replayed as CUDA graphs",
    )
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's operator table of our step")
    ap.add_argument("--memory-probe", choices=["electralab", "transformers"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    main_cfg, gen_cfg, vocab = shape(args.config)
    batch = make_batch(args.batch_size, args.seq_len, vocab, device)
    modes = precisions(args.precision, device)

    if args.memory_probe:
        impl = (Ours if args.memory_probe == "electralab" else HuggingFace)(main_cfg, gen_cfg, vocab, device)
        for _ in range(2):
            impl.step(batch, modes[0])
        if device.type == "cuda":
            print(torch.cuda.max_memory_allocated() / 2**20)
        else:
            print(peak_rss_mb())
        return

    if args.profile:  # where our step's time goes, operator by operator (2 steps after a warm-up)
        from torch.profiler import ProfilerActivity, profile

        ours = Ours(main_cfg, gen_cfg, vocab, device)
        ours.step(batch, modes[-1])
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(2):
                ours.step(batch, modes[-1])
        sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"precision {modes[-1]}")
        print(prof.key_averages().table(sort_by=sort, row_limit=30))
        return

    kinds = [Ours] + ([] if args.ours_only else [HuggingFace])
    # Peak memory first, each in a child process, while this one holds nothing on the device yet.
    memory = {(kind.side, precision): peak_memory(args, kind.side, precision) for kind in kinds for precision in modes}
    impls = [kind(main_cfg, gen_cfg, vocab, device) for kind in kinds]
    flops = {}  # per side: an eager warm-up step counts it (the same in every precision, eager or compiled)
    for impl in impls:
        _, flops[impl.side] = count_flops(lambda: impl.step(batch, modes[0]))
    if args.compile:  # fresh instances (same seed, same weights), so the eager ones stay eager
        for kind in kinds:
            torch.manual_seed(0)
            impl = kind(main_cfg, gen_cfg, vocab, device)
            impl.compile()
            impls.append(impl)
    for cuda_graphs in [False, True][: 1 + (device.type == "cuda")] if args.static else []:
        torch.manual_seed(0)
        impl = Ours(main_cfg, gen_cfg, vocab, device)
        impl.compile_static(cuda_graphs)
        impls.append(impl)
    runs, warmups = [], {}
    for impl, precision in [(impl, precision) for impl in impls for precision in modes]:
        # warm-up: compilation (one graph per precision), allocator, kernel choices. A variant that fails here
        # is reported and left out, so that one lent GPU-minute still times the others.
        started = time.perf_counter()
        try:
            for _ in range(3 if impl.compiled else 1):
                impl.step(batch, precision)
        except Exception as error:  # noqa: BLE001 - any failure of one variant
            print(f"{impl.name} {precision}: failed in its warm-up, left out: {type(error).__name__}: {error}"[:2000])
            continue
        sync(device)
        warmups[impl.name, precision] = time.perf_counter() - started
        runs.append((impl, precision))
    times = time_steps(runs, batch, args.steps, device)
    peaks = {precision: peak_flops(device, precision) for precision in modes}
    tokens = args.batch_size * args.seq_len
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "config": args.config,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "vocab": vocab,
        "precisions": modes,
        "peak_flops": peaks,
        "impls": {},
    }
    for impl, precision in runs:
        t = statistics.median(times[impl.name, precision])
        peak = peaks[precision]
        results["impls"].setdefault(impl.name, {})[precision] = {
            "step_s": t,
            "tokens_per_s": tokens / t,
            "flops_per_step": flops[impl.side],
            "gflops_per_s": flops[impl.side] / t / 1e9,
            "mfu": flops[impl.side] / t / peak if peak else None,
            "peak_memory_mb": memory[impl.side, precision],
            "step_times": times[impl.name, precision],
            "warmup_s": warmups[impl.name, precision],  # compilation included
        }
    peak_text = ", ".join(f"{p} {v / 1e9 if v else 0:.1f}" for p, v in peaks.items())
    print(
        f"device={results['device']} threads={results['threads']} config={args.config} seq={args.seq_len} "
        f"batch={args.batch_size} vocab={vocab} load={results['load_average'][0]:.1f} "
        f"matmul peak GFLOP/s: {peak_text}"
    )
    print(
        f"{'impl':<22}{'prec':>6}{'step s':>9}{'tokens/s':>11}{'GFLOP/step':>12}"
        f"{'GFLOP/s':>10}{'MFU':>8}{'peak MB':>10}"
    )
    for name, by_precision in results["impls"].items():
        for precision, r in by_precision.items():
            mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] else "-"
            print(
                f"{name:<22}{precision:>6}{r['step_s']:>9.3f}{r['tokens_per_s']:>11.0f}"
                f"{r['flops_per_step'] / 1e9:>12.1f}{r['gflops_per_s']:>10.1f}{mfu:>8}{r['peak_memory_mb']:>10.0f}"
            )
    if "transformers" in results["impls"]:
        # Each side at its best: the fastest of its variants (eager or compiled) and precisions.
        best = {
            side: max(
                (
                    (f"{impl.name} {precision}", results["impls"][impl.name][precision]["tokens_per_s"])
                    for impl, precision in runs
                    if impl.side == side
                ),
                key=lambda item: item[1],
            )
            for side in ("electralab", "transformers")
        }
        suffixes = [""] + (["+compile"] if args.compile else [])
        impls = results["impls"]
        results["speedup"] = {
            f"{precision}{suffix}": impls["electralab" + suffix][precision]["tokens_per_s"]
            / impls["transformers" + suffix][precision]["tokens_per_s"]
            for precision in modes
            for suffix in suffixes
            if precision in impls.get("electralab" + suffix, {}) and precision in impls.get("transformers" + suffix, {})
        }
        results["speedup"]["best"] = best["electralab"][1] / best["transformers"][1]
        for variant, ratio in results["speedup"].items():
            if variant != "best":
                print(f"speedup in {variant} (tokens/s, electralab / transformers): {ratio:.2f}x")
        print(
            f"speedup, each at its best ({best['electralab'][0]} against {best['transformers'][0]}): "
            f"{results['speedup']['best']:.2f}x"
        )
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    # One file per setting, so that runs of several batch sizes or variants do not overwrite each other.
    variant = "_ours" * args.ours_only + "_compile" * args.compile + "_static" * args.static
    name = f"train_step_{args.device.split(':')[0]}_{args.config}_{args.seq_len}_b{args.batch_size}{variant}.json"
    (out / name).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
