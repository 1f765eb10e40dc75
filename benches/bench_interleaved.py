"""Interleaved image-text documents to Qwen2-VL training batches, per core, side by side on the
same OBELICS-style Parquet files of real documents (tests/interleaved_corpus.real_documents: real
captions and paragraphs of them, 0-4 JPEGs of real photos per document, 32 px to 1600 px).

Section 1, documents to packed batches ([B, L] token rows, each image's run of ``<|image_pad|>``
tokens in its row, the batch's images' patches in one ``pixel_values [P, 1176]`` with a grid per
image):

  HF peer      ``load_dataset("parquet", data_files=..., streaming=True)``; per document the text
               with ``<|vision_start|><|image_pad|><|vision_end|>`` per image, images decoded by
               PIL (``--peer-decode torchvision``: ``torchvision.io.decode_jpeg``), one
               ``Qwen2VLProcessor`` call with the fast (torchvision) image processor, ``+ [EOS]``;
               then packed greedily in Python into rows of ``--seq-len``: a document whole where it
               fits in the row, else in a fresh row; one longer than a row is cut, never inside an
               image run (a document with an image run longer than a row is skipped and counted);
               ``--batch`` rows per batch as torch tensors (input_ids, labels with padding and
               image runs at -100, pixel_values, image_grid_thw); the last partial batch is kept.
               One process pinned to one core, torch limited to one thread.
  stack peer   (``--peer stack`` or ``both``) the strongest Python stack we could write: pyarrow
               ``iter_batches`` over the same files, ``torchvision.io.decode_jpeg``, the fast
               ``Qwen2VLImageProcessor`` called on the document's images alone, the text between
               images encoded by ``tokenizers`` (``encode_batch``, Rust) and the vision runs laid
               in with numpy from the grids (no processor string expansion), the same packing.
               It must give the HF peer's tokens, padding and patches (checked when both run).
  shardstream  ``count_interleaved(...)`` (the counting pass, timed apart) then
               ``InterleavedLoader(counts, seed=0, threads=T)``, T = ``--threads`` on T cores.
               Until the interleaved kind exists it reports itself as unavailable and the peer
               runs alone.

Figures: documents/s (documents begun), tokens/s (tokens that are not padding, image tokens
included), the padding fraction of the token slots, the peak resident memory of each
contender's process (and its growth over the process's size after its imports, about 1 GB of
torch, transformers and datasets). Imports are not timed; construction (``load_dataset``, the
processor, the loader) is.

Section 2, the image path alone (decode + resize + patchify of the same JPEGs, one processor call
per document's images, one core): PIL decode + ``Qwen2VLImageProcessorPil`` (transformers'
"slow" one), PIL decode + ``Qwen2VLImageProcessor`` (the "fast", torchvision one; called
``Qwen2VLImageProcessorFast`` before transformers 5, still an alias), and
``torchvision.io.decode_jpeg`` tensors + the fast one. Before timing (unless --no-verify) the
three are checked to give the same grids, and their mean absolute pixel difference from the slow
one is printed. shardstream's image path is a whole InterleavedLoader pass on one thread (its
text and packing included), images/s from its stats.

Every contender runs in a fresh process, its best of ``--repeat`` rounds taken in turn
(benches/_harness.py). The tokenizer is the committed GPT-2-style fixture
(tests/data/tokenizers/captions-bpe.json) with the three vision tokens added as special tokens
(ids 1000-1002; written to --dir), EOS ``</s>``, pad ``<pad>``.

    python benches/bench_interleaved.py [--docs 400] [--files 4] [--rows-per-group 8] \\
        [--seq-len 4096] [--batch 8] [--min-pixels 3136] [--max-pixels 1003520] [--repeat 3] \\
        [--threads 1] [--no-peer] [--no-images] [--no-verify] [--peer-decode pil|torchvision] \\
        [--peer hf|stack|both] \\
        [--baseline PYTHON_DIR] [--dir /tmp/shardstream-bench-interleaved]

``--baseline`` adds section 1's shardstream on another build (its python/ folder, e.g. a
worktree of an earlier commit built with ``maturin develop`` or its ``_core`` copied in) as one
more contender, taking turns with this build round by round, and prints this build's rate over
the baseline's per round: a before/after on the same machine in the same run.

Smoke run (about a minute): ``--docs 40 --repeat 1``.
"""

