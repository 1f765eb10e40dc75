"""Parquet image-text files as shards: the same samples as tars, exact epochs, resume, mixtures.

Files are written by Hugging Face ``datasets`` (the ``Image`` feature, struct<bytes, path>) and by
pyarrow in img2dataset's layout (a binary ``jpg`` column), each with several row groups; the same
real-photo samples are written as tars beside them (tests/parquet_corpus.py).
"""

from __future__ import annotations

import collections

import pytest
import shardstream
from epoch_runs import run
from parquet_corpus import row_groups, write_pairs
from shardstream.index import build_index, load_index, write_index
from shardstream.planned_mixture import Source

COUNTS = [10, 7, 12]  # row groups of 4: 3, 2 and 3 per file, the last ones short
HF = {"caption_key": "text", "image_keys": ["image"]}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("parquet")
    parquets, tars, keys = write_pairs(str(d / "hf"), COUNTS, seed=40, layout="hf")
    index = write_index(build_index(parquets, decode=False, **HF), str(d / "hf.index"))
    return parquets, tars, keys, index


def by_key(loader) -> dict[str, tuple[bytes, str]]:
    out = {}
    for batch in loader:
        for i, key in enumerate(batch.keys):
            out[key] = (batch.images[i].numpy().tobytes(), batch.texts[i])
    return out


def test_hf_files_have_several_row_groups_and_read_as_their_tars(pairs):
    parquets, tars, keys, _ = pairs
    assert [row_groups(p) for p in parquets] == [3, 2, 3]
    from_parquet = by_key(
        shardstream.ShardLoader(parquets, batch_size=4, image_size=48, drop_last=False, **HF)
    )
    from_tars = by_key(shardstream.ShardLoader(tars, batch_size=4, image_size=48, drop_last=False))
    assert sorted(from_parquet) == sorted(keys)
    assert from_parquet == from_tars, "pixels and captions identical to the same samples in tars"


def test_img2dataset_layout_and_keys_from_the_file_name(tmp_path):
    parquets, tars, keys = write_pairs(str(tmp_path), [9], seed=7, layout="img2dataset", rows_per_group=3)
    assert row_groups(parquets[0]) == 3
    loader = shardstream.ShardLoader(
        parquets, batch_size=3, image_size=32, drop_last=False, caption_key="caption", image_keys=["jpg"]
    )
    assert by_key(loader) == by_key(
        shardstream.ShardLoader(tars, batch_size=3, image_size=32, drop_last=False)
    )
    # Without a key column the key is {file stem}/{row}; other codecs than snappy read the same.
    import pyarrow.parquet as pq

    table = pq.read_table(parquets[0]).drop_columns(["key"])
    for codec in ("zstd", "gzip", "lz4", "none"):
        path = str(tmp_path / f"nokey-{codec}.parquet")
        pq.write_table(table, path, row_group_size=4, compression=codec)
        raw = list(shardstream.read_samples(path))
        assert [r["__key__"] for r in raw] == [f"nokey-{codec}/{i}" for i in range(9)]
        assert [r["caption"].decode() for r in raw] == table.column("caption").to_pylist()
        assert [r["jpg"] for r in raw] == table.column("jpg").to_pylist()


def test_index_reads_footers_and_epochs_are_exact_on_two_ranks(pairs):
    parquets, _, keys, index = pairs
    loaded = load_index(index)
    assert loaded.num_samples == len(keys)
    per_rank = [run(parquets, index, rank=r, world=2, **HF)[0] for r in range(2)]
    assert len({len(b) for b in per_rank}) == 1, "equal batches on every rank"
    seen = [k for batches in per_rank for b in batches for k in b]
    remainder = run(parquets, index, rank=0, world=2, **HF)[2].stats["remainder_keys"]
    assert len(seen) == len(set(seen))
    assert sorted(seen + remainder) == sorted(keys)


def test_resume_mid_epoch_and_elastic_two_to_three(pairs):
    parquets, _, keys, index = pairs
    full = run(parquets, index, rank=1, world=2, seed=3, **HF)[0]
    first, state, _ = run(parquets, index, rank=1, world=2, seed=3, stop_after=2, **HF)
    assert first + run(parquets, index, rank=1, world=2, seed=3, state=state, **HF)[0] == full
    before = [run(parquets, index, rank=r, world=2, seed=5, stop_after=1, **HF) for r in range(2)]
    seen = [k for batches, _, _ in before for b in batches for k in b]
    after = [run(parquets, index, rank=r, world=3, seed=5, state=before[0][1], **HF) for r in range(3)]
    assert len({len(b) for b, _, _ in after}) == 1
    seen += [k for batches, _, _ in after for b in batches for k in b]
    assert len(seen) == len(set(seen)), "nothing seen twice"
    assert sorted(seen + after[0][2].stats["remainder_keys"]) == sorted(keys), "nothing lost"


