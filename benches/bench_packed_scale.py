"""Start-up and memory of the packed text kind at scale (issue 29), each figure in a fresh process.

Part a, start-up over 100,000 Parquet files. A synthetic ``TokenCounts`` of --units units (one row
group of 1,000 documents per file, as ``count_tokens`` writes them: url, display, first_row, rows,
identity, documents, tokens, skipped, examples; the files need not exist to plan) and one of a
tenth as many units; for each, in --repeat fresh processes (medians), one rank of --world:

  load           ``TokenCounts.load(path)``
  TextLoader     ``TextLoader(counts, batch_size=8, seq_len=2048, rank=0, world_size=W)``
  of it: expand  the time the constructor spends in ``expand_urls(every unit's URL,
                 check="none")`` + ``source_config`` (to build the source config), clocked by
                 wrapping those two functions
  len()          ``len(loader)`` (``packed_plan_counts`` through the loader, with the counts' total
                 summed over the units on every call)
  plan_counts    ``shardstream._core.packed_plan_counts`` alone
  reader plan    ``_core.PackedLoader(...)`` built and closed at once: the rank's share planned
                 (what ``iter(loader)`` does first)
  state_dict     ``loader.state_dict()`` (hashes every unit for the counts' identity)
  RSS added      peak RSS (VmHWM) over the process's RSS after its imports, and per unit

Part b, a rank's memory bounded by configuration: one ``TextLoader`` pass (B=8, L=2048, threads=2,
default prefetch and block_rows, one rank) over a 10 MB Parquet text file and over a --big-mb
(default 2048) file with row groups of --row-group-mb of text, each holding one --long-doc-mb
(default 50) MB document, all counted with max_document_bytes=64 MiB; each pass (and each
``count_tokens``) in a fresh process, its peak RSS over its RSS after the imports. The files are
real text (tests/text_corpus.documents(), repeated) with the GPT-2-style tokenizer fixture, written
once into --dir and reused.

    python benches/bench_packed_scale.py [--units 100000] [--world 64] [--repeat 3] \\
        [--big-mb 2048] [--row-group-mb 256] [--long-doc-mb 50] [--part a|b|all] \\
        [--dir /tmp/shardstream-bench-packed-scale]

Smoke run (a minute): ``--units 10000 --repeat 1 --big-mb 40 --row-group-mb 16 --long-doc-mb 4``.
Part b at the defaults tokenizes 2 GB twice (count and pass) on two threads: expect tens of
minutes on a 2-core machine. Memory: encoding one document took about 170 MB of peak RSS per MB
of text here (4 MB: 677 MB, 8.4 s; 1 MB: 190 MB, 1.2 s; ``_core.packed_encode`` alone), so 50 MB
documents on two threads may need well over 10 GB; ``--long-doc-mb 0`` separates the row groups'
share from the long documents'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "python"))
from _harness import proc_kb, reset_peak, run_worker  # noqa: E402

GEN = "g1"  # bump when the generated files change, so cached ones are not reused
TOKENIZER = os.path.join(ROOT, "tests", "data", "tokenizers", "captions-bpe.json")  # GPT-2 style, </s>
MAX_DOCUMENT_BYTES = 64 << 20
SMALL_MB = 10
TIMEOUT = 7200


def rss_base() -> int:
    """Resets the peak to the current RSS; returns the current RSS in bytes."""
    reset_peak()
    return proc_kb("VmRSS") * 1024


def peak_over(base: int) -> int:
    return proc_kb("VmHWM") * 1024 - base


# -- part a: start-up over many files ----------------------------------------------------------------


def write_counts(path: str, units: int) -> None:
    """What ``count_tokens`` would write for ``units`` single-row-group files, written directly."""
    if os.path.exists(path):
        return
    from shardstream import TokenCounts, _core

    fingerprint, _, _ = _core.packed_encoder(TOKENIZER, None, None)
    folder = "/data/fineweb/CC-MAIN-2024-10"
    rows = []
    for i in range(units):
        url = f"{folder}/part-{i:06d}.parquet"
        rows.append(
            {
                "url": url,
                "first_row": 0,
                "rows": 1000,
                "identity": f"size:{200_000_000 + (i * 7919) % 1_000_000}",
                "documents": 1000,
                "tokens": 1_000_000 + (i * 104_729) % 400_000,
                "skipped": {},
                "display": url,
                "examples": [],
            }
        )
    counts = TokenCounts(TOKENIZER, fingerprint, "text", None, None, MAX_DOCUMENT_BYTES, rows, [])
    counts.save(path + ".tmp.json")
    os.replace(path + ".tmp.json", path)


def worker_startup(o: dict) -> dict:
    import numpy as np  # noqa: F401
    import shardstream.urls as urls_module
    import torch  # noqa: F401  (the loader's own import of torch is not start-up's memory)
    from shardstream import TextLoader, TokenCounts, _core

    world = int(o["world"])
    # Time spent inside the URL expansion the constructor runs (it imports these names from
    # shardstream.urls at call time, so wrapping the module's attributes catches exactly its calls).
    spent = {"expand": 0.0}

    def clocked(fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent["expand"] += time.perf_counter() - t

        return wrapper

    urls_module.expand_urls = clocked(urls_module.expand_urls)
    urls_module.source_config = clocked(urls_module.source_config)
    base = rss_base()
    t = time.perf_counter()
    counts = TokenCounts.load(o["counts"])
    load_s = time.perf_counter() - t
    load_mb = peak_over(base) / 2**20
    t = time.perf_counter()
    loader = TextLoader(counts, batch_size=8, seq_len=2048, rank=0, world_size=world, pin_memory=False)
    construct_s = time.perf_counter() - t
    expand_s = spent["expand"]
    t = time.perf_counter()
    batches = len(loader)
    len_s = time.perf_counter() - t
    total = counts.total_tokens
    t = time.perf_counter()
    _core.packed_plan_counts(total, 0, 0, [], (world, 0, 8, 2048, 256))
    plan_counts_s = time.perf_counter() - t
    t = time.perf_counter()
    core = _core.PackedLoader(
        loader._units,
        loader._tokens,
        loader.seed,
        loader.epoch,
        [],
        loader._shape(),
        0,
        0,
        dict(loader._config, threads=1),
    )
    reader_s = time.perf_counter() - t
    core.close()
    t = time.perf_counter()
    state = loader.state_dict()
    state_s = time.perf_counter() - t
    startup_mb = peak_over(base) / 2**20
    return {
        "units": len(counts.units),
        "batches": batches,
        "load_s": load_s,
        "construct_s": construct_s,
        "expand_s": expand_s,
        "len_s": len_s,
        "plan_counts_s": plan_counts_s,
        "reader_s": reader_s,
        "state_s": state_s,
        "state_bytes": len(json.dumps(state)),
        "load_mb": load_mb,
        "startup_mb": startup_mb,
        "counts_bytes": os.path.getsize(o["counts"]),
    }


def part_a(args: argparse.Namespace) -> None:
    sizes = [max(1, args.units // 10), args.units]
    rows = []
    for n in sizes:
        path = os.path.join(args.dir, f"counts-{n}-{GEN}.json")
        write_counts(path, n)
        runs = [
            run_worker(__file__, "startup", {"counts": path, "world": args.world}, timeout=TIMEOUT)
            for _ in range(args.repeat)
        ]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append(med)
    print(
        f"part a: one rank of {args.world} starting over N single-row-group Parquet files (synthetic "
        f"TokenCounts, files absent), B=8, L=2048; medians of {args.repeat} fresh processes"
    )
    names = [
        ("counts file MB", lambda r: f"{r['counts_bytes'] / 1e6:.1f}"),
        ("TokenCounts.load", lambda r: fmt_s(r["load_s"])),
        ("TextLoader(...)", lambda r: fmt_s(r["construct_s"])),
        (
            "  of it expand_urls",
            lambda r: f"{fmt_s(r['expand_s'])} ({100 * r['expand_s'] / r['construct_s']:.0f} %)",
        ),
        ("len()", lambda r: fmt_s(r["len_s"])),
        ("packed_plan_counts", lambda r: fmt_s(r["plan_counts_s"])),
        ("reader plan", lambda r: fmt_s(r["reader_s"])),
        ("state_dict()", lambda r: fmt_s(r["state_s"])),
        ("load+TextLoader+len", lambda r: fmt_s(r["load_s"] + r["construct_s"] + r["len_s"])),
        ("  files/s", lambda r: f"{r['units'] / (r['load_s'] + r['construct_s'] + r['len_s']):,.0f}"),
        ("RSS added, load MB", lambda r: f"{r['load_mb']:.1f}"),
        ("RSS added, all MB", lambda r: f"{r['startup_mb']:.1f}"),
        ("  per unit", lambda r: f"{r['startup_mb'] * 2**20 / r['units']:.0f} B"),
    ]
    small, big = rows
    head = f"  {'':22} {int(small['units']):>16,} {int(big['units']):>16,} {'ratio':>8}"
    print(head)
    keys = {
        "TokenCounts.load": "load_s",
        "TextLoader(...)": "construct_s",
        "  of it expand_urls": "expand_s",
        "len()": "len_s",
        "packed_plan_counts": "plan_counts_s",
        "reader plan": "reader_s",
        "state_dict()": "state_s",
        "RSS added, all MB": "startup_mb",
        "counts file MB": "counts_bytes",
    }
    for name, f in names:
        k = keys.get(name)
        ratio = f"{big[k] / small[k]:.1f}x" if k and small[k] > 0 else ""
        print(f"  {name:22} {f(small):>16} {f(big):>16} {ratio:>8}")
    print(
        f"  (units x{big['units'] / small['units']:.0f}: a ratio near that is O(units); the expand share is "
        "the constructor's time inside its re-expansion of every URL)"
    )


def fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


# -- part b: a rank's memory on a small and a huge file ----------------------------------------------


def write_text_file(path: str, mb: float, row_group_mb: float, long_doc_mb: float) -> None:
    """A Parquet file (``id``, ``text``) of ``mb`` MB of real text in row groups of about
    ``row_group_mb`` MB, each starting with one document of ``long_doc_mb`` MB (none when 0)."""
    if os.path.exists(path):
        return
    import pyarrow as pa
    import pyarrow.parquet as pq
    import text_corpus

    start = time.perf_counter()
    docs = text_corpus.documents(400)
    long_doc = ""
    if long_doc_mb:
        parts, size, i = [], 0, 0
        while size < long_doc_mb * 1e6:
            parts.append(docs[i % len(docs)])
            size += len(parts[-1].encode())
            i += 1
        long_doc = "\n".join(parts)
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    tmp = path + ".tmp"
    written, next_id, d = 0, 0, 0
    with pq.ParquetWriter(tmp, schema) as writer:
        while written < mb * 1e6:
            group: list[str] = [long_doc] if long_doc else []
            size = len(long_doc.encode())
            while size < row_group_mb * 1e6 and written + size < mb * 1e6:
                group.append(docs[d % len(docs)])
                size += len(group[-1].encode())
                d += 1
            table = pa.table({"id": list(range(next_id, next_id + len(group))), "text": group}, schema=schema)
            writer.write_table(table, row_group_size=len(group))
            next_id += len(group)
            written += size
    os.replace(tmp, path)
    print(
        f"  wrote {path}: {written / 1e6:.0f} MB of text, {next_id} documents, "
        f"{os.path.getsize(path) / 1e6:.0f} MB on disk ({time.perf_counter() - start:.0f} s)"
    )


def worker_count(o: dict) -> dict:
    import torch  # noqa: F401
    from shardstream import count_tokens

    base = rss_base()
    t = time.perf_counter()
    counts = count_tokens(
        o["file"], tokenizer=TOKENIZER, max_document_bytes=MAX_DOCUMENT_BYTES, threads=2, output=o["counts"]
    )
    return {
        "seconds": time.perf_counter() - t,
        "tokens": counts.total_tokens,
        "units": len(counts.units),
        "skipped": counts.skipped,
        "peak_mb": peak_over(base) / 2**20,
    }


def worker_pass(o: dict) -> dict:
    import torch  # noqa: F401
    from shardstream import TextLoader

    base = rss_base()
    t = time.perf_counter()
    loader = TextLoader(
        o["counts"], batch_size=8, seq_len=2048, threads=2, rank=0, world_size=1, pin_memory=False
    )
    tokens = sum(b.input_ids.numel() for b in loader)
    return {
        "seconds": time.perf_counter() - t,
        "tokens": tokens,
        "skipped": loader.stats.get("skipped", {}),
        "peak_mb": peak_over(base) / 2**20,
        "base_mb": base / 2**20,
    }


def part_b(args: argparse.Namespace) -> None:
    cases = [
        (f"{SMALL_MB} MB", os.path.join(args.dir, f"text-{SMALL_MB}mb-{GEN}.parquet"), SMALL_MB, 2, 0),
        (
            f"{args.big_mb:g} MB",
            os.path.join(
                args.dir,
                f"text-{args.big_mb:g}mb-{args.row_group_mb:g}rg-{args.long_doc_mb:g}long-{GEN}.parquet",
            ),
            args.big_mb,
            args.row_group_mb,
            args.long_doc_mb,
        ),
    ]
    print(
        "part b: one TextLoader pass (B=8, L=2048, threads=2, one rank), each step in a fresh process; "
        "peak RSS over the process's RSS after its imports"
    )
    print(
        f"  {'file':10} {'row groups':>10} {'tokens':>14} {'count s':>9} {'count MB':>9} "
        f"{'pass s':>9} {'pass MB':>9}"
    )
    peaks = []
    for name, path, mb, rg, long_mb in cases:
        write_text_file(path, mb, rg, long_mb)
        counts = path + ".tokens.json"
        c = run_worker(__file__, "count", {"file": path, "counts": counts}, timeout=TIMEOUT)
        p = run_worker(__file__, "pass", {"counts": counts}, timeout=TIMEOUT)
        peaks.append(p["peak_mb"])
        print(
            f"  {name:10} {c['units']:>10} {c['tokens']:>14,} {c['seconds']:>9.1f} {c['peak_mb']:>9.0f} "
            f"{p['seconds']:>9.1f} {p['peak_mb']:>9.0f}"
            + (f"  skipped {c['skipped']}" if c["skipped"] else "")
        )
    print(f"  pass peak RSS, big / small: {peaks[1] / max(peaks[0], 1e-9):.2f}x")


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        o = dict(zip((k.removeprefix("--") for k in sys.argv[3::2]), sys.argv[4::2], strict=True))
        worker = {"startup": worker_startup, "count": worker_count, "pass": worker_pass}[sys.argv[2]]
        print(json.dumps(worker(o)), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=100_000, help="files (one row group each) in part a")
    ap.add_argument("--world", type=int, default=64, help="ranks in part a")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per part a case")
    ap.add_argument("--big-mb", type=float, default=2048, help="text in part b's big file, MB")
    ap.add_argument("--row-group-mb", type=float, default=256, help="text per row group of the big file, MB")
    ap.add_argument("--long-doc-mb", type=float, default=50, help="one document this long per big row group")
    ap.add_argument("--part", choices=("a", "b", "all"), default="all")
    ap.add_argument("--dir", default="/tmp/shardstream-bench-packed-scale", help="cache of generated files")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if args.part in ("a", "all"):
        part_a(args)
    if args.part in ("b", "all"):
        part_b(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
