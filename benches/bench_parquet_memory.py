"""Peak memory of counting hostile and oversized Parquet files (issue 52): each file counted by
``count_tokens(path, tokenizer=..., threads=1)`` in a fresh process, peak RSS (VmHWM) over the
same call on a one-row file in that process.

    python benches/bench_parquet_memory.py [--dir /tmp/pq-memory] [--cap BYTES] [--files bomb,big]

- ``bomb``: one row group of one 4 KB document and 48 documents of 48 MiB each (zstd, no
  dictionary): 2.4 GB of text in about 300 KB. Under the default ``max_document_bytes`` (64 MiB)
  every document is read and tokenized; with ``--cap 16777216`` every one is skipped as
  ``member_too_large``.
- ``big``: one row group of 300,000 documents of 4 KB, as ``pq.write_table`` writes a table
  without ``row_group_size``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def real_text() -> bytes:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from text_corpus import documents

    return "\n\n".join(documents(20)).encode()


def repeat_to(text: bytes, size: int) -> str:
    return (text * (size // len(text) + 1))[:size].decode("utf-8", "ignore")


def write(kind: str, path: str) -> str:
    if os.path.exists(path):
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = real_text()
    if kind == "bomb":
        # A 4 KB period: zstd keeps it in its window, so 2.4 GB take about 300 KB.
        big = repeat_to(text[:4096], 48 * MiB)
        docs = [repeat_to(text, 4096), *[big] * 48]
        pq.write_table(pa.table({"text": docs}), path, compression="zstd", use_dictionary=False)
    elif kind == "big":
        docs = [repeat_to(text[(i * 997) % (len(text) - 5000) :], 4096) for i in range(300_000)]
        pq.write_table(pa.table({"text": docs}), path)
    else:
        pq.write_table(pa.table({"text": [repeat_to(text, 4096)]}), path)
    return path


def measure(path: str, base: str, tokenizer: str, cap: int | None) -> dict:
    cap_arg = f", max_document_bytes={cap}" if cap else ""
    script = textwrap.dedent(
        f"""
        import json, time
        from shardstream import count_tokens
        def peak():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmHWM:"))
        count_tokens({base!r}, tokenizer={tokenizer!r}, threads=1{cap_arg})
        before = peak()
        t = time.perf_counter()
        c = count_tokens({path!r}, tokenizer={tokenizer!r}, threads=1{cap_arg})
        print(json.dumps({{"peak_over_baseline_mb": round((peak() - before) / 1e6),
                          "seconds": round(time.perf_counter() - t, 1),
                          "documents": c.documents, "skipped": c.skipped}}))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        return {"error": run.stderr[-2000:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/pq-memory")
    ap.add_argument("--cap", type=int, default=None, help="max_document_bytes (default: the library's)")
    ap.add_argument("--files", default="bomb,big")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from text_corpus import GPT2_STYLE

    base = write("one", os.path.join(args.dir, "one.parquet"))
    for kind in args.files.split(","):
        path = write(kind, os.path.join(args.dir, f"{kind}.parquet"))
        out = measure(path, base, GPT2_STYLE, args.cap)
        print(json.dumps({"file": kind, "bytes": os.path.getsize(path), "cap": args.cap, **out}))


if __name__ == "__main__":
    main()
