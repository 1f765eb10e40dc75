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
  reader plan    ``_core.packed_pipeline(...)`` built and closed at once: the rank's share planned
                 (what ``iter(loader)`` does first)
  state_dict     ``loader.state_dict()`` (hashes every unit for the counts' identity)
  RSS added      peak RSS (VmHWM) over the process's RSS after its imports, and per unit

Part b, a rank's memory bounded by configuration (a peak RSS a few MB apart for a 10 MB and a 2 GB
file): one ``TextLoader`` pass (B=8, L=2048, threads=2, default prefetch and block_rows, one rank,
max_document_bytes=64 MiB) and the ``count_tokens`` before it, each in a fresh process, its peak
RSS over its RSS after the imports, for each format:

  parquet  a 10 MB and a --big-mb (default 2048) MB file, both in row groups of --row-group-mb
           (default 2) MB of text, so that only the file's size differs; --long-doc-mb puts one
           document that long at the start of each of the big file's row groups (the reader holds
           a row group's column chunk and a document whole: both are the data's, bounded by
           max_document_bytes for a document)
  jsonl    a 10 MB and a --big-mb MB file (one unit each, read line by line), and the 10 MB file
           with one line of --long-line-mb (default --big-mb) MB in its middle: over the cap, it
           must be skipped (member_too_large), held only up to the cap

The files are real text (tests/text_corpus.documents(), repeated) with the GPT-2-style tokenizer
fixture, written once into --dir and reused (delete it after: the defaults write about 5 GB).

    python benches/bench_packed_scale.py [--units 100000] [--world 64] [--repeat 3] \\
        [--big-mb 2048] [--row-group-mb 2] [--long-doc-mb 0] [--long-line-mb 0] \\
        [--formats parquet,jsonl] [--part a|b|all] [--dir /tmp/shardstream-bench-packed-scale]

Smoke run (two minutes): ``--units 10000 --repeat 1 --big-mb 40 --long-line-mb 100``. Part b at
the defaults tokenizes 2 GB four times (count and pass, Parquet and JSONL): about a quarter of an
hour on a 2-core machine. Long documents are encoded in windows of about 64 KB
(``tokenize::windows``), so their share of the peak is their text, not the ``tokenizers``
library's ~170 bytes per byte.
"""

from __future__ import annotations

import argparse
import json
import math
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
    core = _core.packed_pipeline(
        loader._units,
        loader._tokens,
        loader._reader(0),
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


def _filler(mb: float) -> list[str]:
    """Real text documents (tests/text_corpus.documents()) repeated to ``mb`` MB: a generator
    would be shorter, but a file's whole text is what the reader is made to hold or not."""
    import text_corpus

    docs = text_corpus.documents(400)
    out, size, d = [], 0, 0
    while size < mb * 1e6:
        out.append(docs[d % len(docs)])
        size += len(out[-1].encode())
        d += 1
    return out


def write_parquet_file(path: str, mb: float, row_group_mb: float, long_doc_mb: float) -> None:
    """A Parquet file (``id``, ``text``) of ``mb`` MB of real text in row groups of about
    ``row_group_mb`` MB, each starting with one document of ``long_doc_mb`` MB (none when 0)."""
    if os.path.exists(path):
        return
    import pyarrow as pa
    import pyarrow.parquet as pq
    import text_corpus

    start = time.perf_counter()
    docs = text_corpus.documents(400)
    long_doc = "\n".join(_filler(long_doc_mb)) if long_doc_mb else ""
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


