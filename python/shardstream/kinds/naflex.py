"""The NaFlex sample kind: each image at its own aspect ratio, resized so that its patch grid
fits a budget, as a padded sequence of flattened patches (SigLIP 2's NaFlex input).

The grid of every image is the one ``transformers``' ``Siglip2ImageProcessor`` (and its PIL
twin) computes (``get_image_size_for_max_num_patches``), and the patches are flattened in its
``convert_image_to_patches`` order, so a model trained with that processor sees the same
``spatial_shapes``; the pixels are uint8 (rescale and normalise on the device:
``pixel_values / 127.5 - 1`` is the processors' mean 0.5, std 0.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from shardstream.errors import OptionError

# The core's bounds (rust/src/batch/kit/patches.rs): a patch side and a budget per image.
MAX_PATCH_SIZE = 256
MAX_NUM_PATCHES = 65_536


class NaFlexBatch(NamedTuple):
    """One batch of a :class:`~shardstream.ShardLoader` made with ``sample=NaFlex(...)``.

    ``B`` is the batch size (smaller only for an epoch's last batch with ``drop_last=False``),
    ``N`` is ``max_num_patches`` and ``p`` is ``patch_size``; the i-th entry of every field
    belongs to the same sample. The field names are the model inputs of
    ``transformers.Siglip2Model``.

    Attributes:
        pixel_values: ``torch.uint8`` ``[B, N, 3 * p * p]``: each image's patches, row-major
            over its grid, each flattened as (y, x, channel); patches past the grid are zeros.
            Not rescaled or normalised (do it on the device). A numpy array without torch.
        pixel_attention_mask: ``torch.int32`` ``[B, N]``: 1 for the image's patches, 0 for
            padding (the processors' dtype).
        spatial_shapes: ``torch.int64`` ``[B, 2]``: each image's patch grid (rows, columns).
        texts: The captions, ``B`` strings.
        keys: The samples' keys (``__key__``), ``B`` strings.
        urls: The URL of the shard each sample came from (redacted).
        tokens: With ``tokenizer=``: ``torch.int64`` ``[B, context_length]``; else None.
    """

    pixel_values: Any
    pixel_attention_mask: Any
    spatial_shapes: Any
    texts: list[str]
    keys: list[str]
    urls: list[str]
    tokens: Any = None


def _range(name: str, value: Any, *, upper: float | None = None) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise OptionError(name, f"must be two numbers (low, high), not {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi and (upper is None or hi <= upper)):
        bound = f" <= {upper}" if upper is not None else ""
        raise OptionError(name, f"must satisfy 0 < low <= high{bound}, not {value!r}")
    return lo, hi


@dataclass(frozen=True)
class NaFlex:
    """The NaFlex kind's spec: ``ShardLoader(urls, batch_size=..., sample=NaFlex(...))``.

    Each image keeps its aspect ratio; its patch grid is the largest that fits
    ``max_num_patches`` by ``Siglip2ImageProcessor``'s rule (both sides multiples of
    ``patch_size``, at least one patch; small images are upscaled, as the processor does). It is
    decoded at the smallest JPEG DCT scale that covers that size, resized to it with Pillow's
    BILINEAR filter (the processors' ``resample``) and written as patches straight into the
    batch. Batches hold ``batch_size`` images each, so every epoch contract of the square kind
    holds unchanged.

    Attributes:
        patch_size: Pixels a side of a square patch (SigLIP 2: 16, or 14).
        max_num_patches: The budget per image, and ``N``, the padded sequence length.
        min_num_patches: An image whose grid has fewer patches (possible only at extreme aspect
            ratios, where one side is held at one patch) is skipped with reason
            ``too_few_patches`` and counted. None: no minimum.
        random_crop: False: the whole image, as the processors see it (evaluation, and what
            the reference comparison assumes). True: a random crop per sample (training),
            seeded by (seed, epoch, key) like the square kind's.
        random_crop_scale: With ``random_crop``: the crop's area as a fraction of the image's
            (default ``(0.8, 1.0)``, not the square kind's ``(0.9, 1.0)``, which is open_clip's
            transform's: pass the range your recipe uses).
        random_crop_ratio: With ``random_crop``: the crop's aspect ratio as a factor of the
            image's own, drawn log-uniformly (jitter around the image's shape, not a square's).

    Raises:
        OptionError: A value out of range: ``patch_size`` not in 1..256, ``max_num_patches``
            not in 1..65536 (a budget under one patch holds no image), ``min_num_patches``
            above ``max_num_patches``, or a crop range that is not one.
    """

    patch_size: int = 16
    max_num_patches: int = 256
    min_num_patches: int | None = None
    random_crop: bool = False
    random_crop_scale: tuple[float, float] = (0.8, 1.0)
    random_crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        for name, upper in (("patch_size", MAX_PATCH_SIZE), ("max_num_patches", MAX_NUM_PATCHES)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
                raise OptionError(name, f"must be an integer in 1..{upper}, not {value!r}")
        low = self.min_num_patches
        if low is not None and (
            isinstance(low, bool) or not isinstance(low, int) or not 0 <= low <= self.max_num_patches
        ):
            raise OptionError(
                "min_num_patches", f"must be None or an integer in 0..max_num_patches, not {low!r}"
            )
        object.__setattr__(
            self, "random_crop_scale", _range("random_crop_scale", self.random_crop_scale, upper=1)
        )
        object.__setattr__(self, "random_crop_ratio", _range("random_crop_ratio", self.random_crop_ratio))

    @property
    def patch_len(self) -> int:
        """Bytes of one flattened patch: ``3 * patch_size ** 2``."""
        return 3 * self.patch_size**2

    def buffer_shape(self, batch_size: int) -> tuple[int, int, int]:
        """The shape of a batch's ``pixel_values``: ``(batch_size, max_num_patches, patch_len)``.

        Args:
            batch_size: Images per batch.

        Returns:
            The shape tuple.
        """
        return (batch_size, self.max_num_patches, self.patch_len)

    def core_config(self) -> dict[str, Any]:
        """What the Rust pipeline reads of this kind (``_core.sample_pipeline``'s ``naflex`` key).

        Returns:
            ``{"naflex": spec}``, spec the dict of :func:`_core_spec`.
        """
        crop = (self.random_crop_scale, self.random_crop_ratio) if self.random_crop else None
        return {"naflex": _core_spec(self.patch_size, self.max_num_patches, self.min_num_patches, crop)}

    def make_batch(
        self,
        pixels: Any,
        grids: list[tuple[int, int]],
        texts: list[str],
        keys: list[str],
        urls: list[str],
        tokens: Any,
        length: int | None = None,
    ) -> NaFlexBatch:
        """The batch of a filled buffer: the mask and ``spatial_shapes`` from the grids.

        Args:
            pixels: The filled ``[n, L, patch_len]`` uint8 buffer (torch or numpy).
            grids: Each sample's (rows, columns), ``n`` of them.
            texts: The captions.
            keys: The sample keys.
            urls: The shard URLs.
            tokens: The token tensor, or None.
            length: ``L``, the patches of each sample's slot: ``max_num_patches`` (None), or a
                token-budget batch's bucket length.

        Returns:
            The :class:`NaFlexBatch`.
        """
        import numpy as np  # here, so that `import shardstream` stays free of numpy

        shapes = np.asarray(grids, dtype=np.int64).reshape(-1, 2)
        counts = shapes[:, 0] * shapes[:, 1]
        slot = self.max_num_patches if length is None else length
        mask = (np.arange(slot)[None, :] < counts[:, None]).astype(np.int32)
        if not isinstance(pixels, np.ndarray):  # torch: the same types as the pixels
            import torch

            shapes, mask = torch.from_numpy(shapes), torch.from_numpy(mask)
        return NaFlexBatch(pixels, mask, shapes, texts, keys, urls, tokens)


def _core_spec(
    patch_size: int,
    max_num_patches: int,
    min_num_patches: int | None,
    random_crop: tuple[tuple[float, float], tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The one form the core takes a NaFlex spec in (``_core.settings_keys("NaFlex spec")``):
    ``min_num_patches`` None is 0 (no floor); ``random_crop`` is (scale, ratio) or None."""
    return {
        "patch_size": patch_size,
        "max_num_patches": max_num_patches,
        "min_num_patches": min_num_patches or 0,
        "random_crop": random_crop,
    }