from __future__ import annotations

import argparse
import bisect
import io
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
# --baseline: a worker imports another build's shardstream (its python/ folder) instead.
BASELINE_ENV = "SHARDSTREAM_BENCH_BASELINE"
if os.environ.get(BASELINE_ENV):
    sys.path.insert(0, os.environ[BASELINE_ENV])
from _harness import pin, print_result, proc_kb, try_worker  # noqa: E402

GEN = "i1"  # bump when the generated corpus changes, so cached ones are not reused
#: No network, no writes to the user's HF cache by the peer.
PEER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}
IGNORE = -100


# -- the corpus --------------------------------------------------------------------------------------


def build_corpus(args: argparse.Namespace) -> tuple[list[str], str]:
    """(Parquet files, tokenizer.json with the vision tokens), generated once into ``args.dir``."""
    import interleaved_corpus
    import qwen_reference

    os.makedirs(args.dir, exist_ok=True)
    tokenizer = os.path.join(args.dir, f"captions-bpe-qwen-{GEN}.json")
    if not os.path.exists(tokenizer):
        qwen_reference.write_tokenizer_json(tokenizer + ".tmp")
        os.replace(tokenizer + ".tmp", tokenizer)
    folder = os.path.join(
        args.dir, f"corpus-{args.docs}d-{args.files}f-{args.rows_per_group}r-s{args.seed}-{GEN}"
    )
    paths = [os.path.join(folder, f"part-{f:03d}.parquet") for f in range(args.files)]
    if not all(os.path.exists(p) for p in paths):
        start = time.perf_counter()
        docs = interleaved_corpus.real_documents(args.docs, seed=args.seed)
        tmp = folder + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for f in range(args.files):
            interleaved_corpus.write_obelics_parquet(
                os.path.join(tmp, os.path.basename(paths[f])), docs[f :: args.files], args.rows_per_group
            )
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        images = sum(1 for d in docs for i in d["images"] if i is not None)
        size = sum(os.path.getsize(p) for p in paths)
        print(
            f"  wrote {len(docs)} documents ({images} images, {size / 1e6:.1f} MB) into {args.files} files "
            f"under {folder} ({time.perf_counter() - start:.1f} s)"
        )
    return paths, tokenizer


def corpus_images(paths: list[str]) -> list[list[bytes]]:
    """Each document's image bytes, in order (documents without images left out)."""
    import pyarrow.parquet as pq

    out = []
    for p in paths:
        for images in pq.read_table(p, columns=["images"]).column("images").to_pylist():
            data = [e["bytes"] for e in images if e is not None]
            if data:
                out.append(data)
    return out


# -- section 1: the HF peer --------------------------------------------------------------------------


def peer_processor(o: dict):
    """(Qwen2VLProcessor with the fast image processor, note): the slow one stands in, and the
    note says so, where the fast one cannot be made (it needs torchvision)."""
    import qwen_reference

    args = (o["min_pixels"], o["max_pixels"])
    try:
        return qwen_reference.make_processor(*args, fast=True, tokenizer_path=o["tokenizer"]), ""
    except ImportError as e:
        note = f"the fast image processor is unavailable ({e}): the slow (PIL) one stood in"
        return qwen_reference.make_processor(*args, fast=False, tokenizer_path=o["tokenizer"]), note


