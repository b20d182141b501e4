"""PretrainLoader: the Batch contract, determinism, rank split, exact resume, static vs dynamic masking,
validation pass, corrupt shards."""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest
import torch

from electralab import MASK_ID, PAD_ID
from electralab.batch import Batch
from electralab.config import MaskingConfig
from electralab.data.loader import PretrainLoader
from electralab.data.masking import eligible_positions
from electralab.errors import ConfigError, DataError

B = 64


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(getattr(x, f), getattr(y, f))
        for x, y in zip(a, b)
        for f in ("input_ids", "attention_mask", "masked_ids", "mlm_mask")
    )


def block_rows(loader) -> dict[bytes, int]:
    """Block content -> global index, to recognise which blocks a batch holds."""
    return {bytes(row): i for i, row in enumerate(np.concatenate(loader._blocks))}


def test_batch_contract(shards_dir):
    loader = PretrainLoader(shards_dir, "train", micro_batch_size=B, seed=1)
    batch = next(iter(loader))
    T = loader.seq_len
    assert batch.input_ids.shape == batch.masked_ids.shape == batch.mlm_mask.shape == (B, T)
    assert batch.input_ids.dtype == batch.masked_ids.dtype == torch.long
    assert batch.attention_mask.dtype == batch.mlm_mask.dtype == torch.bool
    assert torch.equal(batch.attention_mask, batch.input_ids != PAD_ID)
    assert torch.equal(batch.masked_ids[~batch.mlm_mask], batch.input_ids[~batch.mlm_mask])
    assert (batch.masked_ids[batch.mlm_mask] == MASK_ID).float().mean() > 0.6


def test_deterministic_order_per_seed_and_epoch(shards_dir):
    a = PretrainLoader(shards_dir, "train", B, seed=1)
    n = a.batches_per_epoch
    first, again = take(a, 2 * n), take(PretrainLoader(shards_dir, "train", B, seed=1), 2 * n)
    assert same(first, again)
    assert not same(first[:3], take(PretrainLoader(shards_dir, "train", B, seed=2), 3))
    # Each epoch is a permutation: no block twice within an epoch, and epochs differ in order.
    rows = block_rows(a)
    epochs = [
        [rows[bytes(r.numpy().astype(np.uint16))] for b in first[e * n : (e + 1) * n] for r in b.input_ids]
        for e in range(2)
    ]
    assert len(set(epochs[0])) == len(epochs[0]) == n * B
    assert epochs[0] != epochs[1]
    assert (a.epoch, a.position) == (1, n * B)  # state points after the last batch handed out


def test_rank_split_is_disjoint_and_even(shards_dir):
    world = 3
    loaders = [PretrainLoader(shards_dir, "train", B, seed=1, rank=r, world_size=world) for r in range(world)]
    n = loaders[0].batches_per_epoch
    assert all(l.batches_per_epoch == n for l in loaders)
    rows = block_rows(loaders[0])
    seen = [{rows[bytes(r.numpy().astype(np.uint16))] for b in take(l, n) for r in b.input_ids} for l in loaders]
    assert all(len(s) == n * B for s in seen)
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])


def test_masks_do_not_depend_on_world_size(shards_dir):
    """Sample at global position p gets the same mask whether it is read by 1 rank or by 2."""
    single = take(PretrainLoader(shards_dir, "train", 4, seed=1), 1)[0]
    r0 = take(PretrainLoader(shards_dir, "train", 2, seed=1, rank=0, world_size=2), 1)[0]
    r1 = take(PretrainLoader(shards_dir, "train", 2, seed=1, rank=1, world_size=2), 1)[0]
    # Global order p0 p1 p2 p3: rank 0 reads p0 p2, rank 1 reads p1 p3.
    interleaved = torch.stack([r0.mlm_mask[0], r1.mlm_mask[0], r0.mlm_mask[1], r1.mlm_mask[1]])
    assert torch.equal(interleaved, single.mlm_mask)


