"""Soak: many epochs through the fault proxy with DataLoader workers, watching for leaks.

    python benches/soak.py [--minutes 10] [--workers 2] [--fault-every 4] [--trim-at-epoch-end]

Real components: our HTTP server with Range support, and our fault-injecting proxy in front of
it, which breaks one GET in ``--fault-every`` (a connection reset mid-body, ``503 SlowDown``, a
body cut short, a stall longer than the read timeout, in turn), for as long as the run lasts.
The loader reads an indexed dataset (exact epochs) through it with
``loader.dataloader(num_workers=K, persistent_workers=True)``, as open_clip does, one
``set_epoch`` per epoch.

Once a minute (``--report-every``) and at the end it prints: RSS of the process tree (this
process and its DataLoader workers; also the tree's PSS, which counts shared pages once), open
file descriptors and threads of the tree, samples, retries, resumes and skipped by reason. Each
epoch is accounted for: every planned sample yielded, or skipped and counted (``lost`` must be 0).

It exits 1 if the tree's RSS at the end of the run (the median over the last quarter of epoch
ends, at least 3) is more than ``--max-rss-growth`` (2 %) above its RSS at the end of the first
epoch, or its fds or threads at the last epoch end exceed the first's, or a sample was lost.
The last line is a JSON summary.

``--trim-at-epoch-end`` calls ``shardstream.memory.release_memory()`` in each worker when its
epoch ends (what one line in ``ShardLoader._iterate`` would do; here the bench patches it in),
to compare the worker memory with and without it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from servers import (  # noqa: E402 - tests/ is put on the path just above
    FaultProxy,
    RangeHTTPServer,
    build_photo_shards,
    error_status,
    reset_after,
    short_body,
    stall_after,
)

KINDS = ("reset", "status", "short", "stall")


class SteadyFaultProxy(FaultProxy):
    """Breaks every ``every``-th GET of a shard, cycling through the fault kinds, forever;
    ``counts[i]`` (shared memory) counts the faults of kind ``KINDS[i]``; none while
    ``active.value`` is 0."""

    def __init__(self, upstream: str, *, every: int, shard_size: int, counts, active, seed: int = 0) -> None:
        super().__init__(upstream)
        self.every = max(1, every)
        self.shard_size = shard_size
        self._rng = random.Random(seed)
        self._gets = 0
        self.counts = counts
        self.active = active

    def _next_fault(self, path: str):
        with self._lock:
            if not self.active.value or not path.endswith(".tar"):
                return None
            self._gets += 1
            if self._gets % self.every:
                return None
            i = (self._gets // self.every) % len(KINDS)
            kind = KINDS[i]
            self.counts[i] += 1
            cut = self._rng.randrange(1, max(2, self.shard_size // 2))
        if kind == "reset":
            return reset_after(cut)
        if kind == "status":
            return error_status(503, "SlowDown")
        if kind == "short":
            return short_body(cut)
        return stall_after(cut, 3.0)


def serve(shard_dir: str, every: int, shard_size: int, counts, active, ready, stop) -> None:
    """The HTTP server and the proxy, in their own process: their per-connection threads and
    sockets (a stalled response holds one for 3 s) must not count as the loader's."""
    with (
        RangeHTTPServer(shard_dir) as server,
        SteadyFaultProxy(
            server.url(), every=every, shard_size=shard_size, counts=counts, active=active
        ) as proxy,
    ):
        ready.put(proxy.url())
        stop.wait()


def faults_of(counts) -> dict[str, int]:
    return {kind: counts[i] for i, kind in enumerate(KINDS)}


# -- process tree measurements (Linux /proc) ---------------------------------------------------------


