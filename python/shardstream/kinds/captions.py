"""Image-caption pairs for the interleaved kind: a WebDataset tar of ``KEY.jpg`` + ``KEY.txt``
(CLIP data, as :class:`~shardstream.ShardLoader` reads it), or a Parquet file of ``jpg`` and
``txt`` columns (img2dataset), read as one-image documents, so a
VLM mixture (:class:`~shardstream.VlmMixture`) takes caption data beside interleaved documents
and text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardstream.errors import OptionError


@dataclass(frozen=True)
class Captions:
    """Reads image-caption pairs as one-image documents, for
    :func:`~shardstream.count_interleaved`'s ``layout=``: the image (its tokens masked), then
    the caption (learned), then the EOS. From tars, the keys are member extensions; from
    Parquet, column names (an image column is binary or a ``datasets`` Image struct): a
    ``datasets`` file of ``image`` and ``caption`` is
    ``Captions(image_keys=("image",), caption_key="caption")``.

    A pair without an image member (a null image) is skipped as ``missing_image``; without a
    caption member (a null caption), or with an empty one, as ``missing_text``; a caption that
    is not UTF-8 as ``bad_utf8``.

    Attributes:
        image_keys: The image member: the first of these extensions the sample has (Parquet:
            the first of these columns the file has).
        caption_key: The caption member's extension (Parquet: column).
    """

    image_keys: tuple[str, ...] = ("jpg", "jpeg", "png", "webp")
    caption_key: str = "txt"

    def __post_init__(self) -> None:
        if isinstance(self.image_keys, str) or not self.image_keys:
            keys = self.image_keys
            raise OptionError("captions.image_keys", f"must be a non-empty tuple of extensions, not {keys!r}")
        if not isinstance(self.caption_key, str) or not self.caption_key:
            raise OptionError("captions.caption_key", f"must be an extension, not {self.caption_key!r}")

    def settings(self) -> dict[str, Any]:
        """Its fields as the counts record them (and the core reads them)."""
        return {"kind": "captions", "image_keys": list(self.image_keys), "caption_key": self.caption_key}
