"""PretrainLoader: batches of packed blocks for pretraining, deterministic, rank-split, exactly resumable.

    from electralab.data.loader import PretrainLoader
    loader = PretrainLoader("data/shards", "train", micro_batch_size=32, seed=1, masking=MaskingConfig(),
                            rank=0, world_size=1)
    for step, batch in zip(range(steps), loader):      # infinite over epochs
        ...                                            # batch: electralab.batch.Batch, (B, T) tensors
        state = loader.state_dict()                    # save with the checkpoint
    loader.load_state_dict(state)                      # the next batches are bit-identical

Order: in epoch e the blocks are permuted by a generator seeded with (seed, e); rank r of world_size
takes every world_size-th block of that order, starting at r (disjoint; all ranks get
blocks // world_size, the few left over are skipped that epoch). An epoch ends when fewer than
micro_batch_size blocks remain for the rank; the next epoch starts with a new permutation.

Masking: dynamic by default. A sample's mask comes from a generator seeded with (seed, epoch, its
global position in the epoch's order), so it does not depend on batch size, rank count or where a run
was resumed. When the shards hold static masks (shards.static_masking.duplication = N), epoch e uses
copy e mod N, which must have been made with `masking` (a run of another masking is refused, not silently
trained on masks it did not ask for).

Validation (`split="validation"`): one sequential pass per iteration (no shuffling, the last batch may be
short), each rank every world_size-th block, masks as in epoch 0: the same batches every time.

Shards are checked against manifest.json when opened: file sizes always, sha256 when `verify` (default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from electralab import PAD_ID
from electralab.batch import Batch
from electralab.config import MaskingConfig, to_dict
from electralab.data.masking import derive_seed, mask_tokens
from electralab.data.shards import read_shards_manifest, verify_shards
from electralab.errors import ConfigError, DataError

_MASK_STREAM = 0x6D61736B  # "mask": keeps mask seeds apart from the order's (seed, epoch) stream


def check_static_masking(shards_dir: Path, made_with: dict, masking: MaskingConfig) -> None:
    """Static masks serve only a run that masks as they were made: the shards are shared by every run, and
    the methods mask differently (TEAMS like BERT, never [CLS]/[SEP]; ELECTRA 85% [MASK], no random token)."""
    wanted = to_dict(masking)
    differ = [
        f"{k}: {made_with.get(k)!r} in the shards, {v!r} in the run" for k, v in wanted.items() if made_with.get(k) != v
    ]
    if differ:
        raise ConfigError(
            f"{shards_dir} holds static masks made with shards.static_masking.masking, which this run's masking "
            f"(its method's, or runs.<run>.settings.masking) does not match: {'; '.join(differ)}. Set the two "
            f"alike, or mask dynamically (shards.static_masking.duplication: 0)"
        )


class PretrainLoader:
    def __init__(
        self,
        shards_dir: str | Path,
        split: str = "train",
        micro_batch_size: int = 32,
        seed: int = 1,
        masking: MaskingConfig | None = None,
        rank: int = 0,
        world_size: int = 1,
        verify: bool = True,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is not in [0, world_size={world_size})")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size={micro_batch_size} must be at least 1")
        self.shards_dir = Path(shards_dir)
        self.manifest = read_shards_manifest(self.shards_dir)
        if split not in self.manifest["splits"]:
            raise ValueError(f"split={split!r}: {self.shards_dir} has {list(self.manifest['splits'])}")
        verify_shards(self.shards_dir, self.manifest, splits=[split], checksums=verify)

        self.split, self.micro_batch_size, self.seed = split, micro_batch_size, seed
        self.masking = masking or MaskingConfig()
        self.rank, self.world_size = rank, world_size
        self.seq_len: int = self.manifest["seq_len"]
        self.vocab_size: int = self.manifest["vocab_size"]
        dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        files = self.manifest["splits"][split]["files"]

        def mmap(name: str, dt: np.dtype, width: int, blocks: int) -> np.memmap:
            return np.memmap(self.shards_dir / name, dt, mode="r", shape=(blocks, width))

        self._blocks = [mmap(f["file"], dtype, self.seq_len, f["blocks"]) for f in files]  # [(n_i, T)]
        packed = (self.seq_len + 7) // 8
        self._static = [
            [
                (mmap(c["ids"], dtype, self.seq_len, f["blocks"]), mmap(c["mask"], np.uint8, packed, f["blocks"]))
                for c in f.get("static", [])
            ]
            for f in files
        ]  # [file][copy]
        self.static_copies = self.manifest["static_masking"]["duplication"]
        if self.static_copies:
            check_static_masking(self.shards_dir, self.manifest["static_masking"]["masking"], self.masking)
        self._offsets = np.cumsum([0] + [f["blocks"] for f in files])  # (files + 1,)
        self.num_blocks = int(self._offsets[-1])
        self.samples_per_rank = self.num_blocks // world_size
        if split == "train" and self.samples_per_rank < micro_batch_size:
            raise DataError(
                f"{self.shards_dir}: {self.num_blocks} {split} blocks cannot fill one micro-batch of "
                f"{micro_batch_size} on each of {world_size} rank(s)"
            )
        self.epoch = 0
        self.position = 0  # next sample of this rank within the epoch
        self._order_cache: tuple[int, np.ndarray] | None = None

    # ---- order -------------------------------------------------------------------------------

    @property
    def batches_per_epoch(self) -> int:
        if self.split == "train":
            return self.samples_per_rank // self.micro_batch_size
        return -(-len(range(self.rank, self.num_blocks, self.world_size)) // self.micro_batch_size)

    def _rank_order(self, epoch: int) -> np.ndarray:
        """(samples_per_rank,) global block indices this rank reads in `epoch`, in order."""
        if self._order_cache is None or self._order_cache[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_blocks)
            self._order_cache = (epoch, order[self.rank :: self.world_size][: self.samples_per_rank])
        return self._order_cache[1]

    # ---- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        if self.split != "train":
            yield from self._validation_pass()
            return
        while True:
            epoch, pos = self.epoch, self.position
            if pos + self.micro_batch_size > self.samples_per_rank:
                self.epoch, self.position = epoch + 1, 0
                continue
            blocks = self._rank_order(epoch)[pos : pos + self.micro_batch_size]
            # Global position of this rank's j-th sample in the epoch's order: j * world_size + rank.
            positions = np.arange(pos, pos + self.micro_batch_size) * self.world_size + self.rank
            self.position = pos + self.micro_batch_size  # state_dict() now points at the next batch
            yield self._batch(blocks, positions, epoch)

    def _validation_pass(self) -> Iterator[Batch]:
        blocks = np.arange(self.rank, self.num_blocks, self.world_size)
        for start in range(0, len(blocks), self.micro_batch_size):
            chunk = blocks[start : start + self.micro_batch_size]
            yield self._batch(chunk, chunk, epoch=0)

    def _batch(self, blocks: np.ndarray, positions: np.ndarray, epoch: int) -> Batch:
        files = np.searchsorted(self._offsets, blocks, side="right") - 1
        local = blocks - self._offsets[files]
        rows = zip(files.tolist(), local.tolist())
        input_ids = torch.from_numpy(np.stack([self._blocks[f][i] for f, i in rows]).astype(np.int64))  # (B, T)
        attention_mask = input_ids != PAD_ID  # (B, T)
        if self.static_copies:
            copy = epoch % self.static_copies
            pairs = [self._static[f][copy] for f in files.tolist()]
            masked = np.stack([ids[i] for (ids, _), i in zip(pairs, local.tolist())]).astype(np.int64)
            packed = np.stack([mask[i] for (_, mask), i in zip(pairs, local.tolist())])
            masked_ids = torch.from_numpy(masked)
            mlm_mask = torch.from_numpy(np.unpackbits(packed, axis=1, count=self.seq_len).astype(bool))
        else:
            generators = [
                torch.Generator().manual_seed(derive_seed(self.seed, _MASK_STREAM, epoch, int(p))) for p in positions
            ]
            masked_ids, mlm_mask = mask_tokens(input_ids, attention_mask, self.masking, self.vocab_size, generators)
        return Batch(input_ids=input_ids, attention_mask=attention_mask, masked_ids=masked_ids, mlm_mask=mlm_mask)

    # ---- resuming ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "split": self.split,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "config_hash": self.manifest["config_hash"],
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue at the exact sample where `state` was taken (micro_batch_size may differ)."""
        mine = self.state_dict()
        for key in ("split", "seed", "rank", "world_size", "config_hash"):
            if state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state has {key}={state[key]!r}, this loader {mine[key]!r}")
        if not 0 <= state["position"] <= self.samples_per_rank:
            raise ValueError(
                f"cannot resume: position={state['position']} is outside the epoch's "
                f"{self.samples_per_rank} samples per rank"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
