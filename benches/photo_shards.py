"""Benchmark shards built from real photographs shipped in the scikit-image and scikit-learn
wheels: random crops re-encoded as 256-512 px JPEGs (what img2dataset output looks like), with
real web alt-text captions from ../shared/data/img2dataset-test_1000.parquet."""

from __future__ import annotations

import io
import os
import random
import sys
import tarfile

# The list of real photos lives once, with the test corpus.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from corpus import photo_paths  # noqa: E402


def captions() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    for base in (os.path.join(here, "..", "..", "shared"), "/work/shared"):
        path = os.path.join(base, "data", "img2dataset-test_1000.parquet")
        if os.path.exists(path):
            import pyarrow.parquet as pq

            return [str(t) for t in pq.read_table(path).column("TEXT").to_pylist() if t]
    return [f"a photo number {i}" for i in range(1000)]


def build(
    directory: str, *, shards: int, per_shard: int, seed: int = 0, min_side: int = 256, max_side: int = 512
) -> list[str]:
    """Writes the shards once (cached by name) and returns their paths."""
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    paths = [
        os.path.join(directory, f"photos-{seed}-{min_side}-{max_side}-{i:04d}.tar") for i in range(shards)
    ]
    if all(os.path.exists(p) for p in paths):
        return paths
    rng = random.Random(seed)
    photos = [Image.open(p).convert("RGB") for p in photo_paths()]
    texts = captions()
    n = 0
    for path in paths:
        tmp = path + ".tmp"
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
            for _ in range(per_shard):
                photo = photos[rng.randrange(len(photos))]
                w, h = photo.size
                cw = rng.randint(min(w, 200), w)
                ch = rng.randint(min(h, 200), h)
                x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
                crop = photo.crop((x, y, x + cw, y + ch))
                side = rng.randint(min_side, max_side)
                scale = side / min(cw, ch)
                crop = crop.resize((max(1, round(cw * scale)), max(1, round(ch * scale))), Image.BICUBIC)
                buf = io.BytesIO()
                crop.save(buf, format="JPEG", quality=rng.randint(80, 95))
                key = f"{n:08d}"
                for ext, data in (("jpg", buf.getvalue()), ("txt", texts[n % len(texts)].encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                n += 1
        os.replace(tmp, path)
    return paths
