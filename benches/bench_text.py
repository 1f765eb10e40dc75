"""Captions and the training step (issue 14), side by side in one run.

  1. captions/s per core, Rust tokenizer vs open_clip's, on the real captions; the loader's
     samples/s per core with and without ``tokenizer=``.
  2. The trainer's main-process time per step outside forward/backward/optimizer, at B=256:
     before (the trainer up to issue 14) vs after (train/inputs.py + train/metrics.py).

    python benches/bench_text.py [--batch 256] [--image-size 224] [--steps 21] [--log-every 10]
                                 [--loader-pairs 15] [--loader-samples 2048] [--part 1|2|all]

Part 2 times exactly the work a step does besides the model, with no model: the model's calls
take the same time either way and are left out by construction.

* before: ``next(loader)``; open_clip's Python tokenizer on the captions, in this process;
  normalising the images; and the per-step host reads of the loss (``mean_over_ranks`` +
  ``.item()``), the gradient norm and the logit scale, each a host sync on a GPU.
* after: ``InputPipeline.take`` + ``stage`` (the trainer's own code) with batches that carry
  ``tokens`` as ``ShardLoader(tokenizer=...)`` will send them, and ``StepMetrics.add``, with
  its one read per ``--log-every`` steps (``flush``) shared out over the steps (a mean).

The loader is a list of ready batches (zero wait in both), so the figures are the step's own
work. Normalising is device work: on a GPU it runs on the device (a side stream), but on this
CPU the host does it. It is therefore shown apart, and the ratio is given with and without it.
The tokens of the "after" batches are made with open_clip's tokenizer before timing, standing in
for the Rust tokenizer's output until part 1 exists.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
CAPTIONS = ROOT.parent / "shared" / "data" / "img2dataset-test_1000.parquet"


def real_captions() -> list[str]:
    """The 1,000 real captions (shared/data, column TEXT), or the demo's prompts without them."""
    for path in (CAPTIONS, Path("/work/shared/data/img2dataset-test_1000.parquet")):
        if path.is_file():
            try:
                import pyarrow.parquet as pq

                return [
                    str(t or "") for t in pq.read_table(path, columns=["TEXT"]).column("TEXT").to_pylist()
                ]
            except ImportError:
                break
    from shardstream.train.data import demo_classes

    return [p for prompts in demo_classes().values() for p in prompts]


# -- part 1: the tokenizer ------------------------------------------------------------------------
# Part 1 (issue 14, Rust tokenizer): captions/s per core, the Rust tokenizer (the one
# ShardLoader(tokenizer=...) runs in its decode threads, here on one thread) vs
# open_clip.get_tokenizer("ViT-B-32") on real_captions() (target: >= 20x); and the loader's
# samples per core (per CPU-second) on one decode thread with and without tokenizer= (target:
# within 5 %), as the median of interleaved pairs with its spread: on a shared machine one pair
# of passes varies by more than the difference measured.


def _caption_shard(directory: str, captions: list[str], count: int) -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from corpus import good_samples, sample_members, tar_bytes, write_file

    members = []
    for i, (key, sample) in enumerate(good_samples(count)):
        members += sample_members(key, dict(sample, txt=captions[i % len(captions)]))
    return write_file(str(Path(directory) / "bench-0000.tar"), tar_bytes(members))


