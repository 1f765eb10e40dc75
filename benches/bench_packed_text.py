"""Read + tokenize + pack, tokens/s per core (issue 29), side by side in one run, on the same
FineWeb-like Parquet files and the same ``tokenizer.json``:

  (a) shardstream  ``TextLoader(counts, batch_size=B, seq_len=L, threads=1)``; the one-off
                   ``count_tokens`` pass it needs (one thread, one core) is timed and reported apart.
  (b) HF           ``load_dataset("parquet", data_files=..., streaming=True)``, ``.iter(batch_size=1000)``,
                   ``tokenizers.Tokenizer.encode_batch(texts, add_special_tokens=False)`` + the EOS per
                   document, and Python packing into ``[B, L]`` int64 tensors (group_texts: concatenate
                   and cut, carrying the tail into the next batch, the last partial row dropped).
  (c) LitData      ``StreamingDataset(out, item_loader=TokensLoader(block_size=L + 1))`` through
                   ``StreamingDataLoader(batch_size=B, num_workers=0)``, reading the chunks that
                   ``litdata.optimize(..., item_loader=TokensLoader())`` wrote (one worker; its time is
                   reported apart as the conversion). Skipped, with a line saying so, when litdata is
                   not installed (``pip install -r requirements/bench.txt``).

Every contender runs in a fresh process pinned to one core (``os.sched_setaffinity``; shardstream
with threads=1, ``RAYON_NUM_THREADS=1`` for ``tokenizers``), the contenders in turn within each
repeat (the order rotated); a contender's time includes its construction (counts loading and
planning, ``load_dataset``, ``StreamingDataset``) and ends after its last batch. tokens/s counts
the tokens handed to the caller: B x L per batch for (a) and (b), B x (L + 1) for LitData (its
blocks carry the shifted label's extra token: counted in its favour). Each peer runs in its
cheapest configuration (no shuffling); shardstream with its defaults (block-shuffled rows).

The corpus: tests/text_corpus.documents() (Python standard library sources and the 1,000 real
captions of shared/data, 4.8 MB of distinct text) repeated in a fresh seeded order until --mb
megabytes, written round-robin into --files Parquet files (``id``, ``text``; snappy; row groups of
--rows-per-group rows). The tokenizer: by default a Llama-3-style byte-level BPE (Llama 3's split
pattern, ``<|end_of_text|>`` as the EOS) trained by tests/text_corpus.llama3_style_tokenizer on the
distinct documents with --vocab entries; ``--tokenizer gpt2`` takes the committed GPT-2-style
fixture (tests/data/tokenizers/captions-bpe.json, ``</s>``). Both are cached under --dir.

Before timing (unless --no-verify), (a) and (b) are checked to read the same multiset of tokens
in an epoch: the HF stream's token histogram equals the counts' total, shardstream's rows are a
sub-multiset of it short by exactly its reported remainder, and both yield the same batches.

    python benches/bench_packed_text.py [--mb 50] [--files 8] [--rows-per-group 1000] \\
        [--batch 8] [--seq-len 2048] [--repeat 5] [--tokenizer llama3|gpt2] [--vocab 8000] \\
        [--core 0] [--no-litdata] [--no-verify] [--dir /tmp/shardstream-bench-packed] \\
        [--baseline PYTHON_DIR]

``--baseline`` adds (a) on another build of shardstream as one more contender, taking turns (the
``python/`` folder of a worktree at an earlier commit with its extension built, as in
``bench_decode.py``); its ratio is this build over that one.

Smoke run (seconds): ``--mb 2 --repeat 1 --batch 4 --seq-len 256``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
# --baseline: the worker imports another build's shardstream (its python/ folder) instead.
BASELINE_ENV = "SHARDSTREAM_BENCH_BASELINE"
sys.path.insert(0, os.environ.get(BASELINE_ENV) or os.path.join(ROOT, "python"))
from _harness import WorkerFailed, pin, print_result, proc_kb, run_worker  # noqa: E402

GEN = "g1"  # bump when the generated corpus changes, so cached ones are not reused
EOS = {"llama3": "<|end_of_text|>", "gpt2": "</s>"}
HF_BATCH = 1000  # documents per datasets batch and per encode_batch call
#: No network, no writes to the user's HF cache by the peers.
PEER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
}


# -- the corpus --------------------------------------------------------------------------------------


def build_corpus(args: argparse.Namespace) -> tuple[list[str], str, str]:
    """(Parquet files, tokenizer.json, EOS token), generated once into ``args.dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import text_corpus

    os.makedirs(args.dir, exist_ok=True)
    docs: list[str] | None = None
    if args.tokenizer == "gpt2":
        tokenizer = text_corpus.GPT2_STYLE
    else:
        tokenizer = os.path.join(args.dir, f"llama3-style-{args.vocab}-{GEN}.json")
        if not os.path.exists(tokenizer):
            docs = text_corpus.documents(400)
            text_corpus.llama3_style_tokenizer(tokenizer + ".tmp", docs, vocab=args.vocab)
            os.replace(tokenizer + ".tmp", tokenizer)
    folder = os.path.join(args.dir, f"corpus-{args.mb}mb-{args.files}f-{args.rows_per_group}r-{GEN}")
    paths = [os.path.join(folder, f"part-{f:03d}.parquet") for f in range(args.files)]
    if not all(os.path.exists(p) for p in paths):
        start = time.perf_counter()
        docs = docs or text_corpus.documents(400)
        rng = random.Random(29)
        out: list[str] = []
        size, target = 0, int(args.mb * 1e6)
        while size < target:
            copy = docs[:]
            rng.shuffle(copy)  # each repetition in another order: no file holds the base twice in a row
            for d in copy:
                out.append(d)
                size += len(d.encode())
                if size >= target:
                    break
        tmp = folder + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for f in range(args.files):
            part = out[f :: args.files]
            table = pa.table({"id": list(range(f, len(out), args.files)), "text": part})
            pq.write_table(
                table, os.path.join(tmp, f"part-{f:03d}.parquet"), row_group_size=args.rows_per_group
            )
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        print(
            f"  wrote {len(out)} documents, {size / 1e6:.1f} MB of text, into {args.files} files under "
            f"{folder} ({time.perf_counter() - start:.1f} s)"
        )
    return paths, tokenizer, EOS[args.tokenizer]