class Packer:
    """Greedy packing of tokenized documents into rows of ``seq_len`` and batches of ``batch``
    rows (see the module's docstring)."""

    def __init__(
        self, seq_len: int, batch: int, pad: int, vision_start: int, vision_end: int, image_pad: int
    ):
        self.L, self.B = seq_len, batch
        self.pad, self.vs, self.ve, self.image_pad = pad, vision_start, vision_end, image_pad
        self.row: list = []  # pieces (np arrays) of the open row
        self.row_len = 0
        self.rows: list = []  # closed rows of the open batch
        self.images: list = []  # (pixel rows, grid) of the open batch, in order
        self.documents = 0  # documents begun in the open batch
        self.skipped = 0

    def add(self, ids, pixels, grids):
        """Adds one document (ids: int64 np array ending in EOS; pixels: [P, 1176] tensor; grids:
        [n, 3] tensor); yields the batches it completes."""
        import numpy as np

        n = len(ids)
        starts = np.flatnonzero(ids == self.vs)
        ends = np.flatnonzero(ids == self.ve)
        if len(starts) and int((ends - starts).max()) + 1 > self.L:
            self.skipped += 1
            return
        sizes = [int(g.prod()) for g in grids] if len(starts) else []
        offsets = np.cumsum([0, *sizes])
        if n > self.L - self.row_len and n <= self.L:
            yield from self._close_row()
        begun = False
        pos, image = 0, 0
        while pos < n:
            space = self.L - self.row_len
            k = min(n, pos + space)
            if k < n:  # a cut: not inside an image run (start < k <= end)
                r = bisect.bisect_left(starts, k) - 1
                if r >= 0 and starts[r] < k <= ends[r]:
                    k = int(starts[r])
            if k > pos:
                self.row.append(ids[pos:k])
                self.row_len += k - pos
                if not begun:
                    self.documents += 1
                    begun = True
                while image < len(starts) and starts[image] < k:
                    self.images.append((pixels[offsets[image] : offsets[image + 1]], grids[image]))
                    image += 1
                pos = k
            if pos < n:
                yield from self._close_row()

    def _close_row(self):
        import numpy as np

        if not self.row_len:
            return
        row = np.full(self.L, self.pad, dtype=np.int64)
        row[: self.row_len] = np.concatenate(self.row)
        self.rows.append(row)
        self.row, self.row_len = [], 0
        if len(self.rows) == self.B:
            yield self._batch()

    def finish(self):
        yield from self._close_row()
        if self.rows:
            yield self._batch()

    def _batch(self) -> dict:
        import numpy as np
        import torch

        ids = torch.from_numpy(np.stack(self.rows))
        labels = ids.clone()
        labels[(ids == self.pad) | (ids == self.image_pad) | (ids == self.vs) | (ids == self.ve)] = IGNORE
        if self.images:
            pixel_values = torch.cat([p for p, _ in self.images])
            grid = torch.stack([g for _, g in self.images])
        else:
            pixel_values, grid = (
                torch.zeros((0, 1176), dtype=torch.uint8),
                torch.zeros((0, 3), dtype=torch.int64),
            )
        out = {
            "input_ids": ids,
            "labels": labels,
            "pixel_values": pixel_values,
            "image_grid_thw": grid,
            "documents": self.documents,
            "padding": int((ids == self.pad).sum()),
        }
        self.rows, self.images, self.documents = [], [], 0
        return out


def tally(batches, start: float, packer: Packer, image_processor: str, note: str) -> dict:
    """A peer's figures over its ``batches`` (each checked to hold its grids' patches), timed
    from ``start``."""
    documents = tokens = padding = slots = patches = n_batches = 0
    pixel_dtype = ""
    for b in batches:
        n_batches += 1
        documents += b["documents"]
        padding += b["padding"]
        slots += b["input_ids"].numel()
        tokens += b["input_ids"].numel() - b["padding"]
        patches += b["pixel_values"].shape[0]
        assert b["pixel_values"].shape[0] == int(b["image_grid_thw"].prod(dim=1).sum())
        pixel_dtype = str(b["pixel_values"].dtype)
    return {
        "documents": documents,
        "tokens": tokens,
        "padding": padding,
        "slots": slots,
        "patches": patches,
        "batches": n_batches,
        "skipped": packer.skipped,
        "seconds": time.perf_counter() - start,
        "pixel_dtype": pixel_dtype,
        "image_processor": image_processor,
        "note": note,
    }


