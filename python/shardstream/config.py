"""The loader's configuration: one typed, frozen definition, and the defaults it starts from.

Every default lives in the Rust core (rust/src/defaults.rs), which builds its own defaults from
it and exports it as ``_core.DEFAULTS``; :data:`DEFAULTS` is its typed view here. The loader's
keyword arguments, the CLI's options, ``read_samples`` and the ``_core`` stubs all point at it,
so changing a default there changes it everywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from shardstream import _core

OnError = Literal["skip", "raise"]
Crop = Literal["center", "random"]


@dataclass(frozen=True)
class CoreDefaults:
    """The core's defaults (``_core.DEFAULTS``), by the names of the options they are for."""

    image_size: int
    # What validation and indexing decode to (smaller than the loader's; defaults.rs says why).
    scan_image_size: int
    caption_key: str
    image_keys: tuple[str, ...]
    max_pixels: int
    max_member_bytes: int
    crop: Crop
    random_crop_scale: tuple[float, float]
    random_crop_ratio: tuple[float, float]
    loader_on_error: OnError
    read_samples_on_error: OnError
    shuffle_buffer: int
    read_ahead: int
    prefetch: int
    connect_timeout: float
    read_timeout: float
    max_retries: int
    backoff_initial: float
    backoff_max: float
    retry_after_max: float
    cache_max_bytes: int


def _core_defaults() -> CoreDefaults:
    values = dict(_core.DEFAULTS)
    values["image_keys"] = tuple(values["image_keys"])
    values["random_crop_scale"] = tuple(values["random_crop_scale"])
    values["random_crop_ratio"] = tuple(values["random_crop_ratio"])
    return CoreDefaults(**values)


DEFAULTS = _core_defaults()


@dataclass(frozen=True)
class LoaderConfig:
    """What a :class:`shardstream.ShardLoader` decodes and reads with: its keyword arguments
    of the same names (see there), checked once when made. Where data comes from (urls, index,
    sources), the rank and the reader options of ``**source_options`` are not part of it."""

    batch_size: int
    image_size: int = DEFAULTS.image_size
    seed: int = 0
    shuffle_buffer: int = DEFAULTS.shuffle_buffer
    threads: int | None = None
    drop_last: bool = True
    on_error: OnError = DEFAULTS.loader_on_error
    caption_key: str = DEFAULTS.caption_key
    image_keys: tuple[str, ...] | None = None
    crop: Crop = DEFAULTS.crop
    random_crop_scale: tuple[float, float] = DEFAULTS.random_crop_scale
    random_crop_ratio: tuple[float, float] = DEFAULTS.random_crop_ratio
    samples_per_epoch: int | None = None
    read_ahead: int = DEFAULTS.read_ahead
    prefetch: int = DEFAULTS.prefetch
    max_pixels: int = DEFAULTS.max_pixels
    max_member_bytes: int = DEFAULTS.max_member_bytes
    pin_memory: bool | None = None
    connect_timeout: float = DEFAULTS.connect_timeout
    read_timeout: float = DEFAULTS.read_timeout
    max_retries: int = DEFAULTS.max_retries
    tokenizer: str | None = None
    context_length: int | None = (
        None  # tokens per caption; None: the tokenizer's own (77 for a tokenizer.json)
    )

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {self.on_error!r}")
        if self.crop not in ("center", "random"):
            raise ValueError(f"crop must be 'center' or 'random', got {self.crop!r}")
        ratio = tuple(self.random_crop_ratio)
        if not (len(ratio) == 2 and 0 < ratio[0] <= ratio[1] < float("inf")):
            raise ValueError(f"random_crop_ratio must be two aspect ratios 0 < low <= high, got {ratio}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {self.context_length}")
        # Sequences are kept as tuples, so that the configuration stays immutable.
        if self.image_keys is not None:
            object.__setattr__(self, "image_keys", tuple(self.image_keys))
        object.__setattr__(self, "random_crop_scale", tuple(self.random_crop_scale))
        object.__setattr__(self, "random_crop_ratio", ratio)

    def core_config(self) -> dict[str, Any]:
        """The options the Rust pipeline reads (``_core.Loader``'s config), by its key names.
        What the loader itself handles (seed, shuffle buffer, threads, prefetch, pinning, the
        tokenizer's resolution) is left out: the loader passes those in their resolved form."""
        handled_by_loader = (
            "seed",
            "shuffle_buffer",
            "threads",
            "samples_per_epoch",
            "prefetch",
            "pin_memory",
            "tokenizer",
            "context_length",
        )
        config = asdict(self)
        for key in handled_by_loader:
            del config[key]
        return config