def warm_page_cache(paths: list[str]) -> None:
    """Reads the files once, so that no contender pays for the first read from disk."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


# -- the contenders (each in its own pinned process) ------------------------------------------------


def imports() -> None:
    """Every contender's modules, imported before its clock starts (torch alone takes seconds)."""
    import datasets  # noqa: F401
    import shardstream  # noqa: F401
    import tokenizers  # noqa: F401
    import torch  # noqa: F401

    try:
        import litdata  # noqa: F401
    except ImportError:
        pass


def shardstream_loader(o: dict):
    from shardstream import TextLoader

    return TextLoader(
        o["counts"],
        batch_size=o["batch"],
        seq_len=o["seq_len"],
        threads=1,
        rank=0,
        world_size=1,
        pin_memory=False,
    )


def hf_batches(o: dict):
    """HF datasets streaming + tokenizers batched encode + Python packing into [B, L] rows: the
    dataset and tokenizer made now, the batches by the returned generator."""
    import torch
    from datasets import load_dataset
    from tokenizers import Tokenizer

    ds = load_dataset("parquet", data_files=o["files"], split="train", streaming=True)
    tok = Tokenizer.from_file(o["tokenizer"])
    eos = tok.token_to_id(o["eos"])
    B, L = o["batch"], o["seq_len"]
    n = B * L

    def batches():
        buf: list[int] = []
        for batch in ds.iter(batch_size=HF_BATCH):
            for enc in tok.encode_batch(batch["text"], add_special_tokens=False):
                buf.extend(enc.ids)
                buf.append(eos)
            at = 0
            while len(buf) - at >= n:
                yield torch.tensor(buf[at : at + n], dtype=torch.int64).view(B, L)
                at += n
            del buf[:at]  # once per datasets batch: the tail carries over, no O(n^2) front deletes

    return batches()


