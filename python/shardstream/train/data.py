"""The embedded demo dataset: small, generated on first use, and learnable by a tiny model on a CPU.

Two families of samples, mixed in random order:

* rendered shapes whose caption says what and where they are ("a red circle on the left"):
  4 colours x 3 shapes x 2 sides = 24 classes, on noisy backgrounds with jittered colour, size,
  rotation and position, so the model must read colour, shape *and* position;
* random crops of real photographs shipped inside the scikit-image and scikit-learn wheels
  ("a photo of a cat"): 8 classes. They are skipped, with a note, if those packages are absent.

Every class has a few caption templates. The held-out split is generated from a different seed
(new renders, new crops). Its images, labelled with their class, are also written as a labelled
set in CLIP_benchmark's webdataset layout (``zeroshot/``: classnames.txt, the templates of both
families in zeroshot_classification_templates.txt, ``test/{0..n-1}.tar`` with ``jpg`` + ``cls``), so
the demo's zero-shot accuracy is computed by the standard path (``shardstream.train.zeroshot``).

Generation is deterministic (fixed seeds, fixed encoder settings), so several processes that race
to create the same folder (one per node on a shared filesystem) produce identical files; the
folder is built under a temporary name and renamed into place, and the loser discards its copy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Bump when anything below changes the generated files: an old folder is then regenerated.
DEMO_VERSION = 2

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (35, 160, 55),
    "blue": (40, 70, 215),
    "yellow": (235, 200, 30),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
SIDES: tuple[str, ...] = ("left", "right")
SHAPE_TEMPLATES: tuple[str, ...] = ("{}", "a drawing of {}", "a picture of {}")

# class noun phrase -> (package, path inside the package) of the photograph it is cropped from
PHOTOS: dict[str, tuple[str, str]] = {
    "an astronaut": ("skimage", "data/astronaut.png"),
    "a cat": ("skimage", "data/chelsea.png"),
    "a cup of coffee": ("skimage", "data/coffee.png"),
    "a rocket": ("skimage", "data/rocket.jpg"),
    "a field of galaxies": ("skimage", "data/hubble_deep_field.jpg"),
    "a motorcycle": ("skimage", "data/motorcycle_left.png"),
    "a temple": ("sklearn", "datasets/images/china.jpg"),
    "a flower": ("sklearn", "datasets/images/flower.jpg"),
}
PHOTO_TEMPLATES: tuple[str, ...] = ("a photo of {}", "a picture of {}", "{}")

SPLIT_SEEDS = {"train": 1, "heldout": 2}
ZEROSHOT_SPLIT = "test"  # the labelled set's split folder (CLIP_benchmark's name for it)
JPEG_QUALITY = 90


@dataclass(frozen=True)
class DemoSpec:
    """Size of the generated dataset. The defaults give ~8k training samples, enough for the
    tiny demo model to reach high zero-shot accuracy within minutes on two CPU cores."""

    image_size: int = 64
    train_per_class: int = 250
    heldout_per_class: int = 16
    samples_per_shard: int = 1000
    seed: int = 0


@dataclass(frozen=True)
class DemoPaths:
    """Where the generated files live, as the trainer consumes them."""

    root: Path
    train_shards: list[str]
    heldout_shards: list[str]
    train_index: str | None
    heldout_index: str | None
    zeroshot: str  # the labelled set's root (CLIP_benchmark's layout)
    zeroshot_index: str | None


@dataclass(frozen=True)
class _Class:
    name: str
    prompts: tuple[str, ...]
    shape: tuple[str, str, str] | None = None  # (colour, shape, side) for rendered classes
    photo: Path | None = None


def _package_file(package: str, relative: str) -> Path | None:
    """A file shipped inside an installed package, located without importing the package
    (importing scikit-image or scikit-learn costs seconds)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def _classes() -> tuple[list[_Class], list[str]]:
    """All demo classes, plus notes about photo classes left out because a wheel is missing."""
    classes: list[_Class] = []
    for colour in COLOURS:
        for shape in SHAPES:
            for side in SIDES:
                name = f"a {colour} {shape} on the {side}"
                prompts = tuple(t.format(name) for t in SHAPE_TEMPLATES)
                classes.append(_Class(name, prompts, shape=(colour, shape, side)))
    notes = []
    for name, (package, relative) in PHOTOS.items():
        path = _package_file(package, relative)
        if path is None:
            notes.append(f"photo class {name!r} left out: {package} is not installed ({relative})")
            continue
        classes.append(_Class(name, tuple(t.format(name) for t in PHOTO_TEMPLATES), photo=path))
    return classes, notes


def demo_classes() -> dict[str, list[str]]:
    """Class name -> its captions in the demo shards."""
    return {c.name: list(c.prompts) for c in _classes()[0]}


def demo_templates() -> list[str]:
    """The zero-shot templates ({c}: the class name): every caption template of either family,
    so that each class's prompts include all of its own captions."""
    templates = [t.replace("{}", "{c}") for t in (*SHAPE_TEMPLATES, *PHOTO_TEMPLATES)]
    return list(dict.fromkeys(templates))