def run_peer(o: dict) -> dict:
    """One epoch of the HF peer; its figures."""
    import numpy as np
    import qwen_reference
    import torch
    from datasets import load_dataset
    from PIL import Image

    decode_tv = o["peer_decode"] == "torchvision"
    if decode_tv:
        from torchvision.io import ImageReadMode, decode_jpeg
    start = time.perf_counter()
    processor, note = peer_processor(o)
    vs, ve, image_pad = qwen_reference.reference_added_ids(processor)
    tok = processor.tokenizer
    eos, pad = tok.convert_tokens_to_ids(qwen_reference.EOS), tok.convert_tokens_to_ids(qwen_reference.PAD)
    packer = Packer(o["seq_len"], o["batch"], pad, vs, ve, image_pad)
    ds = load_dataset("parquet", data_files=o["files"], split="train", streaming=True)

    def decode(entry):
        data = entry["bytes"]
        if decode_tv:
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")

    def batches():
        for row in ds:
            parts, images = [], []
            for text, image in zip(row["texts"], row["images"], strict=True):
                if image is not None:
                    parts.append(qwen_reference.IMAGE_PLACEHOLDER)
                    images.append(decode(image))
                else:
                    parts.append(text)
            out = processor(
                text=["".join(parts)], images=images or None, add_special_tokens=False, return_tensors="pt"
            )
            ids = np.append(out["input_ids"][0].numpy(), eos)
            pixels = out.get("pixel_values") if images else None
            grids = out.get("image_grid_thw") if images else None
            yield from packer.add(ids, pixels, grids)
        yield from packer.finish()

    return tally(batches(), start, packer, type(processor.image_processor).__name__, note)