def litdata_batches(o: dict):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(
        o["litdata_dir"],
        item_loader=TokensLoader(block_size=o["seq_len"] + 1),
        shuffle=False,
        cache_dir=o["litdata_dir"] + "-cache",
    )
    return StreamingDataLoader(ds, batch_size=o["batch"], num_workers=0)


def timed(make, o: dict) -> dict:
    """Builds the contender (its modules already imported) and reads one epoch: tokens handed
    over, seconds (construction included; ``setup_seconds`` of them), CPU seconds, peak RSS."""
    imports()
    start, cpu = time.perf_counter(), time.process_time()
    it = iter(make(o))
    setup = time.perf_counter() - start
    tokens = batches = 0
    for batch in it:
        ids = batch.input_ids if hasattr(batch, "input_ids") else batch
        tokens += ids.numel()
        batches += 1
    return {
        "tokens": tokens,
        "batches": batches,
        "seconds": time.perf_counter() - start,
        "setup_seconds": setup,
        "cpu_seconds": time.process_time() - cpu,
        "peak_mb": proc_kb("VmHWM") / 1024,
    }


def worker_count(o: dict) -> dict:
    from shardstream import count_tokens

    imports()
    start = time.perf_counter()
    counts = count_tokens(
        o["files"], tokenizer=o["tokenizer"], eos_token=o["eos"], threads=1, output=o["counts"]
    )
    return {
        "seconds": time.perf_counter() - start,
        "tokens": counts.total_tokens,
        "documents": counts.documents,
        "units": len(counts.units),
        "peak_mb": proc_kb("VmHWM") / 1024,
    }


def _tokenize_file(path: str):
    """LitData's conversion function (litgpt's prepare scripts do the same): every document of a
    Parquet file as int32 token ids with the EOS, one item each."""
    import pyarrow.parquet as pq
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.environ["BENCH_TOKENIZER"])
    eos = tok.token_to_id(os.environ["BENCH_EOS"])
    f = pq.ParquetFile(path)
    for g in range(f.num_row_groups):
        texts = f.read_row_group(g, columns=["text"]).column("text").to_pylist()
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            yield torch.tensor(enc.ids + [eos], dtype=torch.int32)


def worker_litdata_convert(o: dict) -> dict:
    from litdata import TokensLoader, optimize

    out = o["litdata_dir"]
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out + "-cache", ignore_errors=True)
    os.environ["BENCH_TOKENIZER"], os.environ["BENCH_EOS"] = o["tokenizer"], o["eos"]
    imports()
    start = time.perf_counter()
    optimize(
        fn=_tokenize_file,
        inputs=o["files"],
        output_dir=out,
        chunk_bytes="64MB",
        item_loader=TokensLoader(),
        num_workers=1,
        verbose=False,
    )
    seconds = time.perf_counter() - start
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    return {
        "seconds": seconds,
        "tokens": sum(int(c["dim"]) for c in index["chunks"]),
        "chunks": len(index["chunks"]),
        "bytes": sum(os.path.getsize(os.path.join(out, c["filename"])) for c in index["chunks"]),
    }


def worker_verify(o: dict) -> dict:
    """The multisets of tokens (a) and (b) read in an epoch, as histograms over the vocabulary."""
    import numpy as np
    from shardstream import TokenCounts
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(o["tokenizer"]).get_vocab_size(with_added_tokens=True)
    loader = shardstream_loader(o)
    mine = np.zeros(vocab, dtype=np.int64)
    mine_batches = 0
    for batch in loader:
        mine += np.bincount(batch.input_ids.numpy().ravel(), minlength=vocab)
        mine_batches += 1
    remainder = int(loader.stats["remainder_tokens"])
    # HF's whole stream (every document and its EOS), then the rows its packing yields.
    from datasets import load_dataset

    ds = load_dataset("parquet", data_files=o["files"], split="train", streaming=True)
    tok = Tokenizer.from_file(o["tokenizer"])
    eos = tok.token_to_id(o["eos"])
    stream = np.zeros(vocab, dtype=np.int64)
    for batch in ds.iter(batch_size=HF_BATCH):
        for enc in tok.encode_batch(batch["text"], add_special_tokens=False):
            stream += np.bincount(np.asarray(enc.ids + [eos], dtype=np.int64), minlength=vocab)
    rows = np.zeros(vocab, dtype=np.int64)
    hf_batches_n = 0
    for b in hf_batches(o):
        rows += np.bincount(b.numpy().ravel(), minlength=vocab)
        hf_batches_n += 1
    total = TokenCounts.load(o["counts"]).total_tokens
    return {
        "total": total,
        "hf_stream": int(stream.sum()),
        "shardstream_subset": bool((mine <= stream).all()),
        "shardstream_short": int((stream - mine).sum()),
        "remainder": remainder,
        "hf_rows_subset": bool((rows <= stream).all()),
        "batches": [mine_batches, hf_batches_n],
    }