def tree_pids(root: int, exclude: int | None = None) -> list[int]:
    """``root`` and all its descendants (but not ``exclude`` and its own)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid == exclude:
            continue
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(root: int, exclude: int | None = None) -> dict[str, float]:
    pids = tree_pids(root, exclude)
    fds = 0
    for pid in pids:
        try:
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    per_process = {pid: _status_kb(pid, "VmRSS") / 1024 for pid in pids}
    return {
        "processes": len(pids),
        "rss_mb": sum(per_process.values()),
        "pss_mb": sum(_pss_kb(pid) for pid in pids) / 1024,
        "workers_rss_mb": sum(v for pid, v in per_process.items() if pid != root),
        "fds": fds,
        "threads": sum(_status_kb(pid, "Threads") for pid in pids),
    }


def settled(root: int, exclude: int | None, timeout: float = 3.0) -> dict[str, float]:
    """A measurement once threads and fds stop changing (the epoch's reader threads exit as the
    epoch ends): the same counts twice in a row, 0.1 s apart, or the last after ``timeout``."""
    deadline = time.monotonic() + timeout
    before = measure(root, exclude)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = measure(root, exclude)
        if (now["fds"], now["threads"], now["processes"]) == (
            before["fds"],
            before["threads"],
            before["processes"],
        ):
            return now
        before = now
    return before


# -- the run -----------------------------------------------------------------------------------------------


def patch_trim_at_epoch_end() -> None:
    """What one line at the end of ``ShardLoader._iterate`` (after ``core.close()``) would do."""
    from shardstream import loader as loader_module
    from shardstream.memory import release_memory

    original = loader_module.ShardLoader._iterate

    def _iterate(self, worker, workers):
        try:
            yield from original(self, worker, workers)
        finally:
            release_memory()

    loader_module.ShardLoader._iterate = _iterate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (0: in process)")
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--per-shard", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=1, help="decode threads per worker")
    parser.add_argument("--fault-every", type=int, default=4, help="break one shard GET in N")
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds between lines")
    parser.add_argument("--max-rss-growth", type=float, default=0.02)
    parser.add_argument("--min-epochs", type=int, default=2)
    parser.add_argument("--trim-at-epoch-end", action="store_true")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    import torch
    from shardstream import ShardLoader, SourceOptions, read_samples
    from shardstream.cli import main as cli_main

    torch.set_num_threads(1)
    if args.trim_at_epoch_end:
        patch_trim_at_epoch_end()
    workdir = args.workdir or tempfile.mkdtemp(prefix="shardstream-soak-")
    shard_dir = os.path.join(workdir, "shards")
    os.makedirs(shard_dir, exist_ok=True)
    if not os.listdir(shard_dir):
        build_photo_shards(shard_dir, shards=args.shards, per_shard=args.per_shard, seed=7)
    names = sorted(n for n in os.listdir(shard_dir) if n.endswith(".tar"))
    planned = {s["__key__"] for s in read_samples(shard_dir)}
    shard_size = max(os.path.getsize(os.path.join(shard_dir, n)) for n in names)
    deadline = time.monotonic() + args.minutes * 60
    totals = {"samples": 0, "retries": 0, "resumes": 0, "skipped": {}, "lost": 0, "padded": 0}
    per_epoch: list[dict] = []
    started = time.monotonic()
    last_report = started
    print(
        f"soak: {len(names)} shards, {len(planned)} samples/epoch, {args.workers} persistent workers, "
        f"1 GET in {args.fault_every} broken, {args.minutes} min"
        + (", malloc trim at epoch end" if args.trim_at_epoch_end else ""),
        flush=True,
    )
    context = multiprocessing.get_context("spawn")
    counts, active = context.Array("q", len(KINDS)), context.Value("b", 0)
    ready, stop = context.Queue(), context.Event()
    server = context.Process(
        target=serve,
        args=(shard_dir, args.fault_every, shard_size, counts, active, ready, stop),
        daemon=True,
    )
    server.start()
    try:
        base = ready.get(timeout=60)
        urls = [base + n for n in names]
        index = os.path.join(workdir, "soak.index")
        # Indexed through the proxy (the index names the URLs the loader reads), faults off.
        assert cli_main(["index", *urls, "-o", index, "-q"]) == 0
        active.value = 1
        options = {
            "connect_timeout": 2.0,
            "read_timeout": 1.0,
            "max_retries": 8,
            "source": SourceOptions(backoff_initial=0.05),
        }
        loader = ShardLoader(
            urls,
            index=index,
            batch_size=args.batch_size,
            image_size=args.image_size,
            threads=args.threads,
            shuffle_buffer=args.per_shard,
            on_error="skip",
            **options,
        )
        if args.workers > 0:
            batches = loader.dataloader(num_workers=args.workers, persistent_workers=True, prefetch_factor=2)
        else:  # in this process: the Rust pipeline's own memory, without worker processes
            batches = loader
        epoch = 0

        def line(tag: str, m: dict) -> None:
            skipped = totals["skipped"] or {}
            print(
                f"[{time.monotonic() - started:7.1f}s] {tag} epoch {epoch}: rss {m['rss_mb']:.0f} MB "
                f"(workers {m['workers_rss_mb']:.0f}, pss {m['pss_mb']:.0f}), fds {m['fds']}, "
                f"threads {m['threads']}, samples {totals['samples']}, retries {totals['retries']}, "
                f"resumes {totals['resumes']}, skipped {skipped}, faults {faults_of(counts)}",
                flush=True,
            )

        while time.monotonic() < deadline or epoch < args.min_epochs:
            loader.set_epoch(epoch)
            keys: list[str] = []
            for batch in batches:
                keys += batch.keys
                now = time.monotonic()
                if args.report_every > 0 and now - last_report >= args.report_every:
                    last_report = now
                    line("minute", measure(os.getpid(), server.pid))
            stats = loader.stats
            yielded = set(keys) & planned
            skipped = int(stats.get("skipped_total", 0))
            remainder = len(set(stats.get("remainder_keys", [])) - yielded)
            lost = len(planned) - len(yielded) - skipped - remainder
            for key in ("samples", "retries", "resumes", "padded"):
                totals[key] += int(stats.get(key, 0))
            for reason, n in (stats.get("skipped") or {}).items():
                totals["skipped"][reason] = totals["skipped"].get(reason, 0) + n
            totals["lost"] += max(0, lost)
            m = settled(os.getpid(), server.pid)
            per_epoch.append(dict(m, epoch=epoch, yielded=len(yielded), lost=lost))
            if args.report_every <= 0 or epoch == 0:
                line("epoch-end", m)
            epoch += 1
        final = measure(os.getpid(), exclude=server.pid)
        line("end", final)
        del batches  # stops the persistent workers
    finally:
        stop.set()
        server.join(timeout=30)
        if server.is_alive():
            server.kill()
    first, last = per_epoch[0], per_epoch[-1]
    # The level the run ended at: the median of the last quarter of epoch ends (at least 3), so
    # one epoch that ended with a batch's buffers not yet freed is not read as growth.
    tail = per_epoch[-max(3, len(per_epoch) // 4) :]
    end_rss = statistics.median(e["rss_mb"] for e in tail)
    end_pss = statistics.median(e["pss_mb"] for e in tail)
    growth = (end_rss - first["rss_mb"]) / first["rss_mb"]
    pss_growth = (end_pss - first["pss_mb"]) / first["pss_mb"]
    problems = []
    if growth > args.max_rss_growth:
        limit = args.max_rss_growth * 100
        problems.append(f"RSS grew {growth * 100:.1f}% after epoch 1 (limit {limit:.0f}%)")
    if last["fds"] > first["fds"]:
        problems.append(f"fds grew {first['fds']} -> {last['fds']}")
    if last["threads"] > first["threads"]:
        problems.append(f"threads grew {first['threads']} -> {last['threads']}")
    if totals["lost"]:
        problems.append(f"{totals['lost']} samples lost")
    rss_curve = " ".join(f"{e['rss_mb']:.0f}" for e in per_epoch)
    print(f"RSS per epoch end (MB): {rss_curve}")
    workers_curve = " ".join(f"{e['workers_rss_mb']:.0f}" for e in per_epoch)
    print(f"worker RSS per epoch end (MB): {workers_curve}")
    fds_seen, threads_seen = sorted({e["fds"] for e in per_epoch}), sorted({e["threads"] for e in per_epoch})
    print(f"fds seen at epoch ends: {fds_seen}, threads: {threads_seen}")
    for problem in problems:
        print(f"FAIL: {problem}")
    summary = {
        "ok": not problems,
        "minutes": round((time.monotonic() - started) / 60, 2),
        "epochs": len(per_epoch),
        "samples": totals["samples"],
        "lost": totals["lost"],
        "skipped": totals["skipped"],
        "padded": totals["padded"],
        "retries": totals["retries"],
        "resumes": totals["resumes"],
        "faults_injected": sum(faults_of(counts).values()),
        "faults": faults_of(counts),
        "rss_mb_first_epoch": round(first["rss_mb"], 1),
        "rss_mb_last_epoch": round(last["rss_mb"], 1),
        "rss_mb_end_level": round(end_rss, 1),
        "rss_growth_pct": round(growth * 100, 2),
        "pss_growth_pct": round(pss_growth * 100, 2),
        "fds": [first["fds"], last["fds"]],
        "threads": [first["threads"], last["threads"]],
        "trim_at_epoch_end": args.trim_at_epoch_end,
    }
    print(json.dumps(summary), flush=True)
    return 0 if not problems else 1


def watchdog(seconds: float) -> None:
    """Never a hang: past the deadline plus a margin, say so and exit 2 (workers die with us)."""

    def fire() -> None:
        print(f"FAIL: the soak did not finish within {seconds:.0f}s; exiting", flush=True)
        os._exit(2)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    minutes = next((float(a.split("=")[1]) for a in sys.argv if a.startswith("--minutes=")), None)
    if minutes is None and "--minutes" in sys.argv:
        minutes = float(sys.argv[sys.argv.index("--minutes") + 1])
    watchdog((minutes if minutes is not None else 10.0) * 60 + 300)
    sys.exit(main())
