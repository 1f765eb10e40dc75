"""Where an interleaved pass spends its work, stage by stage: instructions counted by callgrind
(valgrind), so the figures do not depend on what else the machine runs, and the next speed-up is
chosen from a profile, not a guess (issue 53).

One ``InterleavedLoader`` pass on one thread over the corpus of ``bench_interleaved.py`` (OBELICS-
style Parquet of real documents: real captions, 0-4 JPEGs of real photos of 32-1600 px each),
counted first, outside the profile. The pass runs in a child process under
``valgrind --tool=callgrind``; numpy batches (torch is kept out of the process, so its import is
not in the profile). The stages, by the inclusive instructions of the functions that do them:

  entropy decode   libjpeg-turbo's Huffman decoding and coefficient reading (a progressive
                   JPEG's scans are read whole before its first row: ``jpeg_start_decompress``)
  IDCT             the inverse DCTs (``jsimd_idct_*``, the windowed one)
  colour           YCbCr to RGB planes
  resize           the separable convolution (weights, both passes, transposes)
  patch writing    the patches in ``Qwen2VLImageProcessor``'s order (``write_rows``)
  tokenize         text to ids (the core's BPE or the tokenizers library)
  measure + pack   each image's header and grid, first-fit packing, positions
  other            the rest (reading and decompressing Parquet, the pipeline, the binding)

Shares are of the instructions executed in the extension (the core and the libjpeg-turbo built
into it), each function's own instructions under the stage its name says; the interpreter's start
and imports are left out, and libc's memory functions, which the interpreter calls too, are
listed apart.

    python benches/profile_interleaved.py [--docs 60] [--files 2] [--seq-len 4096] [--batch 8] \\
        [--dir /tmp/shardstream-bench-interleaved]

About a minute on 60 documents (102 images). Needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: (stage, regex over the names of the functions whose own instructions it is), in order: a
#: function counts under the first stage that matches it.
STAGES = [
    (
        "entropy decode",
        r"^(decode_mcu\w*|ss_huff_decode_mcu|ss_decode_mcu|jpeg_fill_bit_buffer|jpeg_huff_decode|"
        r"consume_data|decompress_onepass|decompress_data|process_restart|jzero_far|\w*huff\w*)$",
    ),
    ("IDCT", r"idct"),
    ("colour", r"ycbcr|color_convert|rgb"),
    ("resize", r"shardstream::image::(resize|convolve)::"),
    ("patch writing", r"write_rows|shardstream::batch::interleaved::vision::"),
    ("tokenize", r"shardstream::tokenize::|^tokenizers::|onig"),
    ("measure + pack", r"shardstream::batch::interleaved::(measure|pack|positions)::"),
]
#: The extension's own file: the core and the libjpeg-turbo built into it.
CORE = "_core.abi3.so"

PASS = """
import sys
sys.modules["torch"] = None  # numpy batches: torch's import stays out of the profile
sys.path.insert(0, {python!r})
from shardstream import InterleavedLoader
loader = InterleavedLoader({counts!r}, seed=0, threads=1, pin_memory=False)
batches = sum(1 for _ in loader)
print(batches, loader.stats["documents"], loader.stats["images"], loader.stats["tokens"])
"""


def self_costs(out: str) -> list[tuple[str, str, int]]:
    """(object file, function, own instructions) of every function, from
    ``callgrind_annotate``."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", out],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(.+?) \[(.+)\]$", line)
        if not m:
            continue
        where = m.group(2)
        # "file:function" (a file's path holds no colon) or "???:function" without debug info.
        name = where.split(":", 1)[1] if ":" in where.split("::", 1)[0] else where
        rows.append((m.group(3), re.sub(r"'\d+$", "", name), int(m.group(1).replace(",", ""))))
    return rows


def stage_costs(rows: list[tuple[str, str, int]]) -> tuple[int, list[tuple[str, int]], int]:
    """(the extension's instructions, each stage's, libc's memory functions')."""
    stages = {stage: 0 for stage, _ in STAGES}
    other = total = 0
    for obj, name, cost in rows:
        if not obj.endswith(CORE):
            continue
        total += cost
        stage = next((s for s, pattern in STAGES if re.search(pattern, name)), None)
        if stage is None:
            other += cost
        else:
            stages[stage] += cost
    libc = sum(c for obj, n, c in rows if "libc.so" in obj and re.search(r"mem(set|cpy|move)|malloc|free", n))
    return total, [*stages.items(), ("other (read, buffers, ...)", other)], libc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=60)
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--rows-per-group", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=os.path.join("/tmp", "shardstream-bench-interleaved"))
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import bench_interleaved
    from shardstream import QwenVL, count_interleaved

    files, tokenizer = bench_interleaved.build_corpus(args)
    counts = count_interleaved(
        files,
        tokenizer=tokenizer,
        spec=QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 1280),
        seq_len=args.seq_len,
        batch_size=args.batch,
        eos_token="</s>",
        threads=1,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "counts.json")
        counts.save(path)
        script = PASS.format(python=os.path.join(ROOT, "python"), counts=path)
        out = os.path.join(tmp, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if run.returncode != 0:
            raise SystemExit(f"the profiled pass failed:\n{run.stderr[-3000:]}")
        batches, documents, images, tokens = (int(x) for x in run.stdout.split())
        total, stages, libc = stage_costs(self_costs(out))
    print(
        f"one pass, one thread: {batches} batches of {args.batch} x {args.seq_len}, {documents} documents, "
        f"{images} images, {tokens:,} tokens; the extension's instructions: {total / 1e6:,.0f} M"
    )
    print(f"{'stage':<28} {'M instructions':>15} {'share':>7} {'per image':>12}")
    for stage, cost in stages:
        share = cost / total if total else 0.0
        print(f"{stage:<28} {cost / 1e6:>15,.1f} {share:>7.1%} {cost / max(images, 1) / 1e6:>10.2f} M")
    print(f"apart: libc's memset, memcpy, malloc and free (the interpreter's too): {libc / 1e6:,.1f} M")


if __name__ == "__main__":
    main()