WORKERS = {
    "shardstream": lambda o: timed(shardstream_loader, o),
    "hf": lambda o: timed(hf_batches, o),
    "litdata": lambda o: timed(litdata_batches, o),
    "count": worker_count,
    "litdata_convert": worker_litdata_convert,
    "verify": worker_verify,
}


def worker_main() -> None:
    name = sys.argv[2]
    o = {
        k.removeprefix("--").replace("-", "_"): v for k, v in zip(sys.argv[3::2], sys.argv[4::2], strict=True)
    }
    o = {k: json.loads(v) if k in ("files", "batch", "seq_len") else v for k, v in o.items()}
    if "cpus" in o:
        pin(o.pop("cpus"))
    print_result(WORKERS[name](o))


# -- the run -----------------------------------------------------------------------------------------


def spread(xs: list[float], fmt: str = "{:,.0f}") -> str:
    return " / ".join(fmt.format(x) for x in (min(xs), statistics.median(xs), max(xs)))


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        worker_main()
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=50, help="megabytes of text in the corpus")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rows-per-group", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8, help="rows per batch (B)")
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per row (L)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokenizer", choices=("llama3", "gpt2"), default="llama3")
    ap.add_argument("--vocab", type=int, default=8000, help="vocabulary of the Llama-3-style tokenizer")
    ap.add_argument("--core", type=int, default=0, help="the core every contender is pinned to")
    ap.add_argument("--no-litdata", action="store_true")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--baseline", help="python/ folder of another shardstream build, run beside")
    ap.add_argument("--dir", default="/tmp/shardstream-bench-packed", help="cache of corpus and tokenizer")
    args = ap.parse_args()
    if args.mb:
        args.mb = int(args.mb) if float(args.mb).is_integer() else args.mb

    files, tokenizer, eos = build_corpus(args)
    cpus = json.dumps([args.core])
    counts = os.path.join(
        args.dir, f"counts-{os.path.basename(os.path.dirname(files[0]))}-{args.tokenizer}.json"
    )
    opts = {
        "files": files,
        "tokenizer": tokenizer,
        "eos": eos,
        "counts": counts,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "litdata_dir": os.path.join(args.dir, f"litdata-{os.getpid()}"),
    }
    text_mb = sum(os.path.getsize(f) for f in files) / 1e6
    print(
        f"corpus: {len(files)} Parquet files ({text_mb:.1f} MB on disk), tokenizer "
        f"{os.path.basename(tokenizer)} ({args.tokenizer}-style, EOS {eos}), B={args.batch}, "
        f"L={args.seq_len}, one core (cpu {args.core}) per contender"
    )
    warm_page_cache(files)
    c = run_worker(__file__, "count", {**opts, "cpus": cpus})
    print(
        f"count_tokens (one-off, one thread, one core): {c['seconds']:.2f} s, {c['tokens']:,} tokens in "
        f"{c['documents']:,} documents, {c['units']} row groups: {c['tokens'] / c['seconds']:,.0f} tokens/s; "
        f"peak RSS {c['peak_mb']:.0f} MB"
    )
    if not args.no_verify:
        v = run_worker(__file__, "verify", opts, env=PEER_ENV)
        ok = (
            v["hf_stream"] == v["total"]
            and v["shardstream_subset"]
            and v["shardstream_short"] == v["remainder"]
            and v["hf_rows_subset"]
            and v["batches"][0] == v["batches"][1]
        )
        print(
            f"verify: HF stream {v['hf_stream']:,} tokens, counts {v['total']:,}; shardstream's rows a "
            f"sub-multiset short by {v['shardstream_short']:,} = its remainder {v['remainder']:,}: "
            f"{v['shardstream_subset'] and v['shardstream_short'] == v['remainder']}; batches "
            f"shardstream {v['batches'][0]}, HF {v['batches'][1]} -> {'same tokens' if ok else 'MISMATCH'}"
        )
        if not ok:
            print("the contenders do not read the same tokens: not timing them", file=sys.stderr)
            return 1

    contenders = ["shardstream", "hf"]
    # contender -> (worker, extra environment)
    workers = {"shardstream": ("shardstream", {}), "hf": ("hf", {}), "litdata": ("litdata", {})}
    if args.baseline:
        contenders.append("baseline")
        workers["baseline"] = ("shardstream", {BASELINE_ENV: os.path.abspath(args.baseline)})
    if args.no_litdata:
        print("litdata: skipped (--no-litdata)")
    else:
        try:
            import litdata  # noqa: F401
        except ImportError:
            print("litdata: skipped: not installed; pip install -r requirements/bench.txt")
        else:
            try:
                lc = run_worker(__file__, "litdata_convert", {**opts, "cpus": cpus}, env=PEER_ENV)
            except WorkerFailed as e:
                print(f"litdata: conversion failed, skipped: {str(e)[-800:]}")
            else:
                contenders.append("litdata")
                print(
                    f"litdata optimize (conversion, one worker, one core): {lc['seconds']:.2f} s, "
                    f"{lc['tokens']:,} tokens in {lc['chunks']} chunks ({lc['bytes'] / 1e6:.1f} MB); "
                    f"same total as the counts: {lc['tokens'] == c['tokens']}"
                )

    results: dict[str, list[dict]] = {name: [] for name in contenders}
    try:
        for r in range(args.repeat):
            order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
            for name in order:
                worker, extra = workers[name]
                env = {**PEER_ENV, **extra}
                results[name].append(run_worker(__file__, worker, {**opts, "cpus": cpus}, env=env))
            line = ", ".join(
                f"{n} {results[n][-1]['tokens'] / results[n][-1]['seconds']:,.0f}" for n in contenders
            )
            print(f"  repeat {r}: tokens/s {line}")
    finally:
        shutil.rmtree(opts["litdata_dir"], ignore_errors=True)
        shutil.rmtree(opts["litdata_dir"] + "-cache", ignore_errors=True)

    rate = {n: [x["tokens"] / x["seconds"] for x in results[n]] for n in contenders}
    print(
        f"\nread + tokenize + pack, one core, {args.repeat} repeats (min / median / max); "
        "ratio = shardstream / peer within each repeat"
    )
    print(
        f"  {'contender':12} {'tokens/s per core':>34} {'of it setup s':>14} {'tokens/epoch':>13} "
        f"{'peak RSS MB':>12} {'ratio':>22}"
    )
    for n in contenders:
        ratio = (
            "-"
            if n == "shardstream"
            else spread([a / b for a, b in zip(rate["shardstream"], rate[n], strict=True)], "{:.2f}x")
        )
        setup = statistics.median(x["setup_seconds"] for x in results[n])
        print(
            f"  {n:12} {spread(rate[n]):>34} {setup:>14.3f} "
            f"{results[n][0]['tokens']:>13,} "
            f"{max(x['peak_mb'] for x in results[n]):>12.0f} {ratio:>22}"
        )
    # From raw Parquet to one epoch of rows: what a first run pays, one-off passes included.
    first = {"shardstream": c["seconds"], "hf": 0.0, "baseline": c["seconds"]}
    if "litdata" in contenders:
        first["litdata"] = lc["seconds"]
    print(
        "first epoch from raw Parquet, one core, one-off pass + median epoch: "
        + ", ".join(
            f"{n} {first[n]:.2f} + {statistics.median(x['seconds'] for x in results[n]):.2f} s"
            for n in contenders
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
