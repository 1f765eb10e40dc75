"""The CUDA path, run on a CUDA GPU: what CI (CPUs, gloo) never runs.

1. Pinned batches. With CUDA present, the loader's batch buffers are page-locked (square
   ``images`` and NaFlex ``pixel_values``), so the copy to the GPU is asynchronous.
2. uint8 over PCIe, normalised on the GPU. The loader's batches copied to the GPU and normalised
   there as the trainer does (``ModelBundle.normalise``) equal the same normalisation on the CPU,
   and the loader's rate with the copies and normalisation behind it is printed beside its rate
   alone (the copies should cost it nothing).
3. The trainer on the GPU. ``train_clip.py`` (the demo config: a tiny CLIP, bf16 autocast, the
   embedded demo set) under ``torchrun`` with one process, so with the nccl backend, the side
   stream that stages step n+1's copies, and fused AdamW: the loss falls, and its log's samples/s
   and input fraction (``input_frac``: the share of each step spent on the host preparing
   inputs) are printed.

    python benches/bench_cuda.py [--samples 8000] [--epochs 2] [--repeat 3] [--dir DIR]

Exits 2, saying so, where no CUDA GPU is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PER_SHARD = 250
SIZE = 224


def pinned_batches(paths: list[str]) -> dict:
    import shardstream
    from shardstream.kinds import NaFlex

    square = next(iter(shardstream.ShardLoader(paths[:1], batch_size=64, image_size=SIZE, shuffle_buffer=1)))
    naflex = next(
        iter(
            shardstream.ShardLoader(
                paths[:1], batch_size=64, shuffle_buffer=1, sample=NaFlex(patch_size=16, max_num_patches=256)
            )
        )
    )
    return {
        "square_images_pinned": bool(square.images.is_pinned()),
        "naflex_pixel_values_pinned": bool(naflex.pixel_values.is_pinned()),
    }


def transfer(paths: list[str], repeat: int) -> dict:
    import open_clip
    import shardstream
    import torch
    from shardstream.train.model import ModelBundle

    def bundle(device: torch.device) -> ModelBundle:
        """The trainer's normalisation (``ModelBundle.normalise``) with CLIP's mean and std."""
        mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN, device=device).view(1, 3, 1, 1)
        std = torch.tensor(open_clip.OPENAI_DATASET_STD, device=device).view(1, 3, 1, 1)
        return ModelBundle(model=None, tokenizer=None, image_size=SIZE, mean=mean, std=std)

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    on_cuda, on_cpu = bundle(cuda), bundle(cpu)
    stream = torch.cuda.Stream()

    def loader():
        return shardstream.ShardLoader(
            paths, batch_size=64, image_size=SIZE, shuffle_buffer=1, drop_last=False
        )

    def alone() -> float:
        start = time.perf_counter()
        n = sum(len(b.keys) for b in loader())
        return n / (time.perf_counter() - start)

    def with_copies() -> float:
        """Every batch copied and normalised on a side stream, as the trainer's input stage."""
        n = 0
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in loader():
            with torch.cuda.stream(stream):
                on_cuda.normalise(batch.images, cuda)
            n += len(batch.keys)
        stream.synchronize()
        return n / (time.perf_counter() - start)

    # the same normalisation on both sides for a few whole batches (outside the timed passes)
    max_diff, checked = 0.0, 0
    for batch in loader():
        gpu_result = on_cuda.normalise(batch.images, cuda).cpu()
        cpu_result = on_cpu.normalise(batch.images, cpu)
        max_diff = max(max_diff, float((gpu_result - cpu_result).abs().max()))
        checked += 1
        if checked == 4:
            break
    rates: dict[str, list[float]] = {"alone": [], "with_copies": []}
    for _ in range(repeat):  # alternating, each keeps its best
        rates["alone"].append(alone())
        rates["with_copies"].append(with_copies())
    best_alone, best_copies = max(rates["alone"]), max(rates["with_copies"])
    return {
        "samples": len(paths) * PER_SHARD,
        "loader_alone_samples_per_s": best_alone,
        "loader_with_gpu_copies_samples_per_s": best_copies,
        "ratio": best_copies / best_alone,
        "rounds": rates,
        "gpu_vs_cpu_normalise_max_abs_diff": max_diff,
        "batches_compared": checked,
        "gpu": torch.cuda.get_device_name(0),
    }


def train(out_dir: str, epochs: int, timeout: float) -> dict:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
        os.path.join(ROOT, "train_clip.py"),
        "--train.epochs", str(epochs),
        "--train.output_dir", os.path.join(out_dir, "run"),
        "--data.demo_dir", os.path.join(out_dir, "demo"),
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"exit": done.returncode, "stderr": done.stderr[-3000:]}
    with open(os.path.join(out_dir, "run", "log.jsonl"), encoding="utf-8") as f:
        log = [json.loads(line) for line in f]
    return {"exit": 0, "wall_s": wall, **summarise(log)}


def summarise(log: list[dict]) -> dict:
    """The figures of a trainer's ``log.jsonl`` (its records, in order) that this bench prints."""
    start = next(r for r in log if r.get("type") == "start")
    steps = [r for r in log if "loss" in r and "samples_per_s" in r]
    steady = steps[len(steps) // 10 :]  # the first steps build kernels and fill the loader
    evals = [r for r in log if r.get("type") == "eval"]
    return {
        "backend": start["backend"],
        "device": start["device"],
        "precision": start["precision"],
        "steps": len(steps),
        "loss_first": steps[0]["loss"],
        "loss_last": steps[-1]["loss"],
        "samples_per_s_median": statistics.median(r["samples_per_s"] for r in steady),
        "input_frac_median": statistics.median(r["input_frac"] for r in steady),
        "zeroshot_top1": evals[-1].get("zeroshot_top1") if evals else None,
        "val_loss": evals[-1].get("val_loss") if evals else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=8000, help=f"rounded up to shards of {PER_SHARD}")
    ap.add_argument("--epochs", type=int, default=2, help="of the demo training")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the transfer pass; each keeps its best")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench"))
    ap.add_argument("--train-timeout", type=float, default=600)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA GPU is visible (torch.cuda.is_available() is False)", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, HERE)
    from photo_shards import build

    paths = build(args.dir, shards=max(1, -(-args.samples // PER_SHARD)), per_shard=PER_SHARD)
    results = {"pinned": pinned_batches(paths)}
    print("pinned:", json.dumps(results["pinned"]), flush=True)
    results["transfer"] = transfer(paths, args.repeat)
    print("transfer:", json.dumps(results["transfer"]), flush=True)
    results["train"] = train(
        tempfile.mkdtemp(dir=args.dir, prefix="cuda-train-"), args.epochs, args.train_timeout
    )
    print("train:", json.dumps(results["train"]), flush=True)
    print("JSON " + json.dumps(results))
    ok = (
        all(results["pinned"].values())
        and results["transfer"]["gpu_vs_cpu_normalise_max_abs_diff"] < 1e-5
        and results["train"].get("exit") == 0
        and results["train"]["loss_last"] < results["train"]["loss_first"]
    )
    print("CUDA path:", "as expected" if ok else "NOT as expected (see above)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
