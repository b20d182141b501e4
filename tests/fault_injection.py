"""Run a stage script and SIGKILL it at one named point: the fault injection of the kill tests.

    python tests/fault_injection.py <point> <nth> stages/pretrain.py mlm data/shards ...   # from the project

The process kills itself (SIGKILL: no handler, no cleanup, as the OOM killer or a power cut) the <nth> time
execution reaches <point>. Points inside a checkpoint write (electralab.train.checkpoint.Checkpointer.save):
  ckpt-partial       half of the new checkpoint's bytes written to its temporary file
  ckpt-synced        the temporary file complete and synced, before its checksum is recorded
  ckpt-rotating      the previous state.pt renamed to state.prev.pt, the new one not yet renamed
  ckpt-saved         right after a checkpoint was written (before a fraction of the same step, if any)
Points at the end of pretraining:
  outputs-written    models/<run> renamed into place, MLflow not told yet
  finishing          the artifacts uploaded, the MLflow run not yet FINISHED
  finished           the MLflow run FINISHED, the metrics file not yet written
  metrics-written    metrics/pretrain/<run>.json written, the scratch not yet cleared
"""

from __future__ import annotations

import io
import os
import runpy
import signal
import sys
from pathlib import Path

point, nth, script, *args = sys.argv[1:]
seen = {"n": 0}


def reached(name: str) -> None:
    if name == point:
        seen["n"] += 1
        if seen["n"] == int(nth):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    import torch

    import electralab.io
    import electralab.train.checkpoint as checkpoint
    import electralab.train.loop as loop
    from electralab.train.track import Tracker

    real_torch_save, real_replace = torch.save, os.replace
    real_sha = getattr(checkpoint, "sha256_file", None)  # (absent before checkpoints had checksums)

    def torch_save(obj, f, *a, **kw):
        if point == "ckpt-partial" and ".tmp-state.pt-" in str(getattr(f, "name", f)):
            buffer = io.BytesIO()
            real_torch_save(obj, buffer, *a, **kw)
            data = buffer.getvalue()
            if seen["n"] + 1 == int(nth):
                f.write(data[: len(data) // 2])
                f.flush()
            else:
                f.write(data)
            reached("ckpt-partial")
            return None
        return real_torch_save(obj, f, *a, **kw)

    def sha256_file(path, *a, **kw):
        if ".tmp-state.pt-" in str(path):
            reached("ckpt-synced")
        return real_sha(path, *a, **kw)

    def replace(src, dst, *a, **kw):
        if Path(dst).name == "state.pt" and ".tmp-state.pt-" in str(src):
            reached("ckpt-rotating")
        return real_replace(src, dst, *a, **kw)

    real_save = checkpoint.Checkpointer.save

    def save(self, state):
        real_save(self, state)
        reached("ckpt-saved")

    real_outputs = loop.write_outputs

    def write_outputs(*a, **kw):
        real_outputs(*a, **kw)
        reached("outputs-written")

    real_finish = Tracker.finish

    def finish(self, summary, out_dir):
        real_end = self.mlflow.end_run

        def end_run(*a, **kw):
            reached("finishing")
            return real_end(*a, **kw)

        self.mlflow.end_run = end_run
        try:
            real_finish(self, summary, out_dir)
        finally:
            self.mlflow.end_run = real_end
        reached("finished")

    real_write_json = electralab.io.write_json

    def write_json(path, obj):
        real_write_json(path, obj)
        if Path(path).parent.name == "pretrain" and Path(path).parent.parent.name == "metrics":
            reached("metrics-written")

    torch.save, os.replace, checkpoint.sha256_file = torch_save, replace, sha256_file
    checkpoint.Checkpointer.save, loop.write_outputs, Tracker.finish = save, write_outputs, finish
    electralab.io.write_json = write_json


install()
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