# -- rendering ------------------------------------------------------------------------------------


def _render_shape(rng: np.random.Generator, size: int, colour: str, shape: str, side: str) -> bytes:
    from PIL import Image, ImageDraw

    scale = 2  # draw at twice the size and downsample: anti-aliased edges
    canvas = size * scale
    base = rng.integers(150, 250)
    background = np.clip(base + rng.integers(-25, 26, size=3), 0, 255)
    pixels = np.clip(background[None, None, :] + rng.normal(0, 10, size=(canvas, canvas, 3)), 0, 255).astype(
        np.uint8
    )
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)

    radius = rng.uniform(0.11, 0.18) * canvas
    margin = radius * 1.15 + 1
    half = canvas / 2
    # The whole shape stays inside its half, so "left"/"right" is never ambiguous.
    lo, hi = (margin, half - margin) if side == "left" else (half + margin, canvas - margin)
    cx = rng.uniform(lo, max(lo, hi))
    cy = rng.uniform(margin, canvas - margin)
    fill = tuple(int(v) for v in np.clip(np.array(COLOURS[colour]) + rng.integers(-25, 26, size=3), 0, 255))
    if shape == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=fill)
    else:
        corners = 4 if shape == "square" else 3
        start = rng.uniform(-0.35, 0.35) + (math.pi / 4 if corners == 4 else -math.pi / 2)
        points = [
            (
                cx + radius * math.cos(start + 2 * math.pi * i / corners),
                cy + radius * math.sin(start + 2 * math.pi * i / corners),
            )
            for i in range(corners)
        ]
        draw.polygon(points, fill=fill)
    image = image.resize((size, size), Image.Resampling.LANCZOS)
    return _jpeg(image)


class _PhotoCropper:
    """Random square crops of one photograph, each resized to the demo image size."""

    def __init__(self, path: Path) -> None:
        from PIL import Image

        with Image.open(path) as image:
            photo = image.convert("RGB")
        # Crops never need more than ~4x the output resolution; shrinking once makes them cheap.
        shorter = min(photo.size)
        if shorter > 320:
            factor = 320 / shorter
            photo = photo.resize(
                (round(photo.width * factor), round(photo.height * factor)), Image.Resampling.LANCZOS
            )
        self.photo = photo

    def crop(self, rng: np.random.Generator, size: int) -> bytes:
        from PIL import Image

        width, height = self.photo.size
        side = int(rng.uniform(0.4, 1.0) * min(width, height))
        left = int(rng.integers(0, width - side + 1))
        top = int(rng.integers(0, height - side + 1))
        crop = self.photo.crop((left, top, left + side, top + side))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return _jpeg(crop.resize((size, size), Image.Resampling.LANCZOS))


def _jpeg(image: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=JPEG_QUALITY, optimize=False, progressive=False)  # type: ignore[attr-defined]
    return out.getvalue()


