"""The loader's per-step overhead inside transformers.Trainer (shardstream.integrations.hf) against
our own plain loop, side by side in one run, each contender in a fresh process pinned to the same
cores, on the same real-photo shards and the same tiny CLIPModel:

  * own loop: ``for batch in loader``: CLIPCollator, forward with ``return_loss``, backward, AdamW;
  * Trainer: ``ShardTrainer`` with the same loader, collator and optimizer settings.

Per step it reports the time spent waiting for the next batch (inside ``next()`` of the loader:
the loader's overhead as the step sees it) and the whole step time, as medians over the steps
after ``--warmup``, and the ratio Trainer / own loop.

    python benches/bench_hf_trainer.py [--steps 60] [--warmup 10] [--batch 32] [--image-size 224]
                                       [--threads 2] [--cpus 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "tests"))

from _harness import pin, print_result, run_worker  # noqa: E402


class Timed:
    """An iterable over ``inner`` that records the seconds each ``next()`` took."""

    def __init__(self, inner, waits: list[float]) -> None:
        self.inner, self.waits = inner, waits

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __iter__(self):
        it = iter(self.inner)
        while True:
            started = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.waits.append(time.perf_counter() - started)
            yield batch


def model_and_loader(args: argparse.Namespace, shards: str, index: str):
    import torch
    from integration_support import tiny_clip_config
    from shardstream import ShardLoader
    from transformers import CLIPModel

    torch.manual_seed(0)
    config = tiny_clip_config()
    config.vision_config.image_size = args.image_size
    config.vision_config.patch_size = 32
    loader = ShardLoader(
        shards, index=index, batch_size=args.batch, image_size=args.image_size, seed=0,
        threads=args.threads, tokenizer="ViT-B-32", rank=0, world_size=1,
    )  # fmt: skip
    return CLIPModel(config), loader


def worker(args: argparse.Namespace) -> None:
    pin(args.cpus_json)
    import torch

    torch.set_num_threads(len(json.loads(args.cpus_json)))
    from shardstream.integrations._stateful import FrameworkLoader
    from shardstream.integrations.hf import CLIPCollator, ShardTrainer

    model, loader = model_and_loader(args, args.shards, args.index)
    waits: list[float] = []
    marks: list[float] = []
    steps = args.steps
    if args.worker == "own":
        view = FrameworkLoader(loader, convert=CLIPCollator())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for inputs in Timed(view, waits):
            loss = model(**inputs).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as Trainer's max_grad_norm
            optimizer.step()
            optimizer.zero_grad()
            marks.append(time.perf_counter())
            if len(marks) == steps:
                break
    else:
        from transformers import TrainerCallback, TrainingArguments

        class Marks(TrainerCallback):
            def on_step_end(self, *_args, **_kwargs):
                marks.append(time.perf_counter())

        class Timing(ShardTrainer):
            def get_train_dataloader(self):
                return Timed(self.shard_loader, waits)

        with tempfile.TemporaryDirectory() as out:
            training_args = TrainingArguments(
                output_dir=out, max_steps=steps, save_strategy="no", report_to=[], use_cpu=True,
                learning_rate=1e-4, logging_steps=10**6, disable_tqdm=True,
                per_device_train_batch_size=args.batch,
            )  # fmt: skip
            trainer = Timing(
                model=model,
                args=training_args,
                train_loader=loader,
                collator=CLIPCollator(),
                callbacks=[Marks()],
            )
            trainer.train()
    skip = args.warmup
    step_times = [b - a for a, b in zip(marks[skip - 1 : -1], marks[skip:], strict=True)]
    print_result({"wait_s": statistics.median(waits[skip:]), "step_s": statistics.median(step_times)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpus", default="0,1")
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of each contender")
    p.add_argument("--worker", default=None)
    p.add_argument("--shards", default=None)
    p.add_argument("--index", default=None)
    p.add_argument("--cpus-json", default=None)
    args = p.parse_args()
    if args.worker:
        for name in ("steps", "warmup", "batch", "image_size", "threads"):
            setattr(args, name, json.loads(str(getattr(args, name))))
        return worker(args)

    import photo_shards
    from shardstream.index import build_index, write_index

    cache = os.path.join(tempfile.gettempdir(), "shardstream-bench-hf")
    per_shard = 64
    shards_needed = (args.steps * args.batch + per_shard - 1) // per_shard + 1
    paths = photo_shards.build(cache, shards=shards_needed, per_shard=per_shard)
    index = os.path.join(cache, f"index-{shards_needed}.json")
    if not os.path.exists(index):
        write_index(build_index(paths), index)
    cpus = json.dumps([int(c) for c in args.cpus.split(",")])
    options = {
        "steps": args.steps, "warmup": args.warmup, "batch": args.batch, "image-size": args.image_size,
        "threads": args.threads, "shards": "::".join(paths), "index": index, "cpus-json": cpus,
    }  # fmt: skip
    results: dict[str, list[dict]] = {"own": [], "trainer": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(run_worker(__file__, name, options))
    print(f"B={args.batch}, {args.image_size} px, {args.threads} loader threads, cpus {args.cpus}, "
          f"medians over steps {args.warmup + 1}..{args.steps}, {args.rounds} rounds")  # fmt: skip
    figures = {}
    for name, runs in results.items():
        wait = statistics.median(r["wait_s"] for r in runs)
        step = statistics.median(r["step_s"] for r in runs)
        figures[name] = (wait, step)
        print(f"  {name:8s} wait for batch {wait * 1e3:8.2f} ms   step {step * 1e3:8.2f} ms")
    (own_wait, own_step), (tr_wait, tr_step) = figures["own"], figures["trainer"]
    print(f"  Trainer / own loop: wait {tr_wait / own_wait:.3f}x, step {tr_step / own_step:.3f}x")


if __name__ == "__main__":
    main()
