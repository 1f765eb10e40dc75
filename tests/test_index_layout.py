"""The version-2 index layout (a folder: manifest.bin + detail files): it plans exactly the
epochs a version-1 JSON index plans, a reader fetches one shard's detail block only when it opens
that shard mid-way, and a damaged, missing or mismatched layout is a clear error naming the shard."""

from __future__ import annotations

import os
import shutil

import pytest
import shardstream
from corpus import good_samples, sample_members, tar_bytes, write_file, write_shards
from epoch_runs import run
from index_layout import read_layout
from servers import RangeHTTPServer
from shardstream.cli import main
from shardstream.errors import ShardError
from shardstream.index import build_index, load_index, write_index

COUNTS = [1, 7, 3, 12, 5, 9]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    d = tmp_path_factory.mktemp("layouts")
    paths, keys = write_shards(d, COUNTS, seed=500, prefix="l")
    index = build_index(paths)
    json_path = write_index(index, str(d / "index.json"))
    folder = write_index(index, str(d / "index"))
    return paths, keys, json_path, folder


def test_the_folder_holds_a_manifest_without_per_sample_detail(layouts):
    paths, keys, json_path, folder = layouts
    names = sorted(os.listdir(folder))
    assert names[-1] == "manifest.bin" and len(names) == 2 and names[0].startswith("detail-")
    on_disk = read_layout(folder)  # read as docs/epoch-plan.md describes it
    assert [s["url"] for s in on_disk["shards"]] == paths
    assert [k for s in on_disk["shards"] for k in s["keys"]] == keys
    manifest = os.path.getsize(os.path.join(folder, "manifest.bin"))
    assert manifest < 40 * len(paths) + 200, "the manifest holds nothing per sample"
    loaded = load_index(folder)
    assert loaded.has_detail_files and loaded.fingerprint == load_index(json_path).fingerprint
    assert load_index(os.path.join(folder, "manifest.bin")).fingerprint == loaded.fingerprint


@pytest.mark.parametrize("world", [1, 2, 3])
def test_folder_and_json_plan_identical_epochs_resumes_and_elastic_resumes(layouts, world):
    paths, _, json_path, folder = layouts
    for r in range(world):
        assert run(None, folder, rank=r, world=world)[0] == run(None, json_path, rank=r, world=world)[0]
    first, state, _ = run(None, folder, rank=0, world=world, stop_after=1)
    rest, _, loader = run(None, folder, rank=0, world=world, state=state)
    assert first + rest == run(None, json_path, rank=0, world=world)[0]
    # Elastic: resumed on world size 2 from a state taken under `world`.
    resumed = [run(None, folder, rank=r, world=2, state=state)[0] for r in range(2)]
    assert resumed == [run(None, json_path, rank=r, world=2, state=state)[0] for r in range(2)]
    # The remainder's keys come from the detail blocks of the shards that hold it.
    assert (
        loader.stats["remainder_keys"] == run(None, json_path, rank=0, world=world)[2].stats["remainder_keys"]
    )


def test_dataloader_workers_read_the_folder_layout(layouts):
    paths, _, json_path, folder = layouts

    def batches(index):
        loader = shardstream.ShardLoader(
            None, index=index, batch_size=3, image_size=32, shuffle_buffer=5, threads=1
        )
        return [list(b.keys) for b in loader.dataloader(num_workers=2)]

    assert batches(folder) == batches(json_path)


def test_mid_shard_spans_fetch_one_detail_block_and_seek_over_http(layouts, tmp_path):
    paths, _, _, folder = layouts
    root = tmp_path / "www"
    shutil.copytree(os.path.dirname(paths[0]), root)
    with RangeHTTPServer(str(root)) as server:
        http_folder = str(tmp_path / "http-index")
        urls = [server.url(os.path.basename(p)) for p in paths]
        write_index(build_index(urls, decode=False), http_folder)
        shutil.copytree(http_folder, root / "http-index")
        loader = shardstream.ShardLoader(
            None, index=server.url("http-index"), batch_size=4, image_size=32, shuffle_buffer=5, threads=1
        )
        got = [k for b in loader for k in b.keys]
        requests = list(server.requests)
    assert len(got) == sum(COUNTS) // 4 * 4
    detail_reads = [r for r in requests if "detail-" in r.path]
    shard_reads = [r for r in requests if r.path.endswith(".tar")]
    seeks = [r for r in shard_reads if r.range and not r.range.startswith("bytes=0-")]
    assert seeks, "spans that start mid-shard seek with a Range request"
    assert len(detail_reads) == len(seeks), "one detail read per shard entered mid-way, no more"
    assert all(r.range and r.range.startswith("bytes=") and "-" in r.range[6:] for r in detail_reads)
    assert sum(1 for r in requests if r.path.endswith("manifest.bin")) == 1