def write_jsonl_file(path: str, mb: float, long_line_mb: float) -> None:
    """A JSONL file (``{"id": i, "text": ...}`` per line) of ``mb`` MB of real text; with
    ``long_line_mb``, one more line of that many MB in its middle (over max_document_bytes: the
    reader must skip it as ``member_too_large`` without holding it)."""
    if os.path.exists(path):
        return
    import text_corpus

    start = time.perf_counter()
    docs = text_corpus.documents(400)
    tmp = path + ".tmp"
    written, lines, d = 0, 0, 0
    with open(tmp, "w", encoding="utf-8") as f:
        while written < mb * 1e6:
            f.write(json.dumps({"id": d, "text": docs[d % len(docs)]}, ensure_ascii=False) + "\n")
            written += len(docs[d % len(docs)].encode())
            d += 1
            lines += 1
            if long_line_mb and written >= mb * 1e6 / 2:
                # whole escaped documents (never half an escape), about 1 MB per write
                block = ""
                for doc in docs:
                    block += json.dumps(doc, ensure_ascii=False)[1:-1]
                    if len(block) >= 1 << 20:
                        break
                f.write('{"id": -1, "text": "')
                for _ in range(math.ceil(long_line_mb * 1e6 / len(block.encode()))):
                    f.write(block)
                f.write('"}\n')
                lines += 1
                long_line_mb = 0
    os.replace(tmp, path)
    print(
        f"  wrote {path}: {written / 1e6:.0f} MB of text in {lines} lines, "
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
    big, rg, long_doc = f"{args.big_mb:g}", f"{args.row_group_mb:g}", f"{args.long_doc_mb:g}"
    line = f"{args.long_line_mb or args.big_mb:g}"
    # (format, label, file, writer): each big file is compared with the small one of its format,
    # written the same way (the same row groups), so only the file's size differs.
    cases = {
        "parquet": [
            (
                f"{SMALL_MB} MB",
                os.path.join(args.dir, f"text-{SMALL_MB}mb-{rg}rg-{GEN}.parquet"),
                lambda p: write_parquet_file(p, SMALL_MB, args.row_group_mb, 0),
            ),
            (
                f"{big} MB",
                os.path.join(args.dir, f"text-{big}mb-{rg}rg-{long_doc}long-{GEN}.parquet"),
                lambda p: write_parquet_file(p, args.big_mb, args.row_group_mb, args.long_doc_mb),
            ),
        ],
        "jsonl": [
            (
                f"{SMALL_MB} MB",
                os.path.join(args.dir, f"text-{SMALL_MB}mb-{GEN}.jsonl"),
                lambda p: write_jsonl_file(p, SMALL_MB, 0),
            ),
            (
                f"{line} MB line",
                os.path.join(args.dir, f"text-{SMALL_MB}mb-{line}mbline-{GEN}.jsonl"),
                lambda p: write_jsonl_file(p, SMALL_MB, float(line)),
            ),
            (
                f"{big} MB",
                os.path.join(args.dir, f"text-{big}mb-{GEN}.jsonl"),
                lambda p: write_jsonl_file(p, args.big_mb, 0),
            ),
        ],
    }
    print(
        "part b: one TextLoader pass (B=8, L=2048, threads=2, one rank, max_document_bytes=64 MiB), "
        "each step in a fresh process; peak RSS over the process's RSS after its imports"
    )
    if "parquet" in args.formats:
        print(
            f"  Parquet: row groups of {rg} MB of text in both files"
            + (f", each of the big file's with one {long_doc} MB document" if args.long_doc_mb else "")
        )
    print(
        f"  {'format':8} {'file':16} {'units':>6} {'tokens':>14} {'count s':>9} {'count MB':>9} "
        f"{'pass s':>9} {'pass MB':>9}"
    )
    for fmt in args.formats.split(","):
        peaks = []
        for name, path, write in cases[fmt]:
            write(path)
            counts = path + ".tokens.json"
            c = run_worker(__file__, "count", {"file": path, "counts": counts}, timeout=TIMEOUT)
            p = run_worker(__file__, "pass", {"counts": counts}, timeout=TIMEOUT)
            peaks.append((name, p["peak_mb"], c["peak_mb"]))
            print(
                f"  {fmt:8} {name:16} {c['units']:>6} {c['tokens']:>14,} {c['seconds']:>9.1f} "
                f"{c['peak_mb']:>9.0f} {p['seconds']:>9.1f} {p['peak_mb']:>9.0f}"
                + (f"  skipped {c['skipped']}" if c["skipped"] else ""),
                flush=True,
            )
        (small, small_pass, small_count), *others = peaks
        for name, pass_mb, count_mb in others:
            print(
                f"  {fmt} {name} / {small}: pass peak RSS {pass_mb / max(small_pass, 1e-9):.2f}x, "
                f"count peak RSS {count_mb / max(small_count, 1e-9):.2f}x",
                flush=True,
            )


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
    ap.add_argument(
        "--row-group-mb", type=float, default=2, help="text per Parquet row group, MB (both files)"
    )
    ap.add_argument(
        "--long-doc-mb", type=float, default=0, help="one document this long per row group of the big Parquet"
    )
    ap.add_argument(
        "--long-line-mb",
        type=float,
        default=0,
        help="the JSONL line over max_document_bytes, MB; 0: --big-mb",
    )
    ap.add_argument("--formats", default="parquet,jsonl", help="part b's formats: parquet, jsonl or both")
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