@pytest.mark.parametrize("where", ["mid-epoch", "next epoch"])
def test_exact_resume(shards_dir, where):
    reference = PretrainLoader(shards_dir, "train", B, seed=3)
    stop = 5 if where == "mid-epoch" else reference.batches_per_epoch + 3
    uninterrupted = take(reference, stop + 6)

    first = PretrainLoader(shards_dir, "train", B, seed=3)
    it = iter(first)
    for _ in range(stop):
        next(it)
    state = first.state_dict()

    resumed = PretrainLoader(shards_dir, "train", B, seed=3)
    resumed.load_state_dict(state)
    assert same(take(resumed, 6), uninterrupted[stop:])  # bit-identical, masks included
    # At sample granularity: another micro-batch size continues from the same sample.
    other = PretrainLoader(shards_dir, "train", B // 2, seed=3)
    other.load_state_dict(state)
    halves = take(other, 2)
    assert torch.equal(torch.cat([h.masked_ids for h in halves]), uninterrupted[stop].masked_ids)


def test_resume_refuses_other_settings(shards_dir):
    state = PretrainLoader(shards_dir, "train", B, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"cannot resume: the state has seed=1, this loader 2"):
        PretrainLoader(shards_dir, "train", B, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"world_size=1, this loader 2"):
        PretrainLoader(shards_dir, "train", B, seed=1, rank=0, world_size=2).load_state_dict(state)


def masked_share(batches, masking: MaskingConfig) -> float:
    selected = sum(b.mlm_mask.sum().item() for b in batches)
    eligible = sum(
        eligible_positions(b.input_ids, b.attention_mask, masking.mask_special_tokens).sum().item() for b in batches
    )
    return selected / eligible


def test_static_masks_refuse_a_run_that_masks_otherwise(static_shards_dir):
    # The shards' masks were made with MaskingConfig() (RoBERTa: [CLS]/[SEP] too); TEAMS and ELECTRA mask
    # otherwise, and must not train on masks they did not ask for.
    teams = MaskingConfig(mask_special_tokens=False)
    with pytest.raises(ConfigError, match=r"mask_special_tokens: True in the shards, False in the run") as error:
        PretrainLoader(static_shards_dir, "train", B, seed=1, masking=teams)
    assert str(static_shards_dir) in str(error.value) and "duplication: 0" in str(error.value)
    electra = MaskingConfig(mask_token_prob=0.85, random_token_prob=0.0, mask_special_tokens=False)
    with pytest.raises(ConfigError, match=r"mask_token_prob: 0\.8 in the shards, 0\.85 in the run"):
        PretrainLoader(static_shards_dir, "validation", B, seed=1, masking=electra)
    PretrainLoader(static_shards_dir, "train", B, seed=1, masking=MaskingConfig())  # the same masking: served


def test_dynamic_and_static_masking_rates(shards_dir, static_shards_dir):
    masking = MaskingConfig()
    dynamic = PretrainLoader(shards_dir, "train", B, seed=1, masking=masking)
    n = dynamic.batches_per_epoch
    epochs = take(dynamic, 2 * n)
    static = PretrainLoader(static_shards_dir, "train", B, seed=1)
    assert static.static_copies == 2
    s_epochs = take(static, 4 * n)
    # round(0.15 * 64) = 10 of 64 eligible positions in a full block: 15.6%, the same rule for both.
    assert abs(masked_share(epochs, masking) - 10 / 64) < 0.001
    assert abs(masked_share(s_epochs, masking) - 10 / 64) < 0.001

    # Static: epoch e uses copy e mod 2, so epochs 0 and 2 mask each block the same way, 0 and 1 not.
    def masks_by_block(batches):
        return {bytes(r.numpy().astype(np.uint16)): m for b in batches for r, m in zip(b.input_ids, b.mlm_mask)}

    e0, e1, e2 = (masks_by_block(s_epochs[i * n : (i + 1) * n]) for i in range(3))
    common = e0.keys() & e2.keys()
    assert len(common) > 10 and all(torch.equal(e0[k], e2[k]) for k in common)
    common01 = e0.keys() & e1.keys()
    assert any(not torch.equal(e0[k], e1[k]) for k in common01)
    # Dynamic: a block is masked afresh every epoch.
    d0, d1 = masks_by_block(epochs[:n]), masks_by_block(epochs[n:])
    assert sum(not torch.equal(d0[k], d1[k]) for k in d0.keys() & d1.keys()) > 0.9 * len(d0.keys() & d1.keys())


def test_validation_pass(shards_dir):
    full = list(PretrainLoader(shards_dir, "validation", B, seed=1))
    assert same(full, list(PretrainLoader(shards_dir, "validation", B, seed=1)))  # the same every time
    n_blocks = sum(b.input_ids.shape[0] for b in full)
    assert n_blocks == PretrainLoader(shards_dir, "validation", B).num_blocks  # every block once
    halves = [list(PretrainLoader(shards_dir, "validation", B, seed=1, rank=r, world_size=2)) for r in range(2)]
    assert sum(b.input_ids.shape[0] for h in halves for b in h) == n_blocks


def test_corrupt_shard_stops_the_loader(tmp_path, shards_dir):
    broken = tmp_path / "shards"
    shutil.copytree(shards_dir, broken)
    target = broken / "train-00000.bin"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"train-00000.bin: sha256 .* does not match the manifest"):
        PretrainLoader(broken, "train", B)
    PretrainLoader(broken, "validation", B)  # only the opened split is checked
    PretrainLoader(broken, "train", B, verify=False)  # sizes only


