"""SourceOptions: how shards are fetched, as one checked object (``source=``), and the deprecated
keyword form it replaces, on real photo shards served over HTTP and read from disk."""

from __future__ import annotations

import dataclasses
import os
import pickle
import warnings

import pytest
import shardstream
from servers import RangeHTTPServer, build_photo_shards
from shardstream import NotFoundError, OptionError, ShardLoader, SourceOptions, read_samples

FAST = {"connect_timeout": 2.0, "read_timeout": 2.0, "max_retries": 2}


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("photos")
    build_photo_shards(str(directory), shards=2, per_shard=12, seed=3)
    return str(directory)


def _names(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".tar"))


def _cached_bytes(cache: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(cache) for f in files)


def _keys(loader: ShardLoader) -> list[str]:
    return sorted(k for batch in loader for k in batch.keys)


@pytest.mark.parametrize("form", ["object", "keywords"])
def test_the_cache_option_reaches_the_reader_in_both_forms(form, photo_dir, tmp_path):
    """cache_dir is an option only the Rust reader uses: the shards land in the cache, and the
    loader yields every sample; the keyword form does the same with a DeprecationWarning."""
    cache = str(tmp_path / "cache")
    local = _keys(ShardLoader(photo_dir, batch_size=4, image_size=32, drop_last=False, threads=1))
    with RangeHTTPServer(photo_dir) as server:
        urls = [server.url(n) for n in _names(photo_dir)]
        common = dict(batch_size=4, image_size=32, drop_last=False, threads=1, **FAST)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if form == "object":
                loader = ShardLoader(urls, source=SourceOptions(cache_dir=cache), **common)
            else:
                loader = ShardLoader(urls, cache_dir=cache, **common)
        deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        if form == "object":
            assert deprecations == []
        else:
            (warning,) = deprecations
            assert "source=shardstream.SourceOptions(cache_dir=" in str(warning.message)
            assert warning.filename == __file__, "the warning points at the caller's line"
        assert _keys(loader) == local
    shard_bytes = sum(os.path.getsize(os.path.join(photo_dir, n)) for n in _names(photo_dir))
    assert _cached_bytes(cache) >= shard_bytes, "both shards were written to the cache"


def test_without_the_option_nothing_is_cached(photo_dir, tmp_path):
    """The control for the test above: the cache folder is the option's doing."""
    cache = tmp_path / "cache"
    with RangeHTTPServer(photo_dir) as server:
        urls = [server.url(n) for n in _names(photo_dir)]
        loader = ShardLoader(urls, batch_size=4, image_size=32, drop_last=False, threads=1, **FAST)
        assert len(_keys(loader)) == 24
    assert not cache.exists()


def test_read_samples_takes_the_same_object(photo_dir, tmp_path):
    cache = str(tmp_path / "cache")
    with RangeHTTPServer(photo_dir) as server:
        urls = [server.url(n) for n in _names(photo_dir)]
        samples = list(read_samples(urls, source=SourceOptions(cache_dir=cache), **FAST))
    assert len(samples) == 24 and all(s["jpg"][:2] == b"\xff\xd8" for s in samples)
    assert _cached_bytes(cache) > 0


@pytest.mark.parametrize("call", ["ShardLoader", "read_samples"])
def test_an_unknown_keyword_is_a_type_error_naming_it(call, photo_dir):
    with pytest.raises(TypeError, match="unexpected keyword argument 'endpoint'"):
        if call == "ShardLoader":
            ShardLoader(photo_dir, batch_size=4, endpoint="http://127.0.0.1:1")
        else:
            read_samples(photo_dir, endpoint="http://127.0.0.1:1")


def test_an_unknown_keyword_is_refused_with_an_index_too(photo_dir, tmp_path):
    index = shardstream.write_index(shardstream.build_index(photo_dir, decode=False), str(tmp_path / "idx"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'backof_max'"):
        ShardLoader(index=index, batch_size=4, backof_max=1.0)


def test_source_and_the_keyword_form_together_are_refused(photo_dir):
    with pytest.raises(TypeError, match="give only source="):
        ShardLoader(photo_dir, batch_size=4, source=SourceOptions(), backoff_max=1.0)
    with pytest.raises(TypeError, match="takes a shardstream.SourceOptions, got dict"):
        ShardLoader(photo_dir, batch_size=4, source={"backoff_max": 1.0})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("endpoint_url", "s3.example.com"),
        ("region", ""),
        ("profile", ""),
        ("expires_in", 0),
        ("expires_in", 8 * 24 * 3600),
        ("addressing_style", "sideways"),
        ("ca_bundle", "/no/such/bundle.pem"),
        ("backoff_initial", 0.0),
        ("backoff_max", -1.0),
        ("backoff_max", float("nan")),
        ("retry_after_max", -0.5),
        ("cache_max_bytes", 0),
        ("check", "some"),
    ],
)
def test_a_value_out_of_range_names_its_field(field, value):
    with pytest.raises(OptionError) as info:
        SourceOptions(**{field: value})
    assert info.value.option == field
    assert isinstance(info.value, ValueError), "callers that caught ValueError still do"


@pytest.mark.parametrize(
    ("field", "value"),
    [("expires_in", 60.5), ("backoff_max", "10"), ("region", 1), ("cache_max_bytes", True), ("check", None)],
)
def test_a_value_of_the_wrong_type_is_a_type_error_naming_its_field(field, value):
    with pytest.raises(TypeError, match=f"^{field} must be"):
        SourceOptions(**{field: value})


def test_the_keyword_form_is_checked_as_the_object_is(photo_dir):
    with pytest.raises(OptionError) as info:
        ShardLoader(photo_dir, batch_size=4, backoff_initial=-1.0)
    assert info.value.option == "backoff_initial"


def test_options_are_frozen_picklable_and_paths_become_strings(tmp_path):
    options = SourceOptions(cache_dir=tmp_path / "cache", region="eu-west-1")
    assert options.cache_dir == str(tmp_path / "cache")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.region = "us-east-1"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(options)) == options
    assert "expires_in" in options.keywords() and "endpoint_url" not in options.keywords()


def test_check_all_finds_a_missing_shard_when_the_loader_is_made(photo_dir):
    """The default checks the first shard of a folder; "all" checks every one, so a missing
    second shard fails at once, naming it, instead of mid-epoch."""
    paths = [os.path.join(photo_dir, n) for n in _names(photo_dir)]
    missing = os.path.join(photo_dir, "shard-000009.tar")
    loader = ShardLoader([*paths, missing], batch_size=4, drop_last=False, threads=1)
    assert len(loader._shards) == 3, "the default check ('first') lets it through to run time"
    with pytest.raises(NotFoundError, match="shard-000009.tar"):
        ShardLoader([*paths, missing], batch_size=4, source=SourceOptions(check="all"))


def test_an_index_with_check_options_plans_as_without(photo_dir, tmp_path):
    """The index's own start-up check is always of its first shard, whatever ``check`` says."""
    index = shardstream.write_index(shardstream.build_index(photo_dir, decode=False), str(tmp_path / "idx"))
    keys = {}
    for check in ("first", "all", "none"):
        loader = ShardLoader(
            index=index, batch_size=4, image_size=32, threads=1, source=SourceOptions(check=check)
        )
        keys[check] = [k for batch in loader for k in batch.keys]
    assert len(keys["first"]) == 24 and keys["first"] == keys["all"] == keys["none"]
