"""NaFlex batches per core (issue 30): the same shards of real photos to SigLIP 2 NaFlex batches
(``pixel_values [B, N, 3*p*p]``, ``pixel_attention_mask``, ``spatial_shapes``) plus captions.

  webdataset + Siglip2ImageProcessorPil     PIL decode, transformers' PIL ("slow") processor
  webdataset + Siglip2ImageProcessor        PIL decode, transformers' torchvision ("fast") one
  webdataset + decode_jpeg + the fast one    torchvision.io.decode_jpeg tensors into the fast
                                             processor: the fastest way a user runs it (the
                                             decoder PyTorch points people to, no PIL)
  shardstream, 1 thread                      sample=NaFlex(...), pinned to one core
  shardstream token-budget, 1 thread         NaFlexBudgetLoader(count_patches(...)) with
                                             max_patches_per_batch = --batch x --max-patches (the
                                             fixed-count batches' memory); the count pass is
                                             timed apart

Before the speed table, the padding (the fraction of patch slots that are padding) of
token-budget batches against fixed-count ones on the same photos, per budget in --budgets (from
the count pass: header-only, exact for the batches the loader yields).

Every contender runs pinned to one core in its own process, yields uint8-scale patches (the
processors with ``do_rescale=False, do_normalize=False``: normalisation belongs on the device
for all three) in batches of ``--batch`` images, and keeps its best of ``--repeat`` rounds taken
in turn (benches/_harness.py). torch is limited to one thread in the processor workers.

    python benches/bench_naflex.py [--samples 2000] [--repeat 3] [--patch-size 16] [--max-patches 256] \\
        [--budgets 1024,4096,16384] [--baseline PYTHON_DIR] [--no-peers]

``--baseline`` runs another build's two shardstream contenders beside this build's, taking turns
(the ``python/`` folder of a worktree at an earlier commit with its extension built, as in
``bench_decode.py``); ``--no-peers`` leaves the transformers processors out, for a before/after
run. Peak memory is each contender's process's peak resident set.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import tempfile
import time

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
PROCESSORS = {
    "pil": "Siglip2ImageProcessorPil",
    "torchvision": "Siglip2ImageProcessor",
    "decode_jpeg": "Siglip2ImageProcessor",
}


def make_processor(processor: str, patch: int, budget: int):
    """The processor, warmed up on one image (its first call imports and initialises lazily:
    not part of the job)."""
    import torch
    import transformers
    from PIL import Image

    torch.set_num_threads(1)
    proc = getattr(transformers, PROCESSORS[processor])(
        patch_size=patch, max_num_patches=budget, do_rescale=False, do_normalize=False
    )
    proc(images=[Image.new("RGB", (320, 240))], return_tensors="pt")
    return proc


def image_decoder(name: str):
    """``jpg bytes -> image`` as the contender feeds its processor: PIL RGB, or torchvision's
    ``decode_jpeg`` to a uint8 [3, H, W] tensor."""
    if name == "decode_jpeg":
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        def tensor(jpg):
            return decode_jpeg(torch.frombuffer(bytearray(jpg), dtype=torch.uint8), mode=ImageReadMode.RGB)

        return tensor
    from PIL import Image

    return lambda jpg: Image.open(io.BytesIO(jpg)).convert("RGB")


def run_webdataset(paths: list[str], proc, batch: int, patch: int, budget: int, decode) -> int:
    import webdataset as wds

    ds = wds.WebDataset(paths, shardshuffle=False).to_tuple("jpg", "txt")
    n, images = 0, []

    def flush() -> int:
        out = proc(images=images, return_tensors="pt")
        assert out["pixel_values"].shape[1:] == (budget, 3 * patch * patch)
        return len(images)

    for jpg, _txt in ds:
        images.append(decode(jpg))
        if len(images) == batch:
            n += flush()
            images = []
    if images:
        n += flush()
    return n


def run_shardstream(paths: list[str], batch: int, patch: int, budget: int) -> int:
    import shardstream
    from shardstream.kinds import NaFlex

    loader = shardstream.ShardLoader(
        paths,
        batch_size=batch,
        threads=1,
        shuffle_buffer=1,
        drop_last=False,
        sample=NaFlex(patch_size=patch, max_num_patches=budget),
    )
    n = 0
    for b in loader:
        assert b.pixel_values.shape[1:] == (budget, 3 * patch * patch)
        n += len(b.keys)
    return n


def run_budget(paths: list[str], batch: int, patch: int, budget: int) -> tuple[int, float]:
    """(images, seconds of the count pass) of one token-budget epoch."""
    from shardstream.kinds import NaFlex
    from shardstream.kinds.naflex_budget import NaFlexBudgetLoader, count_patches

    start = time.perf_counter()
    spec = NaFlex(patch_size=patch, max_num_patches=budget)
    counts = count_patches(paths, naflex=spec, max_patches_per_batch=batch * budget, threads=1)
    count_seconds = time.perf_counter() - start
    n = 0
    for b in NaFlexBudgetLoader(counts, threads=1):
        images, length, _ = b.pixel_values.shape
        assert images * length <= batch * budget
        n += images
    return n, count_seconds


def padding_table(paths: list[str], patch: int, budget: int, budgets: list[int]) -> None:
    from shardstream.kinds import NaFlex
    from shardstream.kinds.naflex_budget import count_patches

    print("padding (patch slots that are padding), token-budget vs fixed-count batches:")
    for per_batch in budgets:
        c = count_patches(
            paths, naflex=NaFlex(patch_size=patch, max_num_patches=budget), max_patches_per_batch=per_batch
        )
        print(
            f"  max_patches_per_batch {per_batch:6d}: {100 * c.padding:5.2f}% vs fixed-count "
            f"{100 * c.fixed_count_padding:5.2f}%  (ratio {c.padding / c.fixed_count_padding:.2f}; "
            f"{c.total_batches} batches, {c.images / c.total_batches:.1f} images each; buckets of "
            f"{c.buckets[0]} patches)"
        )
    print()


def worker(args) -> None:
    paths = json.loads(args.paths)
    pin(args.cpus)
    # Imports (torch, transformers) are not part of the job.
    import shardstream.loader  # noqa: F401

    batch, patch, budget = int(args.batch), int(args.patch_size), int(args.max_patches)
    proc = None
    if args.worker not in ("shardstream", "budget"):
        import webdataset  # noqa: F401

        proc = make_processor(args.worker, patch, budget)
    if args.worker == "budget":
        start = time.perf_counter()
        n, count_seconds = run_budget(paths, batch, patch, budget)
        seconds = time.perf_counter() - start - count_seconds
        print_result({"samples": n, "seconds": seconds, "count_seconds": count_seconds, "peak_mb": peak_mb()})
        return
    start = time.perf_counter()
    if proc is None:
        n = run_shardstream(paths, batch, patch, budget)
    else:
        n = run_webdataset(paths, proc, batch, patch, budget, image_decoder(args.worker))
    print_result({"samples": n, "seconds": time.perf_counter() - start, "peak_mb": peak_mb()})


def peak_mb() -> float:
    """This process's peak resident memory, MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each contender keeps its best")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--max-patches", type=int, default=256)
    ap.add_argument("--budgets", default="1024,4096,16384", help="max_patches_per_batch of the padding table")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench-naflex"))
    ap.add_argument("--baseline", help="python/ folder of another shardstream build, run beside")
    ap.add_argument("--no-peers", action="store_true", help="shardstream only (before/after)")
    ap.add_argument("--worker")
    ap.add_argument("--paths")
    ap.add_argument("--cpus")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    sys.path.insert(0, HERE)
    import photo_shards

    per_shard = min(250, max(1, args.samples))
    paths = photo_shards.build(args.dir, shards=max(1, args.samples // per_shard), per_shard=per_shard)
    one = [sorted(os.sched_getaffinity(0))[-1]]
    print(
        f"{len(paths)} shards x {per_shard} real-photo JPEGs (256-512 px), NaFlex patch "
        f"{args.patch_size}, max_num_patches {args.max_patches}, batches of {args.batch}; 1 core"
    )
    padding_table(paths, args.patch_size, args.max_patches, [int(b) for b in args.budgets.split(",")])
    peers = {
        "webdataset + Siglip2ImageProcessorPil": "pil",
        "webdataset + Siglip2ImageProcessor (torchvision)": "torchvision",
        "webdataset + decode_jpeg + Siglip2ImageProcessor": "decode_jpeg",
    }
    ours = {"shardstream, 1 thread": "shardstream", "shardstream token-budget, 1 thread": "budget"}
    runs: dict[str, tuple[str, dict[str, str] | None]] = {}
    if not args.no_peers:
        runs.update({label: (name, None) for label, name in peers.items()})
    runs.update({label: (name, None) for label, name in ours.items()})
    if args.baseline:
        env = {"PYTHONPATH": os.path.abspath(args.baseline)}
        runs.update({f"baseline {label}": (name, env) for label, name in ours.items()})
    options = {
        "paths": paths,
        "cpus": one,
        "batch": args.batch,
        "patch-size": args.patch_size,
        "max-patches": args.max_patches,
    }
    rounds: dict[str, list[float]] = {label: [] for label in runs}
    peaks: dict[str, float] = {}
    count_seconds: list[float] = []
    for _ in range(max(1, args.repeat)):
        for label, (name, env) in runs.items():
            r = try_worker(__file__, name, options, env=env)
            if r:
                rounds[label].append(r["samples"] / r["seconds"])
                peaks[label] = max(peaks.get(label, 0.0), r["peak_mb"])
                if "count_seconds" in r and env is None:
                    count_seconds.append(r["count_seconds"])
    best = {label: max(rates) for label, rates in rounds.items() if rates}
    for label, rates in rounds.items():
        if rates:
            spread = ", ".join(f"{r:.0f}" for r in rates)
            peak = f"peak {peaks[label]:5.0f} MB"
            print(f"  {label:59s} {best[label]:8.1f} samples/s  {peak}  (rounds: {spread})")
    if count_seconds:
        print(f"  (token-budget count pass, apart: {min(count_seconds):.2f} s, header-only, 1 thread)")
    ours_rate = best.get("shardstream, 1 thread")
    if ours_rate is None:
        return
    print("\nratios (samples/s per core):")
    for label, rate in best.items():
        if not label.startswith(("shardstream", "baseline")):
            print(f"  shardstream / {label:50s} {ours_rate / rate:5.2f}x")
    for label in best:
        if label.startswith("baseline "):
            this = best.get(label.removeprefix("baseline "))
            if this is not None:
                print(f"  this build / {label:59s} {this / best[label]:5.2f}x")
    budget_rate = best.get("shardstream token-budget, 1 thread")
    if budget_rate is not None:
        print(f"  shardstream token-budget / shardstream fixed-count {budget_rate / ours_rate:5.2f}x")


if __name__ == "__main__":
    main()
