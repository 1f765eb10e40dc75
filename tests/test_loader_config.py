"""The loader's configuration: one typed definition (shardstream.config.LoaderConfig) whose
defaults come from the core (rust/src/defaults.rs, exported as _core.DEFAULTS)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import shardstream
from corpus import photo_jpegs
from shardstream import _core
from shardstream.config import DEFAULTS, LoaderConfig


def test_the_core_defaults_are_the_documented_ones():
    assert (DEFAULTS.image_size, DEFAULTS.caption_key, DEFAULTS.crop) == (224, "txt", "center")
    assert DEFAULTS.image_keys == ("jpg", "jpeg", "png", "webp")
    assert (DEFAULTS.max_pixels, DEFAULTS.max_member_bytes) == (64_000_000, 256 << 20)
    assert DEFAULTS.random_crop_scale == (0.9, 1.0)
    assert (DEFAULTS.loader_on_error, DEFAULTS.read_samples_on_error) == ("skip", "raise")
    assert (DEFAULTS.shuffle_buffer, DEFAULTS.read_ahead, DEFAULTS.prefetch) == (1000, 2, 2)
    assert (DEFAULTS.connect_timeout, DEFAULTS.read_timeout, DEFAULTS.max_retries) == (10.0, 30.0, 8)
    assert (DEFAULTS.backoff_initial, DEFAULTS.backoff_max, DEFAULTS.cache_max_bytes) == (0.2, 10.0, 64 << 30)


def test_shard_loader_and_read_samples_take_their_defaults_from_the_config():
    params = inspect.signature(shardstream.ShardLoader.__init__).parameters
    for field in dataclasses.fields(LoaderConfig):
        if field.default is not dataclasses.MISSING:
            assert params[field.name].default == field.default, field.name
    read = inspect.signature(shardstream.read_samples).parameters
    assert read["on_error"].default == DEFAULTS.read_samples_on_error
    assert read["max_member_bytes"].default == DEFAULTS.max_member_bytes


def test_the_binding_s_defaults_are_the_core_s():
    """decode_image without a size decodes at the core's image size."""
    jpeg = photo_jpegs(1)[0]
    assert len(_core.decode_image(jpeg)) == 3 * DEFAULTS.image_size**2


def test_a_loader_config_is_checked_once_and_frozen():
    config = LoaderConfig(batch_size=4, image_keys=["png"], random_crop_scale=[0.5, 1.0])
    assert config.image_keys == ("png",) and config.random_crop_scale == (0.5, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.batch_size = 8  # type: ignore[misc]
    for bad, message in (({"batch_size": 0}, "batch_size"), ({"on_error": "ignore"}, "on_error")):
        with pytest.raises(ValueError, match=message):
            LoaderConfig(**{"batch_size": 1, **bad})
    with pytest.raises(ValueError, match="crop"):
        LoaderConfig(batch_size=1, crop="middle")  # type: ignore[arg-type]
    core = config.core_config()
    assert core["batch_size"] == 4 and "prefetch" not in core and "seed" not in core
