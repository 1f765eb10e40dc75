"""Per-rank start-up cost of the two index layouts (issue 12), side by side: version 1 (one JSON
document, every rank parses all of it) and the folder layout (every rank loads only
``manifest.bin``; per-sample offsets and keys stay in the detail file until a reader opens a shard).

Synthetic indexes, 10,000 samples per shard, cached under --dir (rebuilt only when missing):

  1e6, 4e6, 16e6 samples    100, 400, 1600 shards with keys, delta offsets (~120 units of 512 B
                            each) and 0.1% invalid samples; v1 JSON, and the folder that
                            ``write_index`` makes of the same index
  12.8e9 samples            1.28 M shards, counts only (as from img2dataset stats: no offsets,
                            no keys, nothing known invalid): the counts-only JSON and its folder.
                            Version 1 with offsets and keys at that scale is the problem itself:
                            not built, its size extrapolated from the largest v1 file measured
  12.8e9 samples, invalid   the same plus 0.1% invalid samples (10 per shard, ordinal + key, as
                            validation records them in the manifest)

For every (case, layout) one fresh process, so RSS is clean, measures one rank (rank 0):

  load                 ``load_index(path)``
  plan + 8 readers     ``plan(W=1024, K=8, B=256, C=1000)`` and rank 0's 8 reader plans
  RSS added            peak RSS (VmHWM) after load + plan, minus the baseline after the imports
  elastic 1024 -> 768  re-plan from the state taken after half the batches, + rank 0's readers;
                       its peak RSS over the baseline (the index stays loaded, as in a rank)
  resume same W        plan(W=1024) from that state, + rank 0's readers
  resume state         bytes of the larger state: after the elastic phase (two phases recorded)

Printed: one table, a row per (case, figure), columns v1 | folder | v1/folder, and PASS/FAIL
of the folder layout against the issues' targets at 1.28 M shards (load + plan < 5 s, < 450 MB
RSS added (issue 50; 500 MB before), elastic re-plan < 10 s, resume < 2 s, state < 4 KB). Both
layouts must give the same plans (fingerprint, batch counts, states, reader plans): checked, a
mismatch fails the run.

    python benches/bench_scale.py [--dir /tmp/shardstream-bench-scale] [--quick] [--repeat 3]
                                  [--json results.json]

--quick runs 1e6, 4e6 and 128k shards (1.28e9 samples, counts only): a smoke run under a minute.
A full run takes about 2 minutes once the indexes are cached (generating them, 2 GB in all: about
2 minutes more, 4 GB of RAM at most). The exit status is 1 when a target or a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _harness import proc_kb, reset_peak

PER_SHARD = 10_000
UNIT = 512
INVALID_PER_SHARD = PER_SHARD // 1000  # 0.1%
W, K, B, C = 1024, 8, 256, 1000
W_ELASTIC = 768
GEN = "g1"  # bump when the generated indexes change, so cached ones are not reused
TARGETS = {  # at 1.28 M shards, for one rank
    "load_plan_s": 5.0,
    "rss_mb": 450.0,
    "elastic_s": 10.0,
    "resume_s": 2.0,
    "state_bytes": 4096,
}
TIMEOUT = 900
KIND_TEXT = {"detail": "offsets + keys", "counts": "counts only", "invalid": "counts + 0.1% invalid"}


# -- synthetic indexes -----------------------------------------------------------------------------


def delta_pool() -> list[str]:
    """Per-sample sizes in 512-byte units, ~120 with some variation (60 kB +- 10 kB)."""
    rng = random.Random(12)
    return [str(rng.randint(100, 140)) for _ in range(PER_SHARD)]


def shard_line(shard: int, pool: list[str], suffixes: list[str]) -> str:
    """One shard of a v1 index with keys, delta offsets and 0.1% invalid samples."""
    r = (shard * 7919) % PER_SHARD
    deltas = pool[r:] + pool[:r]
    total = sum(int(d) for d in deltas)
    prefix = f"{shard:06d}"
    keys = '"' + prefix + ('","' + prefix).join(suffixes) + '"'
    invalid = ",".join(
        f'{{"ordinal":{o},"key":"{prefix}{o:04d}","reason":"corrupt_image"}}'
        for o in sorted((shard * 37 + j * 997) % PER_SHARD for j in range(INVALID_PER_SHARD))
    )
    return (
        f'{{"url":"s3://bucket/data/{prefix}.tar","size":{total * UNIT + 1024},"compressed":false,'
        f'"num_samples":{PER_SHARD},"invalid":[{invalid}],"keys":[{keys}],'
        f'"offsets":{{"encoding":"delta","unit":{UNIT},"values":[0,{",".join(deltas)}]}}}}'
    )


def counts_line(shard: int, invalid: bool) -> str:
    """One shard of a counts-only v1 index (what img2dataset stats give); with ``invalid``, plus
    0.1% invalid samples (what validating it adds)."""
    size = UNIT * (1_200_000 + (shard * 7919) % 40_000)
    line = f'{{"url":"s3://bucket/data/{shard:07d}.tar","size":{size},"num_samples":{PER_SHARD}'
    if invalid:
        line += ',"invalid":[' + ",".join(
            f'{{"ordinal":{o},"key":"{shard:07d}{o:04d}","reason":"corrupt_image"}}'
            for o in sorted((shard * 37 + j * 997) % PER_SHARD for j in range(INVALID_PER_SHARD))
        )
        line += "]"
    return line + "}"


def write_v1(path: str, shards: int, kind: str) -> None:
    """Streams the JSON document to ``path`` a shard per line (never one string in memory)."""
    if os.path.exists(path):
        return
    start = time.perf_counter()
    pool, suffixes = delta_pool(), [f"{i:04d}" for i in range(PER_SHARD)]
    tmp = path + ".tmp"
    with open(tmp, "w", buffering=1 << 22) as f:
        f.write('{"format":"shardstream-index","version":1,"shards":[\n')
        for s in range(shards):
            if s:
                f.write(",\n")
            f.write(shard_line(s, pool, suffixes) if kind == "detail" else counts_line(s, kind == "invalid"))
        f.write("\n]}\n")
    os.replace(tmp, path)
    print(f"  wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB, {time.perf_counter() - start:.1f} s)")


def write_v2(v1_path: str, folder: str) -> None:
    """The folder layout of the same index, written by ``write_index`` (in a child process, so
    this one stays small)."""
    if os.path.exists(os.path.join(folder, "manifest.bin")):
        return
    start = time.perf_counter()
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    code = (
        "import sys\nfrom shardstream.index import load_index, write_index\n"
        "write_index(load_index(sys.argv[1]), sys.argv[2])\n"
    )
    subprocess.run([sys.executable, "-c", code, v1_path, tmp], check=True, timeout=TIMEOUT)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    print(f"  wrote {folder} ({folder_bytes(folder) / 1e6:.0f} MB, {time.perf_counter() - start:.1f} s)")


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))


# -- one rank, in a fresh process --------------------------------------------------------------------


def measure(path: str) -> dict:
    from shardstream._core import PlanRequest
    from shardstream.index import load_index

    base_kb = proc_kb("VmHWM")
    settings = {"seed": 0, "epoch": 0, "workers": K, "batch_size": B, "block_size": C, "drop_last": True}

    def readers(plan) -> list:
        return [plan.reader(0, w) for w in range(K)]

    def summary(rs: list) -> list:
        return [{k: v for k, v in r.items() if k != "spans"} for r in rs]

    start = time.perf_counter()
    index = load_index(path)
    load_s = time.perf_counter() - start
    load_mb = (proc_kb("VmHWM") - base_kb) / 1024
    start = time.perf_counter()
    plan = index.plan(PlanRequest(world_size=W, **settings))
    rs = readers(plan)
    plan_s = time.perf_counter() - start
    rss_mb = (proc_kb("VmHWM") - base_kb) / 1024
    held_mb = (proc_kb("VmRSS") - base_kb) / 1024
    batches, half = plan.num_batches, plan.num_batches // 2
    start = time.perf_counter()
    state = plan.state(half, [])
    state_s = time.perf_counter() - start
    first = summary(rs)
    del rs, plan

    peak_reset = reset_peak()
    start = time.perf_counter()
    elastic = index.plan(PlanRequest(world_size=W_ELASTIC, state=state, **settings))
    rs = readers(elastic)
    elastic_s = time.perf_counter() - start
    elastic_peak_mb = (proc_kb("VmHWM") - base_kb) / 1024
    elastic_batches = elastic.num_batches
    elastic_state = elastic.state(elastic_batches // 2, [])
    elastic_readers = summary(rs)
    del rs, elastic

    start = time.perf_counter()
    resumed = index.plan(PlanRequest(world_size=W, state=state, **settings))
    rs = readers(resumed)
    resume_s = time.perf_counter() - start
    resumed_batches = resumed.num_batches
    resumed_readers = summary(rs)
    del rs, resumed
    return {
        "shards": len(index),
        "samples": index.num_samples,
        "valid": index.num_valid,
        "fingerprint": index.fingerprint,
        "load_s": load_s,
        "plan_s": plan_s,
        "load_plan_s": load_s + plan_s,
        "load_mb": load_mb,
        "rss_mb": rss_mb,
        "held_mb": held_mb,
        "state_s": state_s,
        "elastic_s": elastic_s,
        "elastic_peak_mb": elastic_peak_mb,
        "peak_reset": peak_reset,
        "resume_s": resume_s,
        "state_bytes": max(len(state.encode()), len(elastic_state.encode())),
        "state_bytes_one_phase": len(state.encode()),
        "batches": batches,
        "elastic_batches": elastic_batches,
        "resumed_batches": resumed_batches,
        "check": {
            "state": state,
            "elastic_state": elastic_state,
            "readers": [first, elastic_readers, resumed_readers],
        },
    }


def run_case(path: str, repeat: int) -> dict:
    """Median of each figure over ``repeat`` fresh processes."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, __file__, "--measure", path],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if out.returncode:
            raise SystemExit(f"measuring {path} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            result[key] = statistics.median(r[key] for r in runs)
    return result


# -- the table ---------------------------------------------------------------------------------------


def fmt_seconds(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


ROWS = [  # key, label, format, target key
    ("v1_na", "v1 with offsets + keys", None, None),
    ("read_bytes", "bytes a rank reads", fmt_bytes, None),
    ("load_s", "load", fmt_seconds, None),
    ("plan_s", "plan W=1024 K=8 + 8 readers", fmt_seconds, None),
    ("load_plan_s", "load + plan", fmt_seconds, "load_plan_s"),
    ("load_mb", "RSS added (peak, load)", "{:.0f} MB", None),
    ("rss_mb", "RSS added (peak, load + plan)", "{:.0f} MB", "rss_mb"),
    ("held_mb", "RSS held after plan", "{:.0f} MB", None),
    ("elastic_s", "elastic re-plan 1024 -> 768", fmt_seconds, "elastic_s"),
    ("elastic_peak_mb", "peak RSS added, elastic", "{:.0f} MB", None),
    ("resume_s", "resume, same W", fmt_seconds, "resume_s"),
    ("state_bytes", "resume state (2 phases)", "{:.0f} B", "state_bytes"),
]
TARGET_TEXT = {
    "load_plan_s": "< 5 s",
    "rss_mb": "< 450 MB",
    "elastic_s": "< 10 s",
    "resume_s": "< 2 s",
    "state_bytes": "< 4 KB",
}


def cell(fmt, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return fmt(value) if callable(fmt) else fmt.format(value)


def print_table(cases: list[dict]) -> list[str]:
    """Prints the table; returns the failed targets."""
    failed = []
    header = f"{'case':<28} {'figure':<32} {'v1 JSON':>26} {'folder (v2)':>12} {'v1/v2':>8}  target"
    print(header)
    print("-" * (len(header) + 12))
    for case in cases:
        v1, v2 = case.get("v1"), case["v2"]
        rows = [row for row in ROWS if row[0] != "v1_na" or "v1_na" in case]
        for i, (key, label, fmt, target) in enumerate(rows):
            a = case["v1_na"] if key == "v1_na" else (v1.get(key) if v1 else None)
            b = "-" if key == "v1_na" else v2.get(key)
            ratio = f"{a / b:.1f}x" if isinstance(a, (int, float)) and b else ""
            verdict = ""
            if target and case["targets"]:
                ok = b < TARGETS[target]
                verdict = f"{TARGET_TEXT[target]:<9} {'PASS' if ok else 'FAIL'}"
                if not ok:
                    failed.append(f"{case['name']}: {label} = {cell(fmt, b)}, target {TARGET_TEXT[target]}")
            name = ([case["name"], case["detail"], case["kind"]] + [""] * len(rows))[i]
            print(f"{name:<28} {label:<32} {cell(fmt, a):>26} {cell(fmt, b):>12} {ratio:>8}  {verdict}")
        print()
    return failed


def check_same(name: str, v1: dict, v2: dict) -> list[str]:
    """Both layouts of the same index must plan identically."""
    problems = []
    for key in ("shards", "samples", "valid", "fingerprint", "batches", "elastic_batches", "resumed_batches"):
        if v1[key] != v2[key]:
            problems.append(f"{name}: {key} differs: v1 {v1[key]}, v2 {v2[key]}")
    for key in ("state", "elastic_state", "readers"):
        if v1["check"][key] != v2["check"][key]:
            problems.append(f"{name}: {key} differs between the layouts")
    return problems


def check_plan(name: str, r: dict) -> list[str]:
    """Sanity of the batch counts: a resume yields the other half, an elastic re-plan the rest of
    the samples over 768 ranks (within one batch per rank)."""
    problems = []
    half = r["batches"] // 2
    if r["resumed_batches"] != r["batches"] - half:
        problems.append(
            f"{name}: resume gives {r['resumed_batches']} batches, expected {r['batches'] - half}"
        )
    left = (r["batches"] - half) * W * B
    expected = left // (W_ELASTIC * B)
    if abs(r["elastic_batches"] - expected) > 1:
        problems.append(f"{name}: elastic re-plan gives {r['elastic_batches']} batches, expected ~{expected}")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench-scale"))
    ap.add_argument("--quick", action="store_true", help="1e6, 4e6 and 128k shards only")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per case (median)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    os.makedirs(args.dir, exist_ok=True)
    detailed = [100, 400] if args.quick else [100, 400, 1600]
    big = 128_000 if args.quick else 1_280_000

    print(f"indexes under {args.dir}")
    cases = []
    for shards in detailed:
        cases.append({"shards": shards, "kind": "detail"})
    cases.append({"shards": big, "kind": "counts"})
    if not args.quick:
        cases.append({"shards": big, "kind": "invalid"})
    for case in cases:
        case["v1_path"] = os.path.join(args.dir, f"{GEN}-{case['kind']}-{case['shards']}.json")
        case["v2_path"] = case["v1_path"][: -len(".json")]
        write_v1(case["v1_path"], case["shards"], case["kind"])
        write_v2(case["v1_path"], case["v2_path"])

    problems = []
    results = []
    largest_v1 = None  # bytes per sample of the largest v1 file with offsets and keys
    for case in cases:
        samples = case["shards"] * PER_SHARD
        result = {
            "name": f"{samples / 1e9:g}e9 samples" if samples >= 1e9 else f"{samples / 1e6:g}e6 samples",
            "detail": f"{case['shards']:,} shards",
            "kind": KIND_TEXT[case["kind"]],
            "targets": case["kind"] != "detail",
        }
        print(f"measuring {result['name']} ({result['detail']}, {result['kind']}) ...", flush=True)
        result["v1"] = run_case(case["v1_path"], args.repeat)
        result["v1"]["read_bytes"] = os.path.getsize(case["v1_path"])
        if case["kind"] == "detail":
            largest_v1 = result["v1"]["read_bytes"] / samples
        result["v2"] = run_case(case["v2_path"], args.repeat)
        result["v2"]["read_bytes"] = os.path.getsize(os.path.join(case["v2_path"], "manifest.bin"))
        result["v2"]["folder_bytes"] = folder_bytes(case["v2_path"])
        problems += check_same(result["name"], result["v1"], result["v2"])
        if case["kind"] != "detail":
            estimate = f"~{largest_v1 * samples / 1e9:.0f} GB" if largest_v1 else "hundreds of GB"
            result["v1_na"] = f"n/a (would need {estimate})"
        for layout in ("v1", "v2"):
            problems += check_plan(f"{result['name']} {layout}", result[layout])
            if not result[layout]["peak_reset"]:
                problems.append(
                    f"{result['name']} {layout}: VmHWM not resettable; elastic peak includes plan"
                )
        results.append(result)

    print()
    print(f"One rank (rank 0), W={W} K={K} B={B} C={C}, drop_last; elastic {W} -> {W_ELASTIC} from the state")
    print("after half the batches; each (case, layout) in a fresh process. v1 reads the whole JSON file,")
    print("the folder layout only manifest.bin (detail files: fetched per shard when a reader opens it).")
    print()
    failed = print_table(results)
    for r in results:
        print(
            f"{r['name']} ({r['kind']}): folder {fmt_bytes(r['v2']['folder_bytes'])} on disk, manifest"
            f" {fmt_bytes(r['v2']['read_bytes'])}; {r['v2']['batches']} batches per rank"
        )
    if args.quick:
        print("(--quick: the targets are set at 1.28 M shards; here checked at 128k shards)")
    for line in problems:
        print("PROBLEM:", line)
    for line in failed:
        print("FAIL:", line)
    if args.json:
        for r in results:
            for layout in ("v1", "v2"):
                r[layout].pop("check", None)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if problems or failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