def test_damaged_or_foreign_detail_files_are_errors_naming_the_shard(layouts, tmp_path):
    paths, _, _, folder = layouts
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (detail,) = [n for n in os.listdir(broken) if n.startswith("detail-")]
    size = os.path.getsize(broken / detail)
    with open(broken / detail, "r+b") as f:
        f.truncate(size - 10)  # the last shard's block is cut short

    def iterate(**kw):
        loader = shardstream.ShardLoader(
            None, index=str(broken), batch_size=4, image_size=32, shuffle_buffer=5, threads=1, seed=1, **kw
        )
        return [k for b in loader for k in b.keys], loader

    with pytest.raises(ShardError, match=r"index detail of .*shard-05\.tar.*detail-"):
        iterate(on_error="raise")
    got, loader = iterate()
    # Its samples after the span's start are skipped and counted; the batch count is unchanged.
    assert loader.stats["skipped"].get("unreadable", 0) > 0, loader.stats["skipped"]
    assert len(got) == sum(COUNTS) // 4 * 4
    assert all("shard-05.tar" in f["url"] for f in loader.stats["faults"])
    # Cut in half: whole batches fail with no reserve left. The rank must not end its epoch
    # early (the other ranks would wait for its next batch forever): the batches are padded
    # with an earlier good sample, and counted.
    with open(broken / detail, "r+b") as f:
        f.truncate(size // 2)
    got, loader = iterate()
    assert len(got) == sum(COUNTS) // 4 * 4, "every batch of the epoch, as on the other ranks"
    stats = loader.stats
    assert stats["padded"] > 4 and stats["padded"] + stats["replaced"] == stats["skipped"]["unreadable"]
    # A detail file of another dataset (same shard names, other samples) is refused, not
    # misread: its blocks do not decode where this manifest points, or belong to other counts.
    other = tmp_path / "other"
    samples = good_samples(4, seed=9, prefix="o_")
    alien = [write_file(str(tmp_path / "o" / os.path.basename(p)), tar_bytes(
        [m for k, s in samples for m in sample_members(k, s)])) for p in paths]  # fmt: skip
    write_index(build_index(alien, decode=False), str(other))
    (alien_detail,) = [n for n in os.listdir(other) if n.startswith("detail-")]
    shutil.copy(other / alien_detail, broken / detail)
    with pytest.raises(ShardError, match=r"index detail of .*shard-\d\d\.tar"):
        iterate(on_error="raise")


def test_loader_construction_checks_a_bounded_number_of_shards(layouts, tmp_path):
    """An index names thousands of shards: the loader checks one, not each (a missing one is
    reported by name when it is read)."""
    paths, _, _, _ = layouts
    moved = tmp_path / "moved"
    shutil.copytree(os.path.dirname(paths[0]), moved, ignore=shutil.ignore_patterns("index*"))
    urls = [str(moved / os.path.basename(p)) for p in paths]
    index = write_index(build_index(urls, decode=False), str(tmp_path / "index"))
    os.unlink(moved / "shard-03.tar")
    loader = shardstream.ShardLoader(
        urls, index=index, batch_size=4, image_size=32, threads=1, on_error="raise"
    )
    with pytest.raises(ShardError, match="shard-03.tar"):
        list(loader)


def test_cli_rewrites_a_json_index_in_the_folder_layout(layouts, tmp_path, capsys):
    paths, _, json_path, _ = layouts
    out = str(tmp_path / "converted")
    assert main(["index", "--from-index", json_path, "-o", out]) == 0
    assert "6 shards" in capsys.readouterr().out
    assert load_index(out).fingerprint == load_index(json_path).fingerprint
    assert run(None, out, rank=1, world=2)[0] == run(None, json_path, rank=1, world=2)[0]
    assert main(["index", "--from-index", str(tmp_path / "nothing.json"), "-o", out]) == 2


def _index_with_identities(urls, identities, folder):
    from shardstream.index import index_from_reports, scan_shards

    reports = scan_shards(urls, decode=False)
    for report, identity in zip(reports, identities, strict=True):
        report["identity"] = identity
    return write_index(index_from_reports(reports, [str(u) for u in urls]), folder)


def test_a_shard_replaced_since_indexing_is_refused_by_name(tmp_path):
    """Stale offsets must never read another version of a shard: the reader compares what the
    index recorded (size locally; ETag, sent as If-Match, over HTTP) with the shard it opens."""
    d = tmp_path / "shards"
    paths = []
    for i in range(3):
        samples = good_samples(6, seed=700 + i, prefix=f"r{i}_")
        paths.append(write_file(str(d / f"{i:05d}.tar"), tar_bytes(
            [m for k, s in samples for m in sample_members(k, s)])))  # fmt: skip
    sizes = [f"size:{os.path.getsize(p)},mtime_ns:{os.stat(p).st_mtime_ns}" for p in paths]
    local_index = _index_with_identities(paths, sizes, str(tmp_path / "local-index"))
    with RangeHTTPServer(str(d)) as server:
        urls = [server.url(os.path.basename(p)) for p in paths]
        etags = []
        for url in urls:
            import urllib.request

            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as r:
                etags.append(f"etag:{r.headers['ETag']}")
        http_index = _index_with_identities(urls, etags, str(tmp_path / "http-index"))

        def keys(index, **kw):
            loader = shardstream.ShardLoader(
                None, index=index, batch_size=3, image_size=32, shuffle_buffer=4, threads=1, **kw
            )
            return [k for b in loader for k in b.keys], loader

        before = keys(http_index)[0]
        assert sorted(before) == sorted(keys(local_index)[0]) and len(before) == 18
        # 00001.tar is rewritten with other samples after indexing.
        samples = good_samples(7, seed=99, prefix="new_")
        write_file(paths[1], tar_bytes([m for k, s in samples for m in sample_members(k, s)]))
        for index in (local_index, http_index):
            with pytest.raises(ShardError, match=r"00001\.tar.*replaced since it was indexed"):
                keys(index, on_error="raise")
            got, loader = keys(index)
            assert not any(k.startswith("new_") for k in got), "no sample of the new version"
            assert loader.stats["skipped"].get("unreadable", 0) == 6, loader.stats["skipped"]
            assert len(got) == len(before), "the batch count is unchanged (reserve and padding)"
