"""Benchmark: the shards stage against the plain baseline a user would write, in the same run.

    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/shards_throughput.py
    ELECTRALAB_DATA=../shared/data PYTHONPATH=src python bench/shards_throughput.py --sizes 5 --repeat 1

What is measured: MB/s of raw text turned into packed seq_len blocks on disk, from the corpus stage's
Parquet documents (the shards stage's input) of the first N MB of enwiki_featured_articles.txt.
    baseline  datasets.Dataset.from_parquet + .map(batched=True) calling the same sentencepiece model
              (its default multi-threaded list encode), then FULL-SENTENCES packing in Python lists and
              np.array(...).tofile
    ours      electralab.data.shards.build_shards (workers = CPU count, validation_fraction = 0)
Both produce the same blocks; the run checks that their train tokens are byte-identical.

Every (variant, size, repeat) runs in a fresh child process. Peak memory: "main RSS" is the child's own
high-water mark (VmHWM; ru_maxrss would include the parent's size at fork); "all RSS" and "all PSS" are
the peaks of the summed RSS / PSS of the child and its worker processes, sampled every 20 ms with psutil
(RSS counts pages shared after fork once per process, PSS splits them: PSS is the real footprint). The
best time of the repeats is reported (the machine may be shared). Writes bench/out/shards_throughput.json.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = "enwiki_featured_articles.txt"


# --------------------------------------------------------------------------------------------
# The two variants (each runs in its own child process)
# --------------------------------------------------------------------------------------------


def run_baseline(corpus_dir: Path, vocab_dir: Path, out_dir: Path, seq_len: int) -> None:
    import datasets
    import numpy as np
    import sentencepiece as spm

    from electralab import CLS_ID, PAD_ID, SEP_ID

    sp = spm.SentencePieceProcessor(model_file=str(vocab_dir / "spm.model"))
    parts = sorted(str(p) for p in corpus_dir.glob("part-*.parquet"))
    ds = datasets.Dataset.from_parquet(parts, cache_dir=str(out_dir / "hf-cache"))

    def tokenize(batch):
        # Documents are paragraphs joined by "\n": encode all paragraphs of the batch in one call.
        paragraphs, owner = [], []
        for d, doc in enumerate(batch["text"]):
            ps = doc.split("\n")
            paragraphs += ps
            owner += [d] * len(ps)
        ids = [[] for _ in batch["text"]]
        for d, encoded in zip(owner, sp.encode(paragraphs)):
            ids[d].extend(encoded)
        for row in ids:
            row.append(SEP_ID)
        return {"input_ids": ids}

    ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names)
    stream = list(itertools.chain.from_iterable(ds["input_ids"]))
    body = seq_len - 2
    blocks = [[CLS_ID] + stream[i : i + body] + [SEP_ID] for i in range(0, len(stream), body)]
    blocks[-1] += [PAD_ID] * (seq_len - len(blocks[-1]))
    np.array(blocks, dtype=np.uint16).tofile(out_dir / "train.bin")


def run_ours(corpus_dir: Path, vocab_dir: Path, out_dir: Path, seq_len: int) -> None:
    from electralab.config import ShardsConfig
    from electralab.data.shards import build_shards

    cfg = ShardsConfig(seq_len=seq_len, validation_fraction=0.0, workers=os.cpu_count() or 1)
    build_shards(corpus_dir, vocab_dir, out_dir / "shards", cfg)


def child(variant: str, corpus_dir: Path, vocab_dir: Path, out_dir: Path, seq_len: int) -> dict:
    started = time.perf_counter()
    {"baseline": run_baseline, "ours": run_ours}[variant](corpus_dir, vocab_dir, out_dir, seq_len)
    seconds = time.perf_counter() - started
    files = [out_dir / "train.bin"] if variant == "baseline" else sorted((out_dir / "shards").glob("train-*.bin"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return {"seconds": seconds, "train_sha256": h.hexdigest(), "peak_rss_main_mb": _vm_hwm_mb()}


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


def run_child(args: list[str], env: dict) -> dict:
    """Run one child; return its JSON line plus the peaks of its process tree's summed RSS and PSS
    (PSS splits pages shared between processes, e.g. after fork, among them: the real footprint)."""
    import psutil

    proc = psutil.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_rss = peak_pss = 0
    while proc.poll() is None:
        try:
            infos = [p.memory_full_info() for p in (proc, *proc.children(recursive=True))]
            peak_rss = max(peak_rss, sum(i.rss for i in infos))
            peak_pss = max(peak_pss, sum(i.pss for i in infos))
        except psutil.Error:  # a process ended between listing and reading
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{err}")
    return {
        **json.loads(out.strip().splitlines()[-1]),
        "peak_rss_total_mb": peak_rss / 1e6,
        "peak_pss_total_mb": peak_pss / 1e6,
    }


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def make_corpus(work: Path, mirror: Path, megabytes: float) -> tuple[Path, dict]:
    """The corpus stage's output for the first `megabytes` MB of SOURCE, cut at a document boundary."""
    from electralab.config import CorpusConfig, MirrorSource
    from electralab.data.corpus import build_corpus

    sub = work / f"mirror-{megabytes:g}mb"
    (sub / "corpus").mkdir(parents=True, exist_ok=True)
    with open(mirror / "corpus" / SOURCE, "rb") as src, open(sub / "corpus" / SOURCE, "wb") as dst:
        written, limit = 0, int(megabytes * 1e6)
        for line in src:
            dst.write(line)
            written += len(line)
            if written >= limit and line.strip() == b"":
                break
    cfg = CorpusConfig(hub=(), mirror=(MirrorSource(file=SOURCE, format="paragraphs"),), uncased=True)
    out = work / f"corpus-{megabytes:g}mb"
    stats = build_corpus(cfg, out, sub)
    return out, stats


