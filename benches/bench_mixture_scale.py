"""Per-rank start-up cost of a mixture at LAION scale, beside the same shards as one dataset.

The 1.28 M-shard, 12.8e9-sample counts-only folder index of benches/bench_scale.py (built there
and cached under --dir) is cut into three sources of 60 / 30 / 10 % of its shards, each written
as its own folder index. One fresh process per contender measures one rank (rank 0):

  load + plan + 8 readers   load the index(es), plan the epoch (W=1024, K=8, B=256, C=1000, the
                            mixture weighted 0.6 / 0.3 / 0.1) and rank 0's 8 reader plans
  RSS added                 peak RSS after that, minus the baseline after the imports
  elastic 1024 -> 768       re-plan from the state taken half-way, + rank 0's readers
  resume same W             plan(W=1024) from that state, + rank 0's readers
  state                     bytes of the state after the elastic phase

Targets (issue 12's, which a mixture must keep): load + plan < 5 s, < 500 MB, elastic < 10 s,
resume < 2 s, state < 4 KB. Printed side by side with ratios mixture / one dataset.

    python benches/bench_mixture_scale.py [--dir /tmp/shardstream-bench-scale]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

W, K, B, C = 1024, 8, 256, 1000
W_ELASTIC = 768
WEIGHTS = (0.6, 0.3, 0.1)
TARGETS = {"load_plan_s": 5.0, "rss_mb": 500.0, "elastic_s": 10.0, "resume_s": 2.0, "state_bytes": 4096}


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def make_sources(whole: str, directory: str) -> list[str]:
    from shardstream.index import DatasetIndex, load_index, write_index

    folders = [os.path.join(directory, f"mixture-part-{i}") for i in range(len(WEIGHTS))]
    if all(os.path.exists(os.path.join(f, "manifest.bin")) for f in folders):
        return folders
    index = load_index(whole)
    n = len(index)
    bounds = [0, int(0.6 * n), int(0.9 * n), n]
    for i, folder in enumerate(folders):
        part = DatasetIndex.assemble([(index, s) for s in range(bounds[i], bounds[i + 1])])
        write_index(part, folder)
    return folders


def readers(plan, rank: int = 0) -> None:
    for w in range(K):
        plan.reader(rank, w)


def measure(kind: str, paths: list[str]) -> dict:
    from shardstream import _core
    from shardstream.index import load_index

    # As benches/bench_scale.py measures it: from the peak after the imports.
    base = rss_kb("VmHWM")
    params = {
        "seed": 0,
        "epoch": 0,
        "world_size": W,
        "workers": K,
        "batch_size": B,
        "block_size": C,
        "drop_last": True,
    }
    start = time.perf_counter()
    if kind == "mixture":
        # What MixturePlanner builds, without its check that the (synthetic, s3://) shards exist.
        indexes = [load_index(p) for p in paths]
        plannable = _core.MixturePlan(indexes, [("weight", w) for w in WEIGHTS], None)
    else:
        plannable = load_index(paths[0])
    plan = plannable.plan(_core.PlanRequest(**params))
    readers(plan)
    load_plan = time.perf_counter() - start
    rss = (rss_kb("VmHWM") - base) / 1024
    state = plan.state(plan.num_batches // 2)
    start = time.perf_counter()
    elastic = plannable.plan(_core.PlanRequest(**{**params, "world_size": W_ELASTIC}, state=state))
    readers(elastic)
    elastic_s = time.perf_counter() - start
    start = time.perf_counter()
    readers(plannable.plan(_core.PlanRequest(**params, state=state)))
    resume_s = time.perf_counter() - start
    later = elastic.state(elastic.num_batches // 2)
    return {
        "load_plan_s": load_plan,
        "rss_mb": rss,
        "elastic_s": elastic_s,
        "resume_s": resume_s,
        "state_bytes": len(later),
        "batches": plan.num_batches,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench-scale"))
    ap.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1:])))
        return 0
    whole = os.path.join(args.dir, "g1-counts-1280000")
    if not os.path.exists(os.path.join(whole, "manifest.bin")):
        print(f"{whole} is missing: run `python benches/bench_scale.py --dir {args.dir}` once to build it")
        return 1
    parts = make_sources(whole, args.dir)
    results = {}
    for kind, paths in (("one dataset", [whole]), ("mixture", parts)):
        out = subprocess.run(
            [sys.executable, __file__, "--measure", "mixture" if kind == "mixture" else "single", *paths],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    one, mix = results["one dataset"], results["mixture"]
    print(
        f"1.28 M shards, 12.8e9 samples (counts only); W={W}, K={K}, B={B}, C={C}; "
        "mixture of 3 sources 0.6/0.3/0.1"
    )
    print(f"{'figure':<22}{'one dataset':>14}{'mixture':>14}{'ratio':>8}  target")
    failed = False
    for name, label in (
        ("load_plan_s", "load + plan + readers"),
        ("rss_mb", "RSS added (MB)"),
        ("elastic_s", "elastic 1024 -> 768"),
        ("resume_s", "resume same W"),
        ("state_bytes", "state (bytes)"),
    ):
        ok = mix[name] < TARGETS[name]
        failed |= not ok
        print(
            f"{label:<22}{one[name]:>14.3f}{mix[name]:>14.3f}{mix[name] / max(one[name], 1e-9):>8.2f}  "
            f"< {TARGETS[name]} {'PASS' if ok else 'FAIL'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