def iter_demo_samples(split: str, spec: DemoSpec = DemoSpec()) -> Iterator[dict[str, str | bytes]]:
    """Samples of one split (``"train"`` or ``"heldout"``) as ``{"__key__", "jpg", "txt", "cls"}``
    (``cls``: the class index as text), in a random but fixed class order, so shards and loader
    batches mix all classes."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"demo split must be one of {sorted(SPLIT_SEEDS)}, got {split!r}")
    classes, _ = _classes()
    per_class = spec.train_per_class if split == "train" else spec.heldout_per_class
    rng = np.random.default_rng([spec.seed, SPLIT_SEEDS[split]])
    order = np.repeat(np.arange(len(classes)), per_class)
    rng.shuffle(order)
    croppers = {c.name: _PhotoCropper(c.photo) for c in classes if c.photo is not None}
    for number, class_id in enumerate(order):
        cls = classes[int(class_id)]
        if cls.shape is not None:
            image = _render_shape(rng, spec.image_size, *cls.shape)
        else:
            image = croppers[cls.name].crop(rng, spec.image_size)
        caption = cls.prompts[int(rng.integers(len(cls.prompts)))]
        yield {"__key__": f"{split}-{number:06d}", "jpg": image, "txt": caption, "cls": str(int(class_id))}


# -- files ----------------------------------------------------------------------------------------


def _manifest(spec: DemoSpec) -> dict[str, object]:
    classes, notes = _classes()
    return {
        "version": DEMO_VERSION,
        "spec": spec.__dict__,
        "classes": [c.name for c in classes],
        "notes": notes,
    }


def _paths(root: Path, build_index: bool) -> DemoPaths:
    def shards(split: str) -> list[str]:
        return sorted(str(p) for p in (root / split).glob("shard-*.tar"))

    def index(split: str) -> str | None:
        path = root / f"{split}.index"
        return str(path) if build_index and path.exists() else None

    return DemoPaths(
        root=root,
        train_shards=shards("train"),
        heldout_shards=shards("heldout"),
        train_index=index("train"),
        heldout_index=index("heldout"),
        zeroshot=str(root / "zeroshot"),
        zeroshot_index=index("zeroshot"),
    )


def _is_current(root: Path, spec: DemoSpec) -> bool:
    try:
        with open(root / "manifest.json", encoding="utf-8") as f:
            return json.load(f) == json.loads(json.dumps(_manifest(spec)))
    except (OSError, ValueError):
        return False


def _write_split(folder: Path, split: str, spec: DemoSpec) -> list[str]:
    """The split's image-text shards; the held-out split's images with their class index also
    go to the labelled set under ``zeroshot/``."""
    from shardstream.train.zeroshot import NSHARDS_FILE
    from shardstream.writer import ShardWriter

    labelled = folder / "zeroshot" / ZEROSHOT_SPLIT
    with contextlib.ExitStack() as stack:
        captioned = stack.enter_context(
            ShardWriter(str(folder / split / "shard-%06d.tar"), max_count=spec.samples_per_shard, fsync=False)
        )
        classified = None
        if split == "heldout":
            classified = stack.enter_context(
                ShardWriter(str(labelled / "%d.tar"), max_count=spec.samples_per_shard, fsync=False)
            )
        for sample in iter_demo_samples(split, spec):
            captioned.write({k: sample[k] for k in ("__key__", "jpg", "txt")})
            if classified is not None:
                classified.write({k: sample[k] for k in ("__key__", "jpg", "cls")})
    if classified is not None:
        (labelled / NSHARDS_FILE).write_text(f"{len(classified.shards)}\n", encoding="utf-8")
    return captioned.shards


def _write_classes(folder: Path) -> None:
    from shardstream.train.zeroshot import CLASSNAMES_FILE, TEMPLATES_FILE

    root = folder / "zeroshot"
    root.mkdir(parents=True, exist_ok=True)
    (root / CLASSNAMES_FILE).write_text("".join(f"{c.name}\n" for c in _classes()[0]), encoding="utf-8")
    (root / TEMPLATES_FILE).write_text("".join(f"{t}\n" for t in demo_templates()), encoding="utf-8")


def _write_index(shards: list[str], target: Path, caption_key: str) -> None:
    """The loader's index (exact epochs; written atomically). Its shard names are the paths the
    trainer passes to the loader, which matches them by name; ``caption_key``: the member a valid
    sample must have besides its image (``cls`` in the labelled set)."""
    from shardstream.index import build_index, write_index

    write_index(build_index(shards, caption_key=caption_key), str(target))


def _zeroshot_shards(root: str) -> list[str]:
    """The labelled set's shards, named as the zero-shot loader names them (the index matches
    shards by name)."""
    from shardstream.train.zeroshot import NSHARDS_FILE, split_shards

    count = int((Path(root) / ZEROSHOT_SPLIT / NSHARDS_FILE).read_text(encoding="utf-8"))
    return split_shards(root, ZEROSHOT_SPLIT, count)


def ensure_demo_data(
    root: str | os.PathLike[str],
    spec: DemoSpec = DemoSpec(),
    *,
    build_index: bool = True,
    log: object = print,
) -> DemoPaths:
    """The demo dataset under ``root``, generated first if it is absent or out of date.

    Safe to call from several processes at once (each node's first process): everyone builds
    identical files, the first complete folder wins the rename, the others discard theirs."""
    root = Path(root)
    if not _is_current(root, spec):
        manifest = _manifest(spec)
        for note in manifest["notes"]:  # type: ignore[union-attr]
            log(f"[demo data] {note}")  # type: ignore[operator]
        log(f"[demo data] generating {root} (first run; a few seconds)")  # type: ignore[operator]
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.", suffix=".tmp"))
        try:
            counts = {split: len(_write_split(staging, split, spec)) for split in SPLIT_SEEDS}
            _write_classes(staging)
            with open(staging / "manifest.json", "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; the data is not
            if root.exists() and not _is_current(root, spec):
                shutil.rmtree(root)  # an older version: replaced as a whole
            try:
                os.rename(staging, root)
            except OSError:
                if not _is_current(root, spec):
                    raise
                # another process finished the same folder first; ours is identical
            log(f"[demo data] wrote {counts} shards to {root}")  # type: ignore[operator]
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    paths = _paths(root, build_index)
    if build_index:
        from shardstream.train.zeroshot import LABEL_KEY

        for split, shards, caption_key in (
            ("train", paths.train_shards, "txt"),
            ("heldout", paths.heldout_shards, "txt"),
            ("zeroshot", _zeroshot_shards(paths.zeroshot), LABEL_KEY),
        ):
            target = root / f"{split}.index"
            if not target.exists():
                _write_index(shards, target, caption_key)
        paths = _paths(root, build_index)
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m shardstream.train.data [ROOT]``: generate the demo dataset ahead of a run (for
    multi-node jobs whose nodes share no filesystem, run it once per node)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("root", nargs="?", default="data/demo")
    args = parser.parse_args(argv)
    paths = ensure_demo_data(args.root)
    print(json.dumps({k: str(v) for k, v in paths.__dict__.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
