"""How long a checkpoint blocks training: asynchronous (snapshot to host memory, write on a
background thread) against a synchronous write, side by side in one run, for a local folder and
for S3 (SeaweedFS on loopback, when the weed binary is installed).

The model is an open_clip model (default ViT-B-32, 151 M parameters) on the CPU with AdamW state
(one real step on a batch of 2, so the optimizer holds its moments): the checkpoint is ~1.8 GB.

- ``sync_s``: what every rank waited for before (serialise the live state, hash, publish,
  pointer, prune: ``write_checkpoint`` on the state dicts themselves, no copy);
- ``blocking_s``: what the trainer's step waits for now (``snapshot_checkpoint``: the host copy
  of every tensor into the previous snapshot's buffers, as the trainer does from its second
  checkpoint on, then handing the write to the thread; the first one, which allocates them, is
  printed beside it);
- ``background_s``: the write that then runs beside training.

Prints one line per store and the ratio blocking / sync (target < 0.10). Then, on the same model
and store, for each writer priority (``checkpoint.writer_priority``: idle, low, normal), what the
write in flight costs the steps that run beside it: real training steps (forward, backward, AdamW
on a batch of 2) before, during and after one background write; the median time of the steps that
started while it was in flight against that of the steps with none, their ratio (the write's
serialising, hashing and I/O share the cores), and the whole cost of the checkpoint to training
(those steps' time beyond as many quiet steps, plus the blocking) against the synchronous write.

    python benches/bench_checkpoint_async.py [--model ViT-B-32] [--repeats 2] [--dir /tmp/x] [--no-s3]
        [--quiet-steps 6] [--priorities idle,low,normal]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

from shardstream.train import checkpoint as ckpt  # noqa: E402
from shardstream.train.checkpoint_async import BackgroundWriter  # noqa: E402
from shardstream.train.dist import DistContext  # noqa: E402
from shardstream.train.storage import CheckpointStore, LocalStore, S3Store  # noqa: E402

SINGLE = DistContext(0, 1, 0, 1, torch.device("cpu"), None)


class Bundle:
    """The model, its optimizer and scheduler, and one training step on a fixed batch of 2."""

    def __init__(self, name: str) -> None:
        import open_clip
        from shardstream.train.model import register_model_configs

        register_model_configs()  # shardstream-tiny too, for a quick run
        self.model = open_clip.create_model(name, pretrained=None)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        size = self.model.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        self.images = torch.randn(2, 3, size, size)
        self.texts = torch.randint(0, 1000, (2, 77))
        self.step()  # the optimizer holds its moments from here on

    def step(self) -> float:
        """One training step; its wall time."""
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        image_features, text_features, scale = self.model(self.images, self.texts)
        logits = scale * image_features @ text_features.T
        torch.nn.functional.cross_entropy(logits, torch.arange(2)).backward()
        self.optimizer.step()
        self.scheduler.step()
        return time.perf_counter() - start


def steps_beside_a_write(
    store: CheckpointStore, bundle: Bundle, step: int, quiet: int, priority: str
) -> dict[str, float]:
    """Step times with no write in flight (``quiet`` before the write and ``quiet`` after it)
    and beside one at ``priority`` (the steps that started while it was in flight), in one
    sequence; ``lost_s``: what those steps took beyond as many quiet ones."""
    idle = [bundle.step() for _ in range(quiet)]
    payload = ckpt.snapshot_checkpoint(
        ctx=SINGLE, model=bundle.model, optimizer=bundle.optimizer, scheduler=bundle.scheduler,
        state=ckpt.TrainingState(step, 0, step, None), config={},
    )  # fmt: skip
    assert payload is not None
    writer = BackgroundWriter(priority)
    writer.submit(f"step {step}", lambda: ckpt.write_checkpoint(store, payload, keep=2))
    busy: list[float] = []
    while writer.busy:  # each of these steps starts with the write in flight (the last may
        busy.append(bundle.step())  # see it end: it still ran beside part of it)
    failed = writer.wait()
    if failed:
        raise RuntimeError(failed)
    idle += [bundle.step() for _ in range(quiet)]
    quiet_s = statistics.median(idle)
    return {
        "idle_s": quiet_s,
        "busy_s": statistics.median(busy),
        "busy_steps": len(busy),
        "write_s": writer.last_write_s,
        "lost_s": sum(busy) - quiet_s * len(busy),
    }


def measure(store: CheckpointStore, model, optimizer, scheduler, step: int, reuse: dict) -> dict[str, float]:
    state = ckpt.TrainingState(step, 0, step, None)
    # synchronous, as before: serialise straight from the live state
    start = time.perf_counter()
    live = {
        "format": ckpt.FORMAT, "version": ckpt.VERSION, "step": step, "epoch": 0, "step_in_epoch": step,
        "world_size": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "rng": ckpt.gather_rng_states(SINGLE),
        "loader_json": "", "config_json": "{}", "torch_version": str(torch.__version__),
    }  # fmt: skip
    ckpt.write_checkpoint(store, live, keep=2)
    sync_s = time.perf_counter() - start

    writer = BackgroundWriter()
    start = time.perf_counter()
    payload = ckpt.snapshot_checkpoint(
        ctx=SINGLE, model=model, optimizer=optimizer, scheduler=scheduler, state=state, config={},
        reuse=reuse.get("payload"),  # as the trainer does: the previous snapshot's buffers
    )  # fmt: skip
    assert payload is not None
    reuse["payload"] = payload
    writer.submit(f"step {step + 1}", lambda: ckpt.write_checkpoint(store, {**payload, "step": step + 1}, 2))
    blocking_s = time.perf_counter() - start
    failed = writer.wait()
    if failed:
        raise RuntimeError(failed)
    return {"sync_s": sync_s, "blocking_s": blocking_s, "background_s": writer.last_write_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default="", help="local folder to write into (default: a temp folder)")
    parser.add_argument("--no-s3", action="store_true", help="the local folder only")
    parser.add_argument(
        "--quiet-steps", type=int, default=6, help="steps timed before and after the write (each)"
    )
    parser.add_argument(
        "--priorities",
        default="idle,low,normal",
        help="checkpoint.writer_priority values to time the steps beside a write with (comma-separated)",
    )
    args = parser.parse_args()

    bundle = Bundle(args.model)
    model, optimizer, scheduler = bundle.model, bundle.optimizer, bundle.scheduler
    params = sum(p.numel() for p in model.parameters())
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-ckpt-"))
    stores: list[tuple[str, CheckpointStore]] = [("local", LocalStore(work / "local"))]
    server = None
    from servers import SeaweedS3, weed_binary

    if args.no_s3:
        pass
    elif weed_binary() is not None:
        import os

        server = SeaweedS3(str(work / "weed")).start()
        os.environ.update(server.env())
        server.client().create_bucket(Bucket="bench")
        stores.append(("s3 (SeaweedFS, loopback)", S3Store("s3://bench/ckpt", work / "staging")))
    else:
        print("weed binary not installed: S3 skipped")
    try:
        print(f"{args.model}: {params / 1e6:.0f} M parameters, AdamW; best of {args.repeats}", flush=True)
        for label, store in stores:
            store.check()
            reuse: dict = {}
            runs = [
                measure(store, model, optimizer, scheduler, 10 * (i + 1), reuse) for i in range(args.repeats)
            ]
            first_blocking = runs[0]["blocking_s"]
            best = {k: min(r[k] for r in runs) for k in runs[0]}
            size = max(
                (p.stat().st_size for p in (work / "local").glob("step-*.pt")),
                default=0,
            )
            print(
                f"{label:>26}: sync write {best['sync_s']:.2f} s | async: blocks {best['blocking_s']:.2f} s, "
                f"writes {best['background_s']:.2f} s behind | blocking/sync = "
                f"{best['blocking_s'] / best['sync_s']:.3f} ({size / 1e9:.2f} GB; the first snapshot, "
                f"allocating its buffers: {first_blocking:.2f} s)",
                flush=True,
            )
            for n, priority in enumerate(args.priorities.split(",")):
                step = 10 * (args.repeats + 1 + n)
                beside = steps_beside_a_write(store, bundle, step, args.quiet_steps, priority)
                print(
                    f"{'':>26}  writer {priority:>6}: step median {beside['idle_s']:.3f} s with no write in "
                    f"flight, {beside['busy_s']:.3f} s beside it ({beside['busy_steps']} steps, the write "
                    f"{beside['write_s']:.1f} s) | during/none = {beside['busy_s'] / beside['idle_s']:.2f} | "
                    f"steps lost {beside['lost_s']:.2f} s + blocking {best['blocking_s']:.2f} s = "
                    f"{(beside['lost_s'] + best['blocking_s']) / best['sync_s']:.2f} x the sync write",
                    flush=True,
                )
    finally:
        if server is not None:
            server.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
