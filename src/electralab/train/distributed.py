"""Data-parallel pretraining under Ray Train: the same loop on every rank, DDP over Gloo (CPU)
or NCCL (GPU), each rank reading its own part of the shards.

    summary = pretrain_on_ray(run, shards_dir, out_dir, scratch_dir, num_workers=4, use_gpu=True)

With RAY_ADDRESS set (or address=...), it joins that cluster; otherwise it starts a local Ray.
Paths must be visible to every worker (one machine, or shared storage on a cluster: docs/scaling.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from electralab import tracking
from electralab.env import repo_root
from electralab.io import read_json
from electralab.runs import ResolvedRun


def pretrain_on_ray(
    run: ResolvedRun,
    shards_dir: Path,
    out_dir: Path,
    scratch_dir: Path,
    *,
    num_workers: int,
    use_gpu: bool,
    vocab_dir: Path | None = None,
    address: str | None = None,
) -> dict[str, Any]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    paths = {
        k: str(Path(v).resolve()) if v is not None else None
        for k, v in dict(shards=shards_dir, out=out_dir, scratch=scratch_dir, vocab=vocab_dir).items()
    }
    # Workers start in Ray's own directories: hand them absolute locations of everything.
    env = {"MLFLOW_TRACKING_URI": tracking.tracking_uri(), "DVC_ROOT": str(repo_root()), "PYTHONUNBUFFERED": "1"}
    env.update(
        {k: os.environ[k] for k in ("DVC_EXP_NAME", tracking.BACKEND_ENV, tracking.RUNLOG_ENV) if k in os.environ}
    )
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            address=address or os.environ.get("RAY_ADDRESS"),
            runtime_env={"env_vars": env},
            include_dashboard=False,
            log_to_driver=True,
        )

    def worker(config: dict) -> None:
        from ray import train

        from electralab.train.loop import Dist, pretrain

        ctx = train.get_context()
        dist = Dist(ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank())
        summary = pretrain(
            config["run"],
            Path(config["shards"]),
            Path(config["out"]),
            Path(config["scratch"]),
            vocab_dir=Path(config["vocab"]) if config["vocab"] else None,
            dist=dist,
        )
        train.report({k: v for k, v in summary.items() if isinstance(v, (int, float))})

    trainer = TorchTrainer(
        worker,
        train_loop_config={"run": run, **paths},
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=None if use_gpu else {"CPU": 1}
        ),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(name=f"pretrain-{run.name}", storage_path=str(Path(paths["scratch"]) / "ray")),
    )
    try:
        result = trainer.fit()
    finally:
        if started_here:
            ray.shutdown()
    if result.error:
        raise result.error
    return read_json(Path(paths["out"]) / "summary.json")  # written by rank 0