def part1_tokenizer(args: argparse.Namespace) -> None:
    import tempfile

    import numpy as np
    import open_clip
    from shardstream.tokenizer import rust_tokenizer

    captions = real_captions()
    rust = rust_tokenizer("ViT-B-32")
    out = np.zeros((len(captions), rust.context_length), dtype=np.int64)

    def rate(fn, repeat: int) -> float:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return len(captions) / best

    cold = rate(lambda: open_clip.tokenizer.SimpleTokenizer()(captions), 1)
    ref = open_clip.get_tokenizer("ViT-B-32")
    ref(captions)  # warm its word cache
    warm = rate(lambda: ref(captions), args.repeat)
    mine = rate(lambda: rust.tokenize_into(captions, out.ctypes.data, out.size), args.repeat)
    # Every word new to the tokenizer (a fresh one per round: what captions of unseen words cost).
    fresh = iter([rust_tokenizer("ViT-B-32") for _ in range(args.repeat)])
    mine_cold = rate(lambda: next(fresh).tokenize_into(captions, out.ctypes.data, out.size), args.repeat)
    print(f"part 1: {len(captions)} real captions, one core")
    print(f"  open_clip SimpleTokenizer: {cold:,.0f} captions/s cold cache, {warm:,.0f}/s warm cache")
    print(
        f"  Rust tokenizer: {mine:,.0f} captions/s warm ({mine / warm:.1f}x open_clip warm), "
        f"{mine_cold:,.0f}/s cold ({mine_cold / cold:.1f}x open_clip cold)"
    )

    with tempfile.TemporaryDirectory() as d:
        shards = [
            # What the benchmarks read (img2dataset-size photos, 256-512 px): the headline.
            ("256-512 px photos", _photo_shard(d, args.loader_samples // 2)),
            # The test corpus's 96-160 px crops decode about 4x faster, so the tokenizer's share
            # of the work is about 4x larger: the worst case for this comparison.
            ("96-160 px photos", _caption_shard(d, captions, args.loader_samples)),
        ]
        print(
            f"  loader, 1 decode thread, B=64, {args.image_size} px out, real captions; samples per "
            f"CPU-second of the whole process (all its threads: per core), {args.loader_pairs} "
            "interleaved pairs (with/without in turn):"
        )
        for name, shard in shards:
            plain, tok, ratios, wall = loader_pairs(shard, args)
            print(
                f'    {name}: without tokenizer= {plain:,.0f} samples/s, with tokenizer="ViT-B-32" '
                f"{tok:,.0f} (medians); with/without {_spread(ratios)}; wall-clock {_spread(wall)}"
            )
            # The same question from the two steady figures (best-of rates, not a difference of
            # noisy passes): the tokenizer's time per caption over the loader's CPU per sample.
            print(
                f"      tokenizer's own time per caption over the loader's CPU per sample: "
                f"{100 * plain / mine:.1f} % warm, {100 * plain / mine_cold:.1f} % with every word new"
            )


def _photo_shard(directory: str, count: int) -> str:
    sys.path.insert(0, str(ROOT / "benches"))
    import photo_shards

    return photo_shards.build(directory, shards=1, per_shard=count)[0]


def _spread(ratios: list[float]) -> str:
    """The median of per-pair ratios as a change in percent, with the quartiles and the range."""
    r = sorted(ratios)
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3

    def pct(x: float) -> str:
        return f"{100 * (x - 1):+.1f} %"

    return f"{pct(q[1])} (quartiles {pct(q[0])} to {pct(q[2])}, range {pct(r[0])} to {pct(r[-1])})"


def loader_pairs(shard: str, args: argparse.Namespace) -> tuple[float, float, list[float], list[float]]:
    """Passes over ``shard`` with and without the tokenizer, in turn (the order swapped every
    pair); per pass the samples per CPU-second of the process (``time.process_time``: every
    thread's time, so a busy machine's other processes do not count) and per wall second. Returns
    the median rates and the per-pair ratios (with / without), by CPU time and by wall clock."""
    from shardstream import ShardLoader

    def one(tokenizer: str | None) -> tuple[float, float]:
        loader = ShardLoader(shard, batch_size=64, image_size=args.image_size, threads=1, tokenizer=tokenizer)
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(len(b.texts) for b in loader)
        return n / (time.process_time() - c0), n / (time.perf_counter() - t0)

    one(None), one("ViT-B-32")  # warm-up: page cache, open_clip's vocabulary file, allocator
    rates: dict[str | None, list[tuple[float, float]]] = {None: [], "ViT-B-32": []}
    ratios, wall = [], []
    for i in range(args.loader_pairs):
        order = (None, "ViT-B-32") if i % 2 == 0 else ("ViT-B-32", None)
        pair = {t: one(t) for t in order}
        for t, r in pair.items():
            rates[t].append(r)
        ratios.append(pair["ViT-B-32"][0] / pair[None][0])
        wall.append(pair["ViT-B-32"][1] / pair[None][1])
    plain = statistics.median(c for c, _ in rates[None])
    tok = statistics.median(c for c, _ in rates["ViT-B-32"])
    return plain, tok, ratios, wall


# -- part 2: the trainer step outside the model ---------------------------------------------------


def make_batches(args: argparse.Namespace, captions: list[str], tokenizer, with_tokens: bool) -> list:
    import torch

    generator = torch.Generator().manual_seed(0)
    batches = []
    for step in range(args.steps):
        texts = [captions[(step * args.batch + i) % len(captions)] for i in range(args.batch)]
        images = torch.randint(
            0, 256, (args.batch, 3, args.image_size, args.image_size), dtype=torch.uint8, generator=generator
        )
        batch = SimpleNamespace(images=images, texts=texts, keys=[str(i) for i in range(args.batch)])
        if with_tokens:
            batch.tokens = tokenizer(texts)  # stands in for the loader's Rust tokenizer output
        batches.append(batch)
    return batches


class Timed:
    """Wraps the normalisation, adding its time to ``seconds``, and the time to free the previous
    step's normalised images (on this CPU, 150 MB handed back to the OS; on a GPU the caching
    allocator's microseconds): both are the device's work, which the host does here."""

    def __init__(self, fn) -> None:
        self.fn, self.seconds = fn, 0.0

    def free(self, prepared: list) -> None:
        t = time.perf_counter()
        prepared.clear()
        self.seconds += time.perf_counter() - t

    def __call__(self, *a):
        t = time.perf_counter()
        try:
            return self.fn(*a)
        finally:
            self.seconds += time.perf_counter() - t


def before_step(batches, tokenizer, normalise, device, ctx) -> list[tuple[float, float]]:
    """The non-model part of the old ``_train_step``: per step (seconds, of which normalising)."""
    import torch
    from shardstream.train.dist import mean_over_ranks

    norm = Timed(normalise)
    loss, grad_norm, logit_scale = torch.tensor(2.5), torch.tensor(1.0), torch.tensor(2.0)
    it = iter(batches)
    steps = []
    prepared: list = []
    for _ in batches:
        t, n = time.perf_counter(), norm.seconds
        norm.free(prepared)
        b = next(it)
        prepared = [(norm(b.images), tokenizer(list(b.texts)).to(device))]
        # the per-step reads: mean_over_ranks(loss) (an all-reduce and .item()), float(grad_norm),
        # float(logit_scale.exp())
        _ = mean_over_ranks(ctx, loss), float(grad_norm), float(logit_scale.exp())
        steps.append((time.perf_counter() - t, norm.seconds - n))
    return steps


def after_step(batches, tokenizer, normalise, device, ctx, log_every: int) -> list[tuple[float, float]]:
    import torch
    from shardstream.train.inputs import InputPipeline
    from shardstream.train.metrics import StepMetrics

    norm = Timed(normalise)
    pipeline = InputPipeline(device, 1, normalise=norm, tokenizer=tokenizer, context_length=None)
    metrics = StepMetrics(ctx)
    loss, grad_norm, logit_scale = torch.tensor(2.5), torch.tensor(1.0), torch.tensor(2.0)
    pipeline.start(iter(batches))
    steps = []
    inputs = None
    for step in range(1, len(batches) + 1):
        t, n = time.perf_counter(), norm.seconds
        norm.free(inputs.micro if inputs is not None else [])
        inputs = pipeline.take()
        assert inputs is not None
        # (the model's calls would be issued here)
        pipeline.stage()
        # the host times the window figures sum (not what this benchmark measures)
        times = {"step_time_s": 0.0, "input_s": 0.0, "loader_wait_s": 0.0}
        metrics.add({"step": step, **times}, loss, grad_norm=grad_norm, logit_scale=logit_scale.exp())
        if step % log_every == 0:
            metrics.flush(1)  # the logging step's one read (its cost lands on this step)
        steps.append((time.perf_counter() - t, norm.seconds - n))
    return steps


def summarise(steps: list[tuple[float, float]], log_every: int) -> tuple[float, float]:
    """(mean seconds per step, of which normalising), the first step left out (warm-up); mean,
    not median, so that the logging steps' reads are shared out over the steps."""
    steps = steps[1:]
    return statistics.fmean(t for t, _ in steps), statistics.fmean(n for _, n in steps)


def part2_trainer_step(args: argparse.Namespace) -> None:
    import torch
    from shardstream.train.dist import DistContext
    from shardstream.train.model import create_model

    torch.set_num_threads(1)  # per core, as a rank with its share of the cores runs it
    device = torch.device("cpu")
    ctx = DistContext(0, 1, 0, 1, device, None)
    bundle = create_model("ViT-B-32", pretrained="", device=device)  # its tokenizer and normalisation
    tokenizer = bundle.tokenizer

    def normalise(x):
        return bundle.normalise(x, device)

    captions = real_captions()
    tokenizer(captions)  # warm open_clip's word cache: its faster, steady state
    rows = []
    for name in ("before", "after"):
        batches = make_batches(args, captions, tokenizer, with_tokens=name == "after")
        best = None
        for _ in range(args.repeat):
            if name == "before":
                steps = before_step(batches, tokenizer, normalise, device, ctx)
            else:
                steps = after_step(batches, tokenizer, normalise, device, ctx, args.log_every)
            result = summarise(steps, args.log_every)
            # best round by the non-normalising part, the one compared (a shared machine only slows)
            best = result if best is None or result[0] - result[1] < best[0] - best[1] else best
        assert best is not None
        rows.append((name, *best))
    (_, b_total, b_norm), (_, a_total, a_norm) = rows
    print(
        f"part 2: main-process time per step outside forward/backward/optimizer, B={args.batch}, "
        f"{args.image_size} px, 1 thread, {len(captions)} real captions (mean of {args.steps - 1} steps "
        f"after the first, best of {args.repeat})"
    )
    print(f"  {'':8} {'total ms':>10} {'normalise ms':>13} {'without normalise ms':>21}")
    for name, total, norm in rows:
        print(f"  {name:8} {1e3 * total:10.2f} {1e3 * norm:13.2f} {1e3 * (total - norm):21.3f}")
    print(
        f"  ratio before/after: {(b_total - b_norm) / max(a_total - a_norm, 1e-9):.0f}x without normalising "
        f"(the main process on a GPU, where it runs on the device), {b_total / a_total:.1f}x with it "
        "(this CPU, where the host is the device); normalise includes freeing the previous step's images"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--log-every", type=int, default=10, help="log.every_steps of the after case")
    parser.add_argument(
        "--loader-pairs", type=int, default=15, help="loader passes with and without tokenizer="
    )
    parser.add_argument(
        "--loader-samples", type=int, default=2048, help="samples per loader pass (96-160 px)"
    )
    parser.add_argument("--part", choices=("1", "2", "all"), default="all")
    args = parser.parse_args()
    if args.part in ("1", "all"):
        part1_tokenizer(args)
    if args.part in ("2", "all"):
        part2_trainer_step(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
