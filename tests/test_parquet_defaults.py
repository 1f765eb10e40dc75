"""What a new user meets with no flags: Parquet files as Hugging Face ``datasets`` writes them
(an ``image`` column of the ``Image`` feature, a ``text`` column) read with the default keys,
and the passes and indexes that can hold no sample (a file without an image column, a wrong
caption key, a text-only corpus) failing loudly instead of coming out empty.

Real photos (tests/corpus.py) written by ``datasets`` itself, and img2dataset's own test file
in ``/work/shared/data`` (a URL list: ``URL`` and ``TEXT``, no image column)."""

from __future__ import annotations

import json
import os

import pytest
import shardstream
from parquet_corpus import samples_for, write_pairs
from shardstream.cli import main
from shardstream.errors import OptionError, SampleError
from shardstream.index import load_index

URL_LIST = "/work/shared/data/img2dataset-test_1000.parquet"  # URL, TEXT: no image column


def by_key(loader) -> dict[str, tuple[bytes, str]]:
    out = {}
    for batch in loader:
        for i, key in enumerate(batch.keys):
            out[key] = (batch.images[i].numpy().tobytes(), batch.texts[i])
    return out


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """``part-NN.parquet`` as ``datasets`` writes them, and the same samples as tars."""
    d = tmp_path_factory.mktemp("hf")
    return write_pairs(str(d), [10, 7], seed=40, layout="hf")


def write_two_images(path: str, n: int = 6) -> str:
    """A ``datasets`` file with two ``Image`` columns (``image``, ``thumb``): no default choice."""
    import datasets

    samples = samples_for(0, n, seed=7)
    features = datasets.Features(
        {"image": datasets.Image(), "thumb": datasets.Image(), "text": datasets.Value("string")}
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": s["jpg"], "path": None} for _, s in samples],
            "thumb": [{"bytes": s["jpg"], "path": None} for _, s in samples],
            "text": [s["txt"] for _, s in samples],
        },
        features=features,
    )
    ds.to_parquet(path, batch_size=4)
    return path


def test_datasets_files_need_no_flags_in_index_validate_inspect_and_the_loader(hf, tmp_path, capsys):
    parquets, tars, keys = hf
    out = str(tmp_path / "idx")
    assert main(["index", *parquets, "-o", out]) == 0
    index = load_index(out)
    assert (index.num_samples, index.num_valid) == (len(keys), len(keys)), "every photo decoded and valid"
    assert main(["validate", *parquets]) == 0
    capsys.readouterr()
    assert main(["inspect", parquets[0], "-n", "1", "--json"]) == 0
    members = {m["ext"]: m for m in json.loads(capsys.readouterr().out)["members"]}
    assert members["image"]["format"] == "jpeg" and members["image"]["width"] > 0
    assert members["text"]["text"].startswith("photo number ")
    from_tars = by_key(shardstream.ShardLoader(tars, batch_size=4, image_size=48, drop_last=False))
    for index_arg in (None, out):
        loader = shardstream.ShardLoader(
            parquets, index=index_arg, batch_size=4, image_size=48, drop_last=False
        )
        assert by_key(loader) == from_tars, "pixels and captions of the tars, from the default keys"
        assert loader.stats["skipped_total"] == 0


def test_several_image_columns_are_refused_naming_them_and_the_option(tmp_path, capsys):
    path = write_two_images(str(tmp_path / "two.parquet"))
    out = str(tmp_path / "idx")
    assert main(["index", path, "-o", out]) == 1
    err = capsys.readouterr().err
    assert "missing_column" in err and "(image, thumb)" in err and "--image-keys" in err, err
    assert not os.path.exists(out), "no index of 0 samples written"
    assert main(["validate", path]) == 1
    assert "(image, thumb)" in capsys.readouterr().out
    with pytest.raises(SampleError, match=r"\(image, thumb\)") as raised:
        list(shardstream.ShardLoader(path, batch_size=2, image_size=32))
    assert raised.value.reason == "missing_column"
    # Named, it reads.
    assert main(["index", path, "-o", out, "--image-keys", "thumb"]) == 0
    assert load_index(out).num_valid == 6
    loader = shardstream.ShardLoader(path, batch_size=2, image_size=32, image_keys=["thumb"])
    assert sum(len(b.keys) for b in loader) == 6


def test_an_index_where_every_file_failed_exits_1_naming_the_reason(tmp_path, capsys):
    out = str(tmp_path / "idx")
    assert main(["index", URL_LIST, "-o", out]) == 1
    err = capsys.readouterr().err
    assert "missing_column" in err and "no image column" in err, err
    assert "img2dataset-test_1000.parquet" in err, err
    assert not os.path.exists(out)
    assert main(["validate", URL_LIST]) == 1


def test_an_index_where_every_sample_is_invalid_exits_1(hf, tmp_path, capsys):
    _, tars, _ = hf
    # Real photos, a caption member no sample has: every sample invalid, no shard failed.
    status = main(["index", *tars, "-o", str(tmp_path / "idx"), "--caption-key", "nope"])
    err = capsys.readouterr().err
    assert status == 1 and "missing_caption (17 samples)" in err, err


def test_no_image_keys_is_refused_naming_the_text_kind():
    with pytest.raises(OptionError) as raised:
        shardstream.ShardLoader(URL_LIST, batch_size=8, caption_key="TEXT", image_keys=[])
    message = str(raised.value)
    assert raised.value.option == "image_keys" and "\n" not in message
    assert "shardstream.TextLoader" in message and "shardstream.count_tokens" in message


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_that_skips_every_sample_raises_with_the_top_reason(workers):
    # Several readers without an index stream to a quota: every sample failing, the cycle
    # over the shards must end (it cycled forever).
    quota = {"samples_per_epoch": 1000} if workers else {}
    loader = shardstream.ShardLoader(URL_LIST, batch_size=8, image_size=32, threads=1, **quota)
    batches = loader if workers == 0 else loader.dataloader(workers)
    with pytest.raises(SampleError) as raised:
        for _ in batches:
            pass
    assert raised.value.reason == "missing_image"
    if not workers:  # with a quota, the pass stops after a cycle and a shuffle block's worth
        assert "1,000 of 1,000" in str(raised.value), str(raised.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_planned_pass_of_photos_with_a_wrong_caption_key_raises(hf, tmp_path, workers):
    parquets, _, keys = hf
    out = str(tmp_path / "idx")
    assert main(["index", *parquets, "-o", out, "-q", "--image-keys", "image", "--caption-key", "text"]) == 0
    # Indexed valid; read with a caption column the files lack: every sample fails at run time.
    loader = shardstream.ShardLoader(
        parquets, index=out, batch_size=4, image_size=32, image_keys=["image"], caption_key="caption"
    )
    batches = loader if workers == 0 else loader.dataloader(workers)
    with pytest.raises(SampleError) as raised:
        for _ in batches:
            pass
    assert raised.value.reason == "missing_caption", str(raised.value)


def test_a_pass_with_some_good_samples_does_not_raise(hf):
    parquets, tars, keys = hf
    # The tars have `txt`, the Parquet files' captions resolve too: a mixed, fully good list...
    # ...and a URL list beside real photos: its 1,000 rows skip, the photos still batch.
    loader = shardstream.ShardLoader([tars[0], URL_LIST], batch_size=4, image_size=32, drop_last=False)
    assert sum(len(b.keys) for b in loader) == 10
    assert loader.stats["skipped"]["missing_image"] == 1000
