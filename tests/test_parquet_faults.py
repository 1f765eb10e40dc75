"""Parquet over HTTP under faults: the same samples as from disk, or an error naming the file.

A Parquet file is read by range requests (the footer, then the wanted columns' chunks of each
row group), so each fault lands in a different request than in a tar's single stream: a reset
or short body inside a chunk, a 503 on a row group's read, a stall longer than the read timeout.
Files are HF ``datasets`` layout with several row groups of real photos (tests/parquet_corpus.py),
served by a real HTTP server behind the fault-injecting proxy of tests/servers.py.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
from parquet_corpus import row_groups, write_pairs
from servers import (
    FaultProxy,
    RangeHTTPServer,
    delay_before,
    error_status,
    reset_after,
    short_body,
    stall_after,
)
from shardstream import ShardLoader, SourceOptions, read_samples
from shardstream.errors import ShardError
from shardstream.index import build_index, write_index
from source_checks import comparable

pytestmark = pytest.mark.timeout(180)

COUNTS = [9, 10]  # row groups of 3: three and four per file
HF = {"caption_key": "text", "image_keys": ["image"]}
FAST = {
    "connect_timeout": 2.0,
    "read_timeout": 1.0,
    "max_retries": 4,
    "source": SourceOptions(backoff_max=0.2),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("parquet-faults"))
    parquets, _, _ = write_pairs(d, COUNTS, seed=71, layout="hf", rows_per_group=3)
    assert [row_groups(p) for p in parquets] == [3, 4]
    return d, [os.path.basename(p) for p in parquets]


def test_every_kind_of_fault_in_a_files_range_reads_still_gives_its_samples_once(files):
    directory, names = files
    expected = comparable(read_samples([os.path.join(directory, n) for n in names]))
    size = os.path.getsize(os.path.join(directory, names[0]))
    # Request 1 of each file is its footer; the faults fall on the footer and on row-group reads.
    plan = {
        f"/{names[0]}": [reset_after(10), None, reset_after(size // 20), error_status(), short_body(100)],
        f"/{names[1]}": [None, stall_after(50, 30), error_status(500, "InternalError"), None, reset_after(0)],
    }
    with RangeHTTPServer(directory) as srv, FaultProxy(srv.url(), plan) as proxy:
        got = comparable(read_samples([proxy.url(n) for n in names], **FAST))
        assert proxy.faults_left() == 0, "every scripted fault was hit"
        ranged = [r for r in proxy.requests if r.range]
    assert got == expected  # same samples, same order, identical bytes: nothing lost, nothing twice
    assert len(ranged) >= len(plan[f"/{names[0]}"]) + len(plan[f"/{names[1]}"])


def test_the_loader_counts_the_retries_and_equals_its_epoch_from_disk(files, tmp_path):
    directory, names = files
    local = [os.path.join(directory, n) for n in names]
    index = write_index(build_index(local, decode=False, **HF), str(tmp_path / "local.index"))
    want = sorted(k for b in ShardLoader(local, index=index, batch_size=4, **HF) for k in b.keys)
    with RangeHTTPServer(directory) as srv, FaultProxy(srv.url()) as proxy:
        urls = [proxy.url(n) for n in names]
        remote = write_index(build_index(urls, decode=False, **HF), str(tmp_path / "http.index"))
        for n in names:  # the epoch's reads, not the index build's, meet these
            proxy.add_faults(f"/{n}", [None, error_status(), reset_after(0)])
        loader = ShardLoader(urls, index=remote, batch_size=4, **HF, **FAST)
        got = sorted(k for b in loader for k in b.keys)
        assert proxy.faults_left() == 0
    assert got == want and len(got) == (sum(COUNTS) // 4) * 4
    # Every fault is counted: a 503 as a retry; a reset as a retry, or as a resume where it broke
    # a body already under way (which of a file's requests it meets depends on the readers' timing).
    stats = loader.stats
    assert stats["retries"] >= len(names) and stats["retries"] + stats["resumes"] >= 2 * len(names), stats


def test_a_file_replaced_after_indexing_is_refused_by_name_never_spliced(files, tmp_path):
    directory, names = files
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(os.path.join(directory, names[0]), served / "data.parquet")
    with RangeHTTPServer(str(served)) as srv:
        url = srv.url("data.parquet")
        index = write_index(build_index([url], decode=False, **HF), str(tmp_path / "one.index"))
        # Another file of another size under the same name, as a re-upload would leave it.
        shutil.copy(os.path.join(directory, names[1]), served / "data.parquet")
        loader = ShardLoader([url], index=index, batch_size=3, on_error="raise", **HF, **FAST)
        with pytest.raises(ShardError) as caught:
            list(loader)
    message = str(caught.value)
    assert "data.parquet" in message and "\n" not in message, message


def test_a_file_replaced_between_its_footer_and_a_row_group_is_an_error_not_a_splice(files, tmp_path):
    # The footer says where the row groups' chunks are; read from another version of the file,
    # those offsets splice two files. Every range read after the first carries the version seen.
    directory, names = files
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(os.path.join(directory, names[0]), served / "data.parquet")
    # Requests: the size probe, the footer, then a row group's chunks, held back before the
    # server sees them while the file is replaced: that read is the first to meet the new file.
    plan = {"/data.parquet": [None, None, delay_before(0.5)]}
    outcome: dict[str, object] = {}

    def read(url: str) -> None:
        try:
            outcome["samples"] = list(read_samples([url], on_error="raise", **FAST))
        except ShardError as e:
            outcome["error"] = e

    with RangeHTTPServer(str(served)) as srv, FaultProxy(srv.url(), plan) as proxy:
        reader = threading.Thread(target=read, args=(proxy.url("data.parquet"),))
        reader.start()
        deadline = time.monotonic() + 60
        while not any(r.fault for r in proxy.requests) and time.monotonic() < deadline:
            time.sleep(0.01)
        shutil.copy(os.path.join(directory, names[1]), served / "data.parquet.new")
        os.replace(served / "data.parquet.new", served / "data.parquet")
        reader.join(timeout=60)
    assert "samples" not in outcome, "read on across two versions of the file"
    message = str(outcome["error"])
    assert "data.parquet" in message and "changed while it was being read" in message, message