def test_a_parquet_and_a_tar_source_keep_their_shares(tmp_path):
    parquets, _, pkeys = write_pairs(str(tmp_path / "p"), [12, 12], seed=1, layout="hf")
    _, tars, _ = write_pairs(str(tmp_path / "t"), [12, 12], seed=2, layout="hf", prefix="t")
    from_parquet = set(pkeys)
    pindex = write_index(build_index(parquets, decode=False, **HF), str(tmp_path / "p.index"))
    tindex = write_index(build_index(tars, threads=1), str(tmp_path / "t.index"))
    sources = [
        Source(index=pindex, weight=1.0, caption_key="text", name="parquet"),
        Source(index=tindex, weight=3.0, name="tar"),
    ]
    loader = shardstream.ShardLoader(
        sources=sources,
        batch_size=8,
        image_size=32,
        threads=1,
        image_keys=["jpg", "image"],
        shuffle_buffer=16,
    )
    shares = collections.Counter()
    texts = []
    for batch in loader:
        n_parquet = sum(1 for k in batch.keys if k in from_parquet)
        shares[(n_parquet, len(batch.keys) - n_parquet)] += 1
        texts += batch.texts
    # 1:3 of 8 is 2:6; a batch's share rounds one way or the other, never further.
    assert all(abs(p - 2) <= 1 and p + t == 8 for p, t in shares), f"batches keep the 1:3 shares: {shares}"
    batches = sum(shares.values())
    assert abs(sum(p * n for (p, _), n in shares.items()) - 2 * batches) <= 1, "the epoch keeps them exactly"
    assert all(t.startswith("photo number ") for t in texts)
    assert loader.stats["skipped_total"] == 0
    assert loader.stats["samples_by_source"]["parquet"] == sum(p * n for (p, _), n in shares.items())


def test_index_of_a_damaged_file_says_which_and_why(tmp_path, capsys):
    from shardstream.cli import main

    parquets, _, _ = write_pairs(str(tmp_path / "g"), [6], seed=3, layout="img2dataset")
    data = open(parquets[0], "rb").read()
    bad = tmp_path / "short.parquet"
    bad.write_bytes(data[: len(data) // 2])
    status = main(["index", parquets[0], str(bad), "-o", str(tmp_path / "i"), "--no-decode"])
    err = capsys.readouterr().err
    assert status == 2 and "short.parquet is not a shard" in err and "footer" in err
    assert main(["index", parquets[0], "-o", str(tmp_path / "i"), "--no-decode", "-q"]) == 0
    assert load_index(str(tmp_path / "i")).num_samples == 6


def test_row_groups_are_the_units_so_an_epoch_interleaves_files(pairs):
    parquets, _, keys, index = pairs
    # A block of one sample: the emitted order is the reading order.
    loader = shardstream.ShardLoader(
        parquets, index=index, batch_size=1, image_size=32, shuffle_buffer=1, drop_last=False, seed=2, **HF
    )
    order = [k for batch in loader for k in batch.keys]
    assert sorted(order) == sorted(keys)
    # Keys are p{file}_{row:04d}; row groups hold 4 rows.
    groups = [(int(k[1 : k.index("_")]), int(k[k.index("_") + 1 :]) // 4) for k in order]
    stretches = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    files = [f for i, (f, _) in enumerate(stretches) if i == 0 or stretches[i - 1][0] != f]
    assert len(files) > len(parquets), f"the epoch reads files one after another: {stretches}"
    # Each row group (a unit, of 3 + 2 + 3) is read in one stretch.
    assert len(stretches) == len(set(stretches)) == 8, stretches


def test_a_subset_by_key_of_a_parquet_index_yields_exactly_those_samples(pairs, tmp_path):
    from shardstream.subset import subset_index

    parquets, _, keys, index = pairs
    # Some rows of every row group of every file, among them a file's first and last.
    chosen = sorted(keys[::3] + [keys[-1]])
    (tmp_path / "keys.txt").write_text("\n".join(chosen) + "\n")
    subset, report = subset_index(index, keys=str(tmp_path / "keys.txt"))
    assert report.kept == len(chosen)
    subset_dir = write_index(subset, str(tmp_path / "subset.index"))
    runs = [run(parquets, subset_dir, rank=r, world=2, batch=2, **HF) for r in range(2)]
    assert len({len(batches) for batches, _, _ in runs}) == 1
    seen = [k for batches, _, _ in runs for b in batches for k in b]
    assert len(seen) == len(set(seen))
    assert sorted(seen + runs[0][2].stats["remainder_keys"]) == chosen, "exactly the chosen samples"


@pytest.mark.slow
def test_exact_on_two_ranks_under_torchrun(pairs, jobs):
    _, _, keys, index = pairs
    job = jobs(2, ["--index", index, "--batch-size", "3", "--caption-key", "text", "--image-keys", "image"])
    per_rank = job.epoch(0)
    assert len({len(r["batches"]) for r in per_rank}) == 1, "equal batch counts"
    seen = [k for r in per_rank for b in r["batches"] for k in b]
    assert len(seen) == len(set(seen))
    assert sorted(seen + per_rank[0]["stats"]["remainder_keys"]) == sorted(keys)