def main() -> None:
    from electralab.train.common import cpu_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[20, 80], help="corpus sizes in MB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--child", nargs=4, metavar=("VARIANT", "CORPUS", "VOCAB", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        variant, corpus, vocab, out = args.child
        print(json.dumps(child(variant, Path(corpus), Path(vocab), Path(out), args.seq_len)))
        return

    from electralab.config import VocabConfig
    from electralab.data.vocab import train_vocab
    from electralab.env import data_root

    mirror = data_root() or (ROOT / "../shared/data").resolve()
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpora = {mb: make_corpus(work, mirror, mb) for mb in args.sizes}
    vocab_dir = work / "vocab"
    train_vocab(
        corpora[min(args.sizes)][0],
        vocab_dir,
        VocabConfig(size=args.vocab_size, input_sentence_size=1_000_000, threads=os.cpu_count() or 1),
    )

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    rows = []
    for mb, (corpus_dir, stats) in corpora.items():
        runs: dict[str, list[dict]] = {"baseline": [], "ours": []}
        for rep, variant in itertools.product(range(args.repeat), runs):
            out = work / f"run-{variant}-{mb:g}-{rep}"
            out.mkdir()
            runs[variant].append(
                run_child(
                    [
                        sys.executable,
                        __file__,
                        "--seq-len",
                        str(args.seq_len),
                        "--child",
                        variant,
                        str(corpus_dir),
                        str(vocab_dir),
                        str(out),
                    ],
                    env,
                )
            )
            shutil.rmtree(out)
        best = {v: min(r, key=lambda x: x["seconds"]) for v, r in runs.items()}
        if best["baseline"]["train_sha256"] != best["ours"]["train_sha256"]:
            sys.exit(f"{mb} MB: baseline and ours produced different blocks")
        for variant, r in best.items():
            rows.append(
                {
                    "variant": variant,
                    "corpus_mb": stats["bytes"] / 1e6,
                    "documents": stats["documents"],
                    "seconds": r["seconds"],
                    "mb_per_s": stats["bytes"] / 1e6 / r["seconds"],
                    "all_seconds": [x["seconds"] for x in runs[variant]],
                    "peak_rss_main_mb": max(x["peak_rss_main_mb"] for x in runs[variant]),
                    "peak_rss_total_mb": max(x["peak_rss_total_mb"] for x in runs[variant]),
                    "peak_pss_total_mb": max(x["peak_pss_total_mb"] for x in runs[variant]),
                }
            )
    shutil.rmtree(work)

    print(
        f"\nshards stage throughput, seq_len={args.seq_len}, {args.vocab_size:,}-piece BPE, "
        f"best of {args.repeat} ({os.cpu_count()} CPUs, load average at end {os.getloadavg()[0]:.1f})"
    )
    print(
        f"{'corpus MB':>10} {'variant':>9} {'seconds':>8} {'MB/s':>7} {'speedup':>8} "
        f"{'peak MB: main RSS':>17} {'all RSS':>8} {'all PSS':>8}"
    )
    for row in rows:
        base = next(r for r in rows if r["corpus_mb"] == row["corpus_mb"] and r["variant"] == "baseline")
        row["speedup"] = row["mb_per_s"] / base["mb_per_s"]
        print(
            f"{row['corpus_mb']:>10.1f} {row['variant']:>9} {row['seconds']:>8.2f} {row['mb_per_s']:>7.2f} "
            f"{row['speedup']:>7.2f}x {row['peak_rss_main_mb']:>17.0f} {row['peak_rss_total_mb']:>8.0f} "
            f"{row['peak_pss_total_mb']:>8.0f}"
        )
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rows": rows,
        "machine": {
            "cpus": os.cpu_count(),
            "processor": cpu_model(),
            "python": platform.python_version(),
            "loadavg_end": os.getloadavg(),
        },
        "seq_len": args.seq_len,
        "vocab_size": args.vocab_size,
        "repeat": args.repeat,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shards_throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out / 'shards_throughput.json'}")


if __name__ == "__main__":
    main()