def run_stack_peer(o: dict) -> dict:
    """One epoch of the stack peer (see the module's docstring); its figures."""
    import numpy as np
    import pyarrow.parquet as pq
    import qwen_reference
    import torch
    from tokenizers import Tokenizer
    from torchvision.io import ImageReadMode, decode_jpeg

    start = time.perf_counter()
    image_processor = peer_processor(o)[0].image_processor
    merge = image_processor.merge_size**2
    tok = Tokenizer.from_file(o["tokenizer"])
    vs, ve, image_pad = (
        tok.token_to_id(t)
        for t in (qwen_reference.VISION_START, qwen_reference.VISION_END, qwen_reference.IMAGE_PAD)
    )
    eos, pad = tok.token_to_id(qwen_reference.EOS), tok.token_to_id(qwen_reference.PAD)
    packer = Packer(o["seq_len"], o["batch"], pad, vs, ve, image_pad)

    def document(texts, images):
        # Texts between images joined, as the processor sees them in one string.
        segments, data, text = [], [], []
        for t, image in zip(texts, images, strict=True):
            if image is not None:
                segments.append("".join(text))
                data.append(image["bytes"])
                text = []
            else:
                text.append(t)
        segments.append("".join(text))
        encoded = [
            np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(segments, add_special_tokens=False)
        ]
        if not data:
            return np.append(encoded[0], eos), None, None
        frames = [
            decode_jpeg(torch.frombuffer(bytearray(b), dtype=torch.uint8), mode=ImageReadMode.RGB)
            for b in data
        ]
        out = image_processor(images=frames, return_tensors="pt")
        grids = out["image_grid_thw"]
        pieces = [encoded[0]]
        for grid, seg in zip(grids.tolist(), encoded[1:], strict=True):
            run = np.full(grid[0] * grid[1] * grid[2] // merge + 2, image_pad, dtype=np.int64)
            run[0], run[-1] = vs, ve
            pieces += [run, seg]
        pieces.append(np.asarray([eos], dtype=np.int64))
        return np.concatenate(pieces), out["pixel_values"], grids

    def batches():
        for f in o["files"]:
            for rb in pq.ParquetFile(f).iter_batches(batch_size=64, columns=["texts", "images"]):
                for texts, images in zip(rb.column(0).to_pylist(), rb.column(1).to_pylist(), strict=True):
                    yield from packer.add(*document(texts, images))
        yield from packer.finish()

    return tally(batches(), start, packer, type(image_processor).__name__, "")


# -- section 1: shardstream --------------------------------------------------------------------------


def run_shardstream(
    files: list[str],
    tokenizer_path: str,
    seq_len: int,
    batch_size: int,
    min_pixels: int,
    max_pixels: int,
    threads: int,
    max_patches_per_batch: int | None = None,
    eos_token: str = "</s>",
) -> dict:
    """One epoch of shardstream's interleaved kind (the intended API); its figures, the counting
    pass timed apart (``count_seconds``) from the loader's (``seconds``). Without a patch budget
    given, one that never binds (every slot of the batch an image token: 4 patches each). The
    EOS is the peer's (the fixture marks no token as its EOS)."""
    try:
        from shardstream import InterleavedLoader, QwenVL, count_interleaved
    except ImportError as e:
        raise SystemExit(
            f"shardstream has no interleaved kind in this build ({e}): InterleavedLoader, "
            "count_interleaved and QwenVL are needed; the peer runs alone"
        ) from None
    if max_patches_per_batch is None:
        max_patches_per_batch = batch_size * seq_len * 4
    start = time.perf_counter()
    counts = count_interleaved(
        files,
        tokenizer=tokenizer_path,
        spec=QwenVL(min_pixels=min_pixels, max_pixels=max_pixels),
        seq_len=seq_len,
        batch_size=batch_size,
        max_patches_per_batch=max_patches_per_batch,
        eos_token=eos_token,
        threads=threads,
    )
    count_seconds = time.perf_counter() - start
    start = time.perf_counter()
    loader = InterleavedLoader(counts, seed=0, threads=threads)
    documents = tokens = padding = slots = patches = n_batches = 0
    dtype = ""
    for batch in loader:
        n_batches += 1
        documents += int(batch.documents)
        padding += int(batch.padding)
        slots += batch.input_ids.numel()
        tokens += batch.input_ids.numel() - int(batch.padding)
        patches += batch.pixel_values.shape[0]
        dtype = str(batch.pixel_values.dtype)
    return {
        "documents": documents,
        "tokens": tokens,
        "padding": padding,
        "slots": slots,
        "patches": patches,
        "batches": n_batches,
        "seconds": time.perf_counter() - start,
        "count_seconds": count_seconds,
        "pixel_dtype": dtype,
    }


# -- section 2: the image path alone -----------------------------------------------------------------

IMAGE_CONTENDERS = {
    "PIL decode + Qwen2VLImageProcessorPil (slow)": "img-pil-slow",
    "PIL decode + Qwen2VLImageProcessor (fast)": "img-pil-fast",
    "torchvision decode_jpeg + Qwen2VLImageProcessor (fast)": "img-tv-fast",
    # the whole loader pass (its text and packing too, a few per cent of it), images/s
    "shardstream InterleavedLoader, 1 thread (whole pass)": "img-shardstream",
}


def image_inputs(kind: str):
    """(decode function, processor factory) of an image contender."""
    import qwen_reference

    if kind == "img-tv-fast":
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        def decode(data):
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)

    else:
        decode = qwen_reference.decode_image
    fast = kind != "img-pil-slow"
    return decode, lambda o: qwen_reference.make_image_processor(o["min_pixels"], o["max_pixels"], fast=fast)


def run_shardstream_images(o: dict) -> dict:
    """The interleaved kind's image path: a whole InterleavedLoader pass on one thread (the
    counting pass before the clock), its images and patches from the loader's stats."""
    from shardstream import InterleavedLoader, QwenVL, count_interleaved

    spec = QwenVL(min_pixels=o["min_pixels"], max_pixels=o["max_pixels"])
    counts = count_interleaved(
        o["files"], tokenizer=o["tokenizer"], spec=spec, seq_len=o["seq_len"], batch_size=o["batch"],
        eos_token="</s>", threads=1,
    )  # fmt: skip
    start = time.perf_counter()
    loader = InterleavedLoader(counts, threads=1, pin_memory=False)
    for _ in loader:
        pass
    stats = loader.stats
    return {"images": stats["images"], "patches": stats["patches"], "seconds": time.perf_counter() - start}