def test_bad_arguments(shards_dir, tmp_path):
    with pytest.raises(ValueError, match=r"rank=2 is not in \[0, world_size=2\)"):
        PretrainLoader(shards_dir, "train", B, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"split='test'"):
        PretrainLoader(shards_dir, "test", B)
    with pytest.raises(DataError, match=r"cannot fill one micro-batch of 100000"):
        PretrainLoader(shards_dir, "train", 100_000)
    with pytest.raises(DataError, match=r"manifest.json: no such file; run the shards stage first"):
        PretrainLoader(tmp_path, "train", B)


def test_split_cuts_each_row_into_pieces_keeps_the_masks_and_leaves_out_pieces_of_padding():
    from helpers import make_batch

    batch = make_batch(batch_size=3, length=24, pad_last=14)  # row 0: 10 real tokens, then padding
    short = batch.split(8)
    # Row 0 keeps its first two pieces (its third is padding only); rows 1 and 2 keep all three.
    assert short.input_ids.shape == (2 + 3 + 3, 8)
    kept = torch.cat([batch.input_ids[0, :16].view(2, 8), batch.input_ids[1:].reshape(6, 8)])
    assert torch.equal(short.input_ids, kept)
    for name in ("attention_mask", "masked_ids", "mlm_mask"):
        whole = getattr(batch, name)
        assert torch.equal(getattr(short, name), torch.cat([whole[0, :16].view(2, 8), whole[1:].reshape(6, 8)]))
    assert short.num_tokens == batch.num_tokens and int(short.mlm_mask.sum()) == int(batch.mlm_mask.sum())
    with pytest.raises(ValueError, match="length 5 does not divide the sequence length 24"):
        batch.split(5)


@pytest.mark.parametrize("method", ["mlm", "electra", "cocolm", "amos", "teams"])
def test_every_method_trains_on_short_rows(method):
    """The short-sequence warm-up cuts rows without a [CLS] at their start: every objective takes them."""
    from helpers import make_batch, tiny_generators, tiny_model

    from electralab.objectives import METHODS, build_objective

    torch.manual_seed(0)
    objective = build_objective(method, METHODS[method].Settings(), tiny_model(), tiny_generators(), 97)
    out = objective(make_batch(batch_size=2, length=32, pad_last=20).split(8), progress=0.1)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    grads = [p.grad for p in objective.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
