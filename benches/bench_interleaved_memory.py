"""A rank's peak memory on the interleaved kind is bounded by configuration, not by file size:
one count and one whole ``InterleavedLoader`` pass (seq_len 4096, 8 rows, 2 threads) over a small
OBELICS-style Parquet file of real documents (tests/interleaved_corpus.real_documents: real
captions, 0-4 JPEGs of real photos each) and over a file of ``--gb`` GB made of the same
documents repeated under new keys, side by side, each in a fresh process.

Printed per file: its size, documents, batches, the process's resident size after its imports
(torch, shardstream) and its peak (VmHWM), and the ratio of the two peaks. What the loader holds
is bounded by its settings (read-ahead chunks, the packing window, the batch buffers) and by the
row group being read, which is read whole: both files have row groups of ``--rows-per-group``
documents, so a file of larger row groups peaks higher, by about a row group.

Run alone on the machine: ``python benches/bench_interleaved_memory.py --gb 2``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")


def write_files(folder: str, gb: float, rows_per_group: int) -> tuple[str, str]:
    """The small file (300 documents) and the large one (the same, repeated to ``gb`` GB)."""
    sys.path.insert(0, TESTS)
    import pyarrow as pa
    import pyarrow.parquet as pq
    from interleaved_corpus import obelics_table, real_documents

    docs = real_documents(300, seed=11)
    table = obelics_table(docs)
    small, large = os.path.join(folder, "small.parquet"), os.path.join(folder, "large.parquet")
    pq.write_table(table, small, row_group_size=rows_per_group)
    key = table.schema.get_field_index("key")
    with pq.ParquetWriter(large, table.schema) as writer:
        copy = 0
        while copy == 0 or os.path.getsize(large) < gb * 1e9:
            keys = pa.array([f"copy{copy}-{d['key']}" for d in docs])
            writer.write_table(table.set_column(key, "key", keys), row_group_size=rows_per_group)
            copy += 1
    return small, large


PASS = """
import sys, time
sys.path.insert(0, {tests!r})
import torch  # a training process has it loaded
from qwen_reference import write_tokenizer_json
from shardstream import InterleavedLoader, count_interleaved


def mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) // 1024


after_imports = mb("VmRSS")
tokenizer = write_tokenizer_json({tokenizer!r})
shape = dict(seq_len=4096, batch_size=8, eos_token="</s>", threads=2)
counts = count_interleaved({path!r}, tokenizer=tokenizer, **shape)
batches = sum(1 for _ in InterleavedLoader(counts, threads=2))
print(counts.documents, batches, after_imports, mb("VmHWM"))
"""


def measure(path: str, tokenizer: str) -> tuple[int, int, int, int]:
    """(documents, batches, MB after imports, peak MB) of one pass in a fresh process."""
    code = PASS.format(tests=TESTS, tokenizer=tokenizer, path=path)
    command = [sys.executable, "-c", code]
    out = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=True)
    documents, batches, base, peak = (int(x) for x in out.stdout.split()[-4:])
    return documents, batches, base, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="size of the large file (GB)")
    parser.add_argument("--rows-per-group", type=int, default=64, help="documents per row group")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        small, large = write_files(folder, args.gb, args.rows_per_group)
        tokenizer = os.path.join(folder, "tokenizer.json")
        peaks = []
        for path in (small, large):
            documents, batches, base, peak = measure(path, tokenizer)
            peaks.append(peak)
            size = os.path.getsize(path) / 1e6
            print(
                f"{os.path.basename(path):14s} {size:9.1f} MB  {documents:6d} documents  "
                f"{batches:5d} batches  after imports {base:5d} MB  peak {peak:5d} MB  (+{peak - base} MB)"
            )
        print(f"peak, large / small: {peaks[1] / peaks[0]:.3f}x")


if __name__ == "__main__":
    main()