def run_images(kind: str, o: dict) -> dict:
    if kind == "img-shardstream":
        return run_shardstream_images(o)
    docs = corpus_images(o["files"])  # read before the clock: the image path alone is timed
    decode, factory = image_inputs(kind)
    tensors = "np" if kind == "img-pil-slow" else "pt"
    start = time.perf_counter()
    proc = factory(o)
    images = patches = 0
    for data in docs:
        out = proc(images=[decode(b) for b in data], return_tensors=tensors)
        images += len(data)
        patches += out["pixel_values"].shape[0]
    return {"images": images, "patches": patches, "seconds": time.perf_counter() - start}


def verify_images(o: dict, limit: int = 60) -> None:
    """The three image contenders give the same grids on the first ``limit`` images; prints their
    pixels' mean absolute difference from the slow one."""
    import numpy as np

    data = [b for doc in corpus_images(o["files"]) for b in doc][:limit]
    results = {}
    for kind in ("img-pil-slow", "img-pil-fast", "img-tv-fast"):
        decode, factory = image_inputs(kind)
        proc = factory(o)
        results[kind] = [proc(images=[decode(b)], return_tensors="np") for b in data]
    slow = results["img-pil-slow"]
    for kind in ("img-pil-fast", "img-tv-fast"):
        errors = []
        for a, b in zip(slow, results[kind], strict=True):
            assert np.array_equal(a["image_grid_thw"], b["image_grid_thw"]), kind
            errors.append(
                np.abs(a["pixel_values"].astype(np.float32) - b["pixel_values"].astype(np.float32)).mean()
            )
        print(
            f"  {kind} vs img-pil-slow on {len(data)} images: same grids; pixels' mean abs difference "
            f"{np.mean(errors):.3f} (largest {np.max(errors):.3f}; 0-255 scale)"
        )


# -- workers -----------------------------------------------------------------------------------------


def peak_mb() -> float:
    """This process's peak resident memory, MB: VmHWM, not ``ru_maxrss``, which Linux carries over
    from the parent through fork and exec (a worker started by a driver that grew to 1.7 GB would
    report at least that)."""
    return proc_kb("VmHWM") / 1024


def imports() -> None:
    """Every contender's modules, imported before its clock starts (torch alone takes seconds)."""
    import datasets  # noqa: F401
    import numpy  # noqa: F401
    import PIL.Image  # noqa: F401
    import torch
    import transformers  # noqa: F401

    torch.set_num_threads(1)
    try:
        import torchvision.io  # noqa: F401
        from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorPil  # noqa: F401
    except ImportError:
        pass


def worker(args: argparse.Namespace) -> None:
    o = json.loads(args.options)
    pin(args.cpus)
    imports()
    base_mb = proc_kb("VmRSS") / 1024
    if args.worker == "peer":
        r = run_peer(o)
    elif args.worker == "stack-peer":
        r = run_stack_peer(o)
    elif args.worker == "shardstream":
        try:
            import shardstream  # noqa: F401
        except ImportError:
            pass
        r = run_shardstream(
            o["files"],
            o["tokenizer"],
            o["seq_len"],
            o["batch"],
            o["min_pixels"],
            o["max_pixels"],
            o["threads"],
            o.get("max_patches"),
        )
    else:
        r = run_images(args.worker, o)
    print_result({**r, "peak_mb": peak_mb(), "grown_mb": peak_mb() - base_mb})


# -- the driver --------------------------------------------------------------------------------------


def memory(rs: list[dict]) -> str:
    """The largest peak RSS of a contender's rounds, and its growth over the RSS after imports
    (torch, transformers and datasets alone hold about 1 GB)."""
    return f"{max(r['peak_mb'] for r in rs):.0f} (+{max(r['grown_mb'] for r in rs):.0f})"


def docs_per_second(result: dict) -> float:
    return result["documents"] / result["seconds"]


