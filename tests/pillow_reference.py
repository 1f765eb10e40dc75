"""What a decoded, centre-cropped and resized image must look like: Pillow's own resize of the
fully decoded image."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

SIZE = 224


def pillow_reference(img: Image.Image, size: int = SIZE) -> np.ndarray:
    """Pillow's antialiased bicubic resize of the centred square (the shorter side scaled to
    `size`), on the fully decoded image: what our crop must look like."""
    img = ImageOps.exif_transpose(img).convert("RGB")
    w, h = img.size
    side = min(w, h)
    box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
    return np.asarray(img.resize((size, size), Image.BICUBIC, box=box)).transpose(2, 0, 1)
