"""`shardstream index` at cluster scale: content identities recorded per shard, incremental
re-indexing of a grown or changed dataset (unchanged shards reused, new or changed ones scanned,
missing ones dropped), and the scan split across torchrun ranks with rank 0 writing the index."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import shardstream
import shardstream.validation
from cli_runs import run_on_pty as _run_on_pty
from cli_runs import torchrun
from corpus import build_corrupt_corpus, good_shard
from index_layout import read_layout
from servers import RangeHTTPServer, free_ports
from shardstream import ShardLoader
from shardstream.cli import main
from shardstream.identity import UNKNOWN, ShardIdentity, probe_identities
from shardstream.index import build_index, index_from_reports, load_index, plan_update, update_index


def make_shards(directory, first: int, count: int) -> list[str]:
    """Shards of different sizes with keys unique across shards (so plans can be compared)."""
    os.makedirs(directory, exist_ok=True)
    return [
        good_shard(os.path.join(directory, f"shard-{i:06d}.tar"), 2 + i % 3, seed=i, prefix=f"p{i}_")
        for i in range(first, first + count)
    ]


def epoch(index: str) -> list[list[list[str]]]:
    """The keys of every batch that ranks 0 and 1 of a world of 2 read in epoch 0."""
    return [
        [
            batch.keys
            for batch in ShardLoader(
                None, index=index, batch_size=2, image_size=32, threads=1, rank=rank, world_size=2
            )
        ]
        for rank in (0, 1)
    ]


def entries(index: str) -> list[dict]:
    return read_layout(index)["shards"]


def counted_scans(monkeypatch) -> list[str]:
    """Every shard the CLI scans from now on, by URL."""
    scanned: list[str] = []
    real = shardstream.validation.scan_one

    def scan_one(shard, options):
        scanned.append(shard.display)
        return real(shard, options)

    monkeypatch.setattr(shardstream.validation, "scan_one", scan_one)
    return scanned


def shard_line(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("shards: ")]
    return line


def test_a_grown_dataset_indexed_in_two_runs_plans_the_epoch_of_one_run(tmp_path, capsys, monkeypatch):
    shards = make_shards(tmp_path / "data", 0, 6)
    once, twice = str(tmp_path / "once.index"), str(tmp_path / "twice.index")
    assert main(["index", *shards, "-o", once, "-q"]) == 0
    assert main(["index", *shards[:4], "-o", twice, "-q"]) == 0
    first_detail = read_layout(twice)["header"]["detail_files"]
    assert len(first_detail) == 1

    scanned = counted_scans(monkeypatch)
    assert main(["index", *shards, "-o", twice]) == 0
    assert shard_line(capsys.readouterr().out) == (
        "shards: 4 reused (unchanged since indexed), 2 scanned (new or changed), 0 dropped (no longer listed)"
    )
    assert scanned == shards[4:]
    # The reused shards still point into the first run's detail file; the new ones into a new one.
    detail_files = read_layout(twice)["header"]["detail_files"]
    assert first_detail[0] in detail_files and len(detail_files) == 2
    assert all(os.path.isfile(os.path.join(twice, name)) for name in detail_files)
    # The same index (offsets, keys, identities) and the same epoch as one run over all six.
    assert entries(twice) == entries(once)
    assert load_index(twice).fingerprint == load_index(once).fingerprint
    plans = epoch(twice)
    assert plans == epoch(once) and all(plans)


def test_a_rewritten_shard_is_rescanned_with_its_new_counts(tmp_path, capsys, monkeypatch):
    shards = make_shards(tmp_path / "data", 0, 3)
    out = str(tmp_path / "data.index")
    assert main(["index", *shards, "-o", out, "-q"]) == 0
    before = entries(out)
    good_shard(shards[1], 9, seed=42, prefix="new_")  # other content, other size
    os.utime(shards[2], ns=(os.stat(shards[2]).st_atime_ns, os.stat(shards[2]).st_mtime_ns + 10**9))
    scanned = counted_scans(monkeypatch)
    assert main(["index", *shards, "-o", out]) == 0
    assert shard_line(capsys.readouterr().out).startswith(
        "shards: 1 reused (unchanged since indexed), 2 scanned"
    )
    assert scanned == shards[1:]  # the rewritten one, and the one whose mtime alone changed
    after = entries(out)
    assert after[0] == before[0]
    assert after[1]["num_samples"] == 9 and after[1]["keys"] == [f"new_{i:04d}" for i in range(9)]
    assert after[1]["identity"] != before[1]["identity"]
    assert after[2]["identity"] != before[2]["identity"] and after[2]["keys"] == before[2]["keys"]
    assert load_index(out).num_samples == 2 + 9 + 4


def test_shards_no_longer_listed_are_dropped_and_the_order_is_the_url_order(tmp_path, capsys, monkeypatch):
    shards = make_shards(tmp_path / "data", 0, 4)
    out = str(tmp_path / "data.index")
    assert main(["index", *shards, "-o", out, "-q"]) == 0
    scanned = counted_scans(monkeypatch)
    kept = [shards[3], shards[0], shards[2]]
    assert main(["index", *kept, "-o", out]) == 0
    printed = capsys.readouterr().out
    assert shard_line(printed).startswith("shards: 3 reused (unchanged since indexed), 0 scanned")
    assert "1 dropped (no longer listed)" in printed and f"  dropped: {shards[1]}" in printed
    assert scanned == []
    assert [e["url"] for e in entries(out)] == kept
    assert load_index(out).urls == kept


def test_rebuild_scans_everything_and_a_damaged_index_is_not_silently_replaced(tmp_path, capsys, monkeypatch):
    shards = make_shards(tmp_path / "data", 0, 2)
    out = str(tmp_path / "data.index")
    assert main(["index", *shards, "-o", out, "-q"]) == 0
    scanned = counted_scans(monkeypatch)
    assert main(["index", *shards, "-o", out, "--rebuild", "-q"]) == 0
    assert scanned == shards
    manifest = os.path.join(out, "manifest.bin")
    with open(manifest, "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff\xff\xff")
    assert main(["index", *shards, "-o", out]) == 2
    err = capsys.readouterr().err
    assert f"cannot read the index already in {out}" in err and "--rebuild" in err
    assert main(["index", *shards, "-o", out, "--rebuild", "-q"]) == 0
    assert len(load_index(out)) == 2


def test_identities_are_recorded_for_local_and_http_shards(tmp_path, capsys):
    shards = make_shards(tmp_path / "data", 0, 2)
    out = str(tmp_path / "local.index")
    assert main(["index", *shards, "-o", out, "-q"]) == 0
    for entry, path in zip(entries(out), shards, strict=True):
        st = os.stat(path)
        assert entry["identity"] == f"size:{st.st_size},mtime_ns:{st.st_mtime_ns}"
        assert entry["size"] == st.st_size
    # The version-1 JSON file records them too.
    assert [i for _, _, i in build_index(shards).shard_identities()] == [e["identity"] for e in entries(out)]

    web = str(tmp_path / "web.index")
    with RangeHTTPServer(str(tmp_path / "data")) as server:
        urls = [server.url(os.path.basename(p)) for p in shards]
        assert main(["index", *urls, "-o", web, "-q"]) == 0
        for entry, path in zip(entries(web), shards, strict=True):
            st = os.stat(path)  # what RangeHTTPServer sends as the ETag
            assert (
                entry["url"].startswith("http://")
                and entry["identity"] == f'etag:"{st.st_size:x}-{st.st_mtime_ns:x}"'
            )
        server.requests.clear()
        assert main(["index", *urls, "-o", web]) == 0
        assert shard_line(capsys.readouterr().out).startswith("shards: 2 reused")
        # An unchanged HTTP shard costs one HEAD request, and is not read.
        assert sorted(r.method for r in server.requests) == ["HEAD", "HEAD"]
        assert probe_identities([shardstream.urls.Shard(server.url("gone.tar"))]) == [UNKNOWN]


def test_an_unknown_identity_or_another_size_is_always_rescanned():
    known = ShardIdentity(10, "size:10,mtime_ns:1")
    reports = [
        {"url": u, "bytes": 10, "samples": 1, "offsets": [0, 10], "keys": ["k"], "invalid": [],
         "fatal": None, "compressed": False, "identity": "size:10,mtime_ns:1"}
        for u in ("a.tar", "b.tar", "c.tar")
    ]  # fmt: skip
    index = index_from_reports(reports)
    plan = plan_update(
        index,
        ["a.tar", "b.tar", "c.tar", "d.tar"],
        [known, UNKNOWN, ShardIdentity(11, known.identity), known],
    )
    assert plan.reuse == {0: 0}
    assert plan.scan == [1, 2, 3]  # unknown identity, other size, not in the old index
    assert plan.dropped == []


def test_update_index_library_function(tmp_path):
    shards = make_shards(tmp_path / "data", 0, 3)
    folder = str(tmp_path / "lib.index")
    first = update_index(shards[:2], folder, decode=False)
    assert (first.reused, first.scanned, first.dropped) == (0, shards[:2], [])
    second = update_index(shards[1:], folder, decode=False)
    assert (second.reused, second.scanned, second.dropped) == (1, shards[2:], [shards[0]])
    assert load_index(folder).urls == shards[1:]
    assert load_index(folder).fingerprint == build_index(shards[1:], decode=False).fingerprint
    with pytest.raises(shardstream.ShardError, match="no index written"):
        update_index([*shards, str(tmp_path / "data" / "missing.tar")], folder)
    assert load_index(folder).urls == shards[1:]


def test_build_index_refuses_a_shard_it_cannot_read_instead_of_indexing_it_as_empty(tmp_path):
    # Regression: build_index used to return an index holding an unreadable shard with 0
    # samples, so every epoch silently lost that shard's data.
    shards = make_shards(tmp_path / "data", 0, 2)
    missing = str(tmp_path / "data" / "shard-000009.tar")
    with pytest.raises(shardstream.ShardError, match="no index written") as raised:
        build_index([shards[0], missing, shards[1]], decode=False)
    assert raised.value.url == missing
    assert "1 of 3 shards unreadable" in str(raised.value)
    # Readable shards index as before.
    assert build_index(shards, decode=False).urls == shards


def test_index_progress_on_a_terminal_and_not_in_a_pipe(tmp_path):
    shards = make_shards(tmp_path / "data", 0, 3)
    out = str(tmp_path / "data.index")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SHARDSTREAM_NO_PROGRESS")}
    env["TERM"] = "xterm"
    base = [sys.executable, "-m", "shardstream", "index", "-o", out, "--threads", "1"]
    status, output = _run_on_pty([*base, *shards[:1]], env)
    assert status == 0, output
    status, output = _run_on_pty([*base, *shards], env)
    assert status == 0, output
    assert b"\rindex  " in output and b"2/2 shards" in output and b"samples (" in output  # only the new two
    piped = subprocess.run([*base, *shards, "--rebuild"], capture_output=True, env=env, timeout=60)
    assert piped.returncode == 0
    assert b"\r" not in piped.stdout + piped.stderr and b"ETA" not in piped.stdout + piped.stderr


def test_no_distributed_indexes_everything_in_this_process(tmp_path, monkeypatch):
    shards = make_shards(tmp_path / "data", 0, 2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["index", *shards, "-o", str(tmp_path / "x.index"), "--no-distributed", "-q"]) == 0
    assert load_index(str(tmp_path / "x.index")).urls == shards


@pytest.mark.slow
def test_two_ranks_build_the_index_of_one_process_and_update_it(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    build_corrupt_corpus(str(corpus))
    shards = [
        *make_shards(tmp_path / "data", 0, 5),
        str(corpus / "duplicate_keys.tar"),
        str(corpus / "truncated.tar"),
    ]
    single, ranks = str(tmp_path / "single.index"), str(tmp_path / "ranks.index")
    assert main(["index", *shards, "-o", single, "-q"]) == 0
    run = torchrun(["index", *shards, "-o", ranks, "--threads", "1"], timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("indexed 7 shards") == 1  # rank 0 only
    assert entries(ranks) == entries(single)
    assert load_index(ranks).fingerprint == load_index(single).fingerprint
    assert epoch(ranks) == epoch(single)

    # Grown by two shards: every rank gets the same split, and only the two new ones are scanned.
    grown = [*shards, *make_shards(tmp_path / "data", 5, 2)]
    assert main(["index", *grown, "-o", single, "-q", "--rebuild"]) == 0
    run = torchrun(["index", *grown, "-o", ranks, "--threads", "1"], timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "shards: 7 reused (unchanged since indexed), 2 scanned (new or changed)" in run.stdout
    assert len(read_layout(ranks)["header"]["detail_files"]) == 2
    assert entries(ranks) == entries(single)
    assert epoch(ranks) == epoch(single)


def two_ranks(args: list[str], *, timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """``python -m shardstream ARGS`` as ranks 0 and 1 of a world of 2 (gloo on loopback, the
    environment torchrun sets), each rank's exit status its own: torchrun stops the other ranks
    as soon as one exits with an error, so it cannot show that every rank exits with the same one."""
    (port,) = free_ports(1)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "shardstream", *args],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, err)
        for p, (out, err) in zip(procs, outputs, strict=True)
    ]


@pytest.mark.slow
def test_an_unreadable_shard_in_a_distributed_index_exits_2_on_every_rank_and_writes_nothing(tmp_path):
    shards = make_shards(tmp_path / "data", 0, 3)
    out = str(tmp_path / "data.index")
    assert main(["index", *shards[:2], "-o", out, "-q"]) == 0

    def written() -> dict[str, bytes]:
        return {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))}

    before = written()
    # One spec, so only its first shard is checked up front: the missing one is found by its scan.
    missing = str(tmp_path / "data" / "shard-999999.tar")
    args = ["index", "::".join([*shards, missing]), "-o", out, "--threads", "1"]
    run = torchrun(args, timeout=120)
    assert run.returncode != 0 and "exitcode  : 2" in run.stderr, run.stdout + run.stderr
    assert all(code in ("2", "-15") for code in re.findall(r"exitcode  : (-?\d+)", run.stderr)), run.stderr
    assert run.stderr.count(f"cannot read {missing}") == 1 and "no index written" in run.stderr  # rank 0
    assert os.path.dirname(shardstream.__file__) not in run.stderr  # no traceback from our code
    assert written() == before
    ranks = two_ranks(args)
    assert [r.returncode for r in ranks] == [2, 2], [r.stderr for r in ranks]
    assert "no index written" in ranks[0].stderr and ranks[1].stderr == ranks[1].stdout == ""
    assert written() == before


@pytest.mark.slow
def test_rewriting_an_index_under_torchrun_is_done_by_rank_0_alone(tmp_path):
    shards = make_shards(tmp_path / "data", 0, 2)
    old = str(tmp_path / "old.json")
    assert main(["index", *shards, "-o", old, "-q"]) == 0
    out = str(tmp_path / "new.index")
    ranks = two_ranks(["index", "--from-index", old, "-o", out])
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr for r in ranks]
    assert "rewrote 2 shards" in ranks[0].stdout and ranks[1].stdout == ""
    assert len([n for n in os.listdir(out) if n.startswith("detail-")]) == 1  # written once
    assert load_index(out).fingerprint == load_index(old).fingerprint