def fmt_rounds(rates: list[float]) -> str:
    return ", ".join(f"{r:.0f}" for r in rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=400, help="documents in the corpus")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rows-per-group", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8, help="rows per batch")
    ap.add_argument("--min-pixels", type=int, default=56 * 56)
    ap.add_argument("--max-pixels", type=int, default=28 * 28 * 1280)
    ap.add_argument(
        "--max-patches", type=int, help="shardstream's max_patches_per_batch (default: never binds)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each contender keeps its best")
    ap.add_argument("--threads", type=int, default=1, help="shardstream threads (on as many cores)")
    ap.add_argument("--peer-decode", choices=["pil", "torchvision"], default="pil")
    ap.add_argument(
        "--peer", choices=["hf", "stack", "both"], default="hf", help="which peers run (module docstring)"
    )
    ap.add_argument("--no-peer", action="store_true", help="shardstream only")
    ap.add_argument("--no-images", action="store_true", help="skip section 2 (the image path alone)")
    ap.add_argument("--no-verify", action="store_true", help="skip section 2's agreement check")
    ap.add_argument("--baseline", help="python/ folder of another shardstream build, run beside")
    ap.add_argument("--dir", default=os.path.join("/tmp", "shardstream-bench-interleaved"))
    ap.add_argument("--worker")
    ap.add_argument("--options")
    ap.add_argument("--cpus")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    files, tokenizer = build_corpus(args)
    cores = sorted(os.sched_getaffinity(0))
    one = cores[-1:]
    ours_cores = cores[-max(1, args.threads) :]
    if len(ours_cores) < args.threads:
        print(f"  note: {args.threads} threads asked, {len(cores)} cores available")
    options = {
        "files": files,
        "tokenizer": tokenizer,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "min_pixels": args.min_pixels,
        "max_pixels": args.max_pixels,
        "max_patches": args.max_patches,
        "threads": args.threads,
        "peer_decode": args.peer_decode,
    }
    print(
        f"{args.docs} documents in {len(files)} Parquet files; rows of {args.seq_len} tokens, {args.batch} "
        f"rows per batch; Qwen2-VL spec, min_pixels {args.min_pixels}, max_pixels {args.max_pixels}"
    )

    # section 1
    runs: dict[str, tuple[str, list[int], dict[str, str]]] = {}
    if not args.no_peer and args.peer in ("hf", "both"):
        runs[f"HF datasets + Qwen2VLProcessor (fast), {args.peer_decode} decode, 1 core"] = (
            "peer",
            one,
            PEER_ENV,
        )
    if not args.no_peer and args.peer in ("stack", "both"):
        runs["pyarrow + decode_jpeg + Qwen2VLImageProcessor + tokenizers, 1 core"] = (
            "stack-peer",
            one,
            PEER_ENV,
        )
    ours_label = f"shardstream, {args.threads} thread{'s' if args.threads > 1 else ''}"
    runs[ours_label] = ("shardstream", ours_cores, {})
    baseline_label = f"{ours_label}, baseline build"
    if args.baseline:
        runs[baseline_label] = ("shardstream", ours_cores, {BASELINE_ENV: os.path.abspath(args.baseline)})
    results: dict[str, list[dict]] = {label: [] for label in runs}
    for _ in range(max(1, args.repeat)):
        for label, (name, cpus, env) in runs.items():
            if name == "shardstream" and results[label] == [None]:
                continue  # unavailable: said once
            r = try_worker(__file__, name, {"options": options, "cpus": cpus}, env=env)
            if r is None and name == "shardstream":
                results[label] = [None]
            elif r is not None:
                results[label].append(r)
    print("\nsection 1: documents to packed batches")
    print(
        f"  {'contender':62s} {'docs/s':>8s} {'tokens/s':>10s} {'padding':>8s} "
        f"{'peak MB (+ over imports)':>25s}"
    )
    best: dict[str, dict] = {}
    for label, rs in results.items():
        rs = [r for r in rs if r]
        if not rs:
            print(f"  {label:62s} unavailable")
            continue
        b = min(rs, key=lambda r: r["seconds"])
        best[label] = b
        print(
            f"  {label:62s} {b['documents'] / b['seconds']:8.1f} {b['tokens'] / b['seconds']:10.0f} "
            f"{100 * b['padding'] / max(1, b['slots']):7.2f}% {memory(rs):>25s}  "
            f"(docs/s rounds: {fmt_rounds([r['documents'] / r['seconds'] for r in rs])})"
        )
    for label, b in best.items():
        extra = f", {b['skipped']} skipped (an image run longer than a row)" if b.get("skipped") else ""
        proc = f", {b['image_processor']}" if b.get("image_processor") else ""
        if b.get("note"):
            print(f"    NOTE: {b['note']}")
        print(
            f"    {label}: {b['documents']} documents, {b['tokens']} tokens, {b['batches']} batches, "
            f"{b['patches']} patches ({b['pixel_dtype']}){proc}{extra}"
        )
        if "count_seconds" in b:
            total = b["seconds"] + b["count_seconds"]
            print(
                f"    counting pass apart: {b['count_seconds']:.2f} s; with it, "
                f"{b['documents'] / total:.1f} docs/s, {b['tokens'] / total:.0f} tokens/s"
            )
    if ours_label in best and baseline_label in best:
        # Rounds alternate, so round i of each ran next to the other's: the ratio per round.
        pairs = list(zip(results[ours_label], results[baseline_label], strict=False))
        per_round = [docs_per_second(a) / docs_per_second(b) for a, b in pairs]
        best_ratio = docs_per_second(best[ours_label]) / docs_per_second(best[baseline_label])
        print(
            f"  this build / baseline build, docs/s: best {best_ratio:.3f}x; "
            f"per round {', '.join(f'{r:.3f}x' for r in per_round)}"
        )
    ours = best.get(ours_label)
    peers = {label: b for label, b in best.items() if label not in (ours_label, baseline_label)}
    if len(peers) == 2:
        hf, stack = peers.values()
        same = all(hf[k] == stack[k] for k in ("documents", "tokens", "padding", "patches", "batches"))
        print(f"  the two peers give the same documents, tokens, padding, patches and batches: {same}")
    for label, peer in peers.items():
        if not ours:
            break
        print(f"  ratios, shardstream / {label}:")
        for what in ("documents", "tokens"):
            a, p = ours[what] / ours["seconds"], peer[what] / peer["seconds"]
            total = ours[what] / (ours["seconds"] + ours["count_seconds"])
            print(f"    {what}/s {a / p:5.2f}x  (with the counting pass: {total / p:5.2f}x)")
        ours_padding = ours["padding"] / max(1, ours["slots"])
        print(f"    padding {ours_padding:.4f} vs {peer['padding'] / max(1, peer['slots']):.4f}")

    if args.no_images:
        return
    # section 2
    print("\nsection 2: the image path alone (decode + resize + patchify, one core)")
    if not args.no_verify:
        verify_images(options)
    img_results: dict[str, list[dict]] = {label: [] for label in IMAGE_CONTENDERS}
    for _ in range(max(1, args.repeat)):
        for label, name in IMAGE_CONTENDERS.items():
            r = try_worker(__file__, name, {"options": options, "cpus": one}, env=PEER_ENV)
            if r:
                img_results[label].append(r)
    img_best = {}
    for label, rs in img_results.items():
        if not rs:
            print(f"  {label:62s} unavailable")
            continue
        b = min(rs, key=lambda r: r["seconds"])
        img_best[label] = b["images"] / b["seconds"]
        print(
            f"  {label:62s} {b['images'] / b['seconds']:8.1f} images/s {b['patches'] / b['seconds']:9.0f} "
            f"patches/s  peak {memory(rs)} MB  "
            f"(rounds: {fmt_rounds([r['images'] / r['seconds'] for r in rs])})"
        )
    slow = img_best.get("PIL decode + Qwen2VLImageProcessorPil (slow)")
    if slow:
        print("  ratios, images/s over the slow processor:")
        for label, rate in img_best.items():
            print(f"    {label:62s} {rate / slow:5.2f}x")
    ours = img_best.get("shardstream InterleavedLoader, 1 thread (whole pass)")
    fastest = img_best.get("torchvision decode_jpeg + Qwen2VLImageProcessor (fast)")
    if ours and fastest:
        print(f"  shardstream / decode_jpeg + the fast processor: {ours / fastest:5.2f}x images/s")


if __name__ == "__main__":
    main()
