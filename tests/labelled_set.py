"""A labelled set in CLIP_benchmark's webdataset layout for the zero-shot tests (no tests here):
random crops of real photographs shipped in scikit-image's wheel, one photograph per class.

    ROOT/classnames.txt, ROOT/zeroshot_classification_templates.txt,
    ROOT/test/nshards.txt, ROOT/test/0.tar ... (KEY.jpg or KEY.png, KEY.cls), and ROOT/test.index
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# class name -> photograph in skimage/data
PHOTOS = {
    "an astronaut": "astronaut.png",
    "a cat": "chelsea.png",
    "a cup of coffee": "coffee.png",
    "a rocket": "rocket.jpg",
    "a field of galaxies": "hubble_deep_field.jpg",
    "a motorcycle": "motorcycle_left.png",
    "a horse": "horse.png",
    "a retina": "retina.jpg",
}
TEMPLATES = ("a photo of {c}.", "a crop of a picture of {c}.", "{c}")


@dataclass(frozen=True)
class LabelledSet:
    root: str
    index: str
    classnames: list[str]
    templates: list[str]
    samples: int
    shards: list[str]


def _photo(name: str) -> object:
    import importlib.util

    from PIL import Image

    spec = importlib.util.find_spec("skimage")
    assert spec is not None and spec.submodule_search_locations, "scikit-image is a test requirement"
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    with Image.open(path) as image:
        return image.convert("RGB")  # horse.png is a mask: grey crops are a class too


def _encoded(image: object, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))  # type: ignore[attr-defined]
    return out.getvalue()


def build_labelled_set(
    root: Path, *, per_class: int = 30, samples_per_shard: int = 64, size: int = 64, seed: int = 0
) -> LabelledSet:
    """``per_class`` crops of each photograph, in a fixed random order, every third one a PNG (the
    layout allows webp, png, jpg and jpeg), with its index built on the ``cls`` member."""
    from shardstream.index import build_index, write_index
    from shardstream.writer import ShardWriter

    rng = np.random.default_rng(seed)
    classnames = list(PHOTOS)
    photos = [_photo(PHOTOS[c]) for c in classnames]
    order = np.repeat(np.arange(len(classnames)), per_class)
    rng.shuffle(order)
    split = root / "test"
    with ShardWriter(str(split / "%d.tar"), max_count=samples_per_shard, fsync=False) as writer:
        for number, label in enumerate(order):
            photo = photos[int(label)]
            width, height = photo.size  # type: ignore[attr-defined]
            side = int(rng.uniform(0.3, 0.9) * min(width, height))
            left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
            crop = photo.crop((left, top, left + side, top + side)).resize((size, size))  # type: ignore[attr-defined]
            ext, fmt = ("png", "PNG") if number % 3 == 2 else ("jpg", "JPEG")
            writer.write(
                {"__key__": f"sample-{number:05d}", ext: _encoded(crop, fmt), "cls": str(int(label))}
            )
    shards = [str(split / f"{i}.tar") for i in range(len(writer.shards))]
    (split / "nshards.txt").write_text(f"{len(shards)}\n")
    (root / "classnames.txt").write_text("".join(f"{c}\n" for c in classnames))
    (root / "zeroshot_classification_templates.txt").write_text("".join(f"{t}\n" for t in TEMPLATES))
    index = str(root / "test.index")
    write_index(build_index(shards, caption_key="cls"), index)
    return LabelledSet(str(root), index, classnames, list(TEMPLATES), len(order), shards)
