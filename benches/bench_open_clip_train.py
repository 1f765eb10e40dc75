"""open_clip_train's training samples/s per core: its own webdataset pipeline vs shardstream
through ``shardstream.integrations.open_clip``, side by side, on the same shards of real photos.

Both contenders run open_clip_train's own ``main`` in one process pinned to one core (a
webdataset DataLoader worker inherits the pin, so it shares that core; shardstream decodes on
one Rust thread there), ``--workers 1``, fp32 on the CPU, with the same small model: one ViT
block at 224 px with 32 px patches and one text block. By default both towers are locked
(open_clip_train's own ``--lock-image --lock-text``: only the logit scale trains), so the step is
a forward pass and the figure is what the input side feeds one core inside open_clip_train's
loop, as when the model runs on a GPU; ``--towers training`` trains them, and the step then
costs about as much as the input on the same core. Each run trains 2 epochs; the figure is the second epoch's
samples / seconds of ``train_one_epoch`` (webdataset's persistent worker and the loader are
warm by then). Contenders take turns for ``--repeat`` rounds and each keeps its best.

The baseline needs one workaround: open_clip_train 3.3 with webdataset 1.0.2 (both pinned in
requirements/dev.txt) fails before its first step with ``KeyError: 'fname'`` in
``group_by_keys_nothrow`` (open_clip issue 935, webdataset issue 384: webdataset now yields an
empty dict at the end of every shard). For the baseline only, ``group_by_keys_nothrow`` is
given the stream one shard at a time, cut at those markers, which is what they mean.

    python benches/bench_open_clip_train.py [--samples 512] [--repeat 2] [--core 0] [--towers training]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_MODEL = "bench-vit-224-p32"
BENCH_MODEL_CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 224, "layers": 1, "width": 64, "head_width": 32, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}
BATCH = 32


def register_bench_model(folder: str) -> None:
    import open_clip

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{BENCH_MODEL}.json"), "w", encoding="utf-8") as f:
        json.dump(BENCH_MODEL_CONFIG, f)
    open_clip.add_model_config(folder)


def webdataset_eof_fix() -> None:
    """open_clip issue 935: cut the member stream at webdataset 1.0.2's end-of-shard markers
    (empty dicts) and group each shard's members on their own, as the markers intend."""
    from open_clip_train import data

    original = data.group_by_keys_nothrow

    def per_shard(members: Iterator[dict[str, Any]], *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        stream = iter(members)
        ended = False

        def one_shard() -> Iterator[dict[str, Any]]:
            nonlocal ended
            for member in stream:
                if not member:  # the end-of-shard marker
                    return
                yield member
            ended = True

        while not ended:
            yield from original(one_shard(), *args, **kwargs)

    data.group_by_keys_nothrow = per_shard


def timed(train_one_epoch: Callable[..., Any], epochs: list[dict[str, float]]) -> Callable[..., Any]:
    def run(model: Any, data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = train_one_epoch(model, data, *args, **kwargs)
        seconds = time.perf_counter() - started
        epochs.append({"seconds": seconds, "samples": float(data["train"].dataloader.num_samples)})
        return result

    return run


def open_clip_argv(train_data: str, logs: str, name: str, samples: int, *, train_towers: bool) -> list[str]:
    # Both towers locked (open_clip's LiT flags; only the logit scale trains): the step is a
    # forward pass, so the figure is what the input side feeds one core inside open_clip's loop.
    locked = [] if train_towers else ["--lock-image", "--lock-text", "--lock-text-freeze-layer-norm"]
    return [
        *locked, "--train-data", train_data, "--train-num-samples", str(samples), "--model", BENCH_MODEL,
        "--device", "cpu", "--precision", "fp32", "--batch-size", str(BATCH), "--epochs", "2",
        "--workers", "1", "--lr", "1e-4", "--warmup", "1", "--logs", logs, "--name", name,
        "--save-frequency", "0", "--val-frequency", "0", "--zeroshot-frequency", "0",
        "--log-every-n-steps", "1000", "--seed", "0",
    ]  # fmt: skip


def worker(
    contender: str, train_data: str, index: str, samples: int, cpus: str, folder: str, train_towers: bool
) -> None:
    pin(cpus)
    import torch

    torch.set_num_threads(1)
    from open_clip_train import main as oc_main

    register_bench_model(os.path.join(folder, "model-configs"))
    logs = tempfile.mkdtemp(prefix="logs-", dir=folder)
    argv = open_clip_argv(train_data, logs, contender, samples, train_towers=train_towers)
    epochs: list[dict[str, float]] = []
    if contender == "webdataset":
        webdataset_eof_fix()
        oc_main.train_one_epoch = timed(oc_main.train_one_epoch, epochs)
        oc_main.main(argv)
    else:
        from shardstream.integrations.open_clip import install, split_argv

        # --train-num-samples is left out: with the index, the epoch is every sample once.
        at = argv.index("--train-num-samples")
        options, rest = split_argv([*argv[:at], *argv[at + 2 :], "--train-index", index])
        install(options)
        oc_main.train_one_epoch = timed(oc_main.train_one_epoch, epochs)
        oc_main.main(rest)
    last = epochs[-1]
    print_result({"samples_per_s": last["samples"] / last["seconds"], "samples": last["samples"]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=512, help="a multiple of the batch size (32)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds; each contender keeps its best")
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench-open-clip"))
    ap.add_argument(
        "--towers", choices=("locked", "training"), default="locked",
        help="training: both towers train (the step then costs about as much as the input)",
    )  # fmt: skip
    ap.add_argument("--worker")
    ap.add_argument("--train-data")
    ap.add_argument("--index")
    ap.add_argument("--cpus")
    ap.add_argument("--folder")
    args = ap.parse_args()
    if args.worker:
        worker(
            args.worker,
            args.train_data,
            args.index,
            args.samples,
            args.cpus,
            args.folder,
            args.towers == "training",
        )
        return

    sys.path.insert(0, HERE)
    import photo_shards
    from shardstream.index import build_index, write_index

    per_shard = 64
    if args.samples % BATCH or args.samples % per_shard:
        ap.error(f"--samples must be a multiple of {per_shard}")
    paths = photo_shards.build(args.dir, shards=args.samples // per_shard, per_shard=per_shard)
    index = os.path.join(args.dir, f"index-{len(paths)}")
    if not os.path.exists(index):
        write_index(build_index(paths), index)
    train_data = "::".join(paths)
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.join(HERE, "..", "python")}
    options = {
        "train-data": train_data, "index": index, "samples": args.samples,
        "cpus": json.dumps([args.core]), "folder": args.dir,
    }  # fmt: skip
    options["towers"] = args.towers
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for contender in ("webdataset", "shardstream"):
            result = try_worker(__file__, contender, options, env=env)
            if result is not None:
                best[contender] = max(best.get(contender, 0.0), result["samples_per_s"])
    print(f"open_clip_train, {args.samples} samples of real photos (256-512 px JPEG) -> 224 px, one core,")
    towers = (
        "both towers training"
        if args.towers == "training"
        else "both towers locked (the step is a forward pass)"
    )
    print(f"batch {BATCH}, {towers}, the second of 2 epochs, best of {args.repeat}:")
    for contender, label in (("webdataset", "its own webdataset pipeline"), ("shardstream", "the adapter")):
        figure = f"{best[contender]:8.1f} samples/s" if contender in best else "  failed"
        print(f"  {label:30s} {figure}")
    if len(best) == 2:
        ratio = best["shardstream"] / best["webdataset"]
        print(f"  ratio (adapter / webdataset)   {ratio:8.2f}x  (target >= 3x)")


if __name__ == "__main__":
    main()
