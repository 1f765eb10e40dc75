"""Interleaved image-text documents (OBELICS / MINT-1T layouts) for the interleaved kind's tests and
benchmark, built from real data only: photos shipped in the scikit-image, scikit-learn and
matplotlib wheels, and the 1,000 real web captions of img2dataset's test parquet (see
data/PROVENANCE.md; that parquet holds captions and URLs, not images).

A document is ``{"key": str, "texts": [str | None, ...], "images": [bytes | None, ...]}``: the two
lists are aligned, and at each position exactly one of them is not None (OBELICS). Every image is
a JPEG of a real photo, cut and resized to one of several size classes (tiny 32-90 px, small,
medium, large 1024-1600 px, thin strips, and sizes whose side / 28 ends in .5, where Python's
round-half-to-even in ``smart_resize`` differs from rounding half away from zero); a few are
grayscale, progressive or 4:4:4 JPEGs.

Document ``i`` of a seed is drawn from its own generator, seeded by ``(seed, i)``: it does not
depend on ``n``, so ``real_documents(3)`` is a prefix of ``real_documents(400)``. Documents 0-2 are
the fixed cases: 0 starts with an image, 1 is text only (two text positions in a row), 2 is image
only.

Writers: :func:`write_obelics_parquet` (``key``, ``texts: list<string>``, ``images:
list<struct<bytes, path>>`` as ``datasets``' ``Image`` feature, or ``list<binary>``) and
:func:`write_mint_tar` (a WebDataset tar: ``KEY.json`` names each image member by its extension).
Neither checks the documents, so the bad-input builders below write broken ones with them.
"""

from __future__ import annotations

import io
import json
import os
import random
import tarfile
from functools import lru_cache

DATA_DIR = os.environ.get("SHARDSTREAM_TEST_DATA", "/work/shared/data")
CAPTIONS_PARQUET = os.path.join(DATA_DIR, "img2dataset-test_1000.parquet")

#: Real colour photographs in scikit-image's wheel (file, size): the corpus's main source.
SKIMAGE_PHOTOS = (
    "astronaut.png",  # 512x512
    "chelsea.png",  # 451x300
    "coffee.png",  # 600x400
    "rocket.jpg",  # 427x640
    "motorcycle_left.png",  # 741x500
    "hubble_deep_field.jpg",  # 1000x872
    "retina.jpg",  # 1411x1411
    "ihc.png",  # 512x512
)
#: A grayscale photograph: some images of the corpus are single-channel JPEGs.
SKIMAGE_GRAY = "camera.png"

# (name, weight, sizes or None for a random size of the class)
SIZE_CLASSES = (
    ("tiny", 12, ((60, 40), (40, 60), (32, 32), (90, 30), (30, 90))),
    ("small", 22, None),
    ("medium", 30, None),
    ("large", 12, ((1200, 800), (800, 1200), (1024, 1024), (1600, 900))),
    ("strip", 8, ((1000, 80), (70, 900), (1400, 56))),
    # a side / 28 that ends in .5 (70 = 2.5 x 28, 126 = 4.5 x 28, 182 = 6.5 x 28): within the pixel
    # bounds, smart_resize's round() takes the even neighbour (56, 112, 168), not the upper one
    ("tie", 10, ((126, 70), (70, 126), (182, 98), (350, 182))),
)


# -- real photos and captions ------------------------------------------------------------------------


def photo_paths() -> list[str]:
    """The real photographs found in installed wheels (colour ones; the grayscale one apart)."""
    import skimage

    skimage_data = os.path.join(os.path.dirname(skimage.__file__), "data")
    paths = [os.path.join(skimage_data, n) for n in SKIMAGE_PHOTOS]
    try:
        import sklearn

        images = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "images")
        paths += [os.path.join(images, n) for n in ("china.jpg", "flower.jpg")]
    except ImportError:
        pass
    try:
        import matplotlib

        paths.append(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg"))
    except ImportError:
        pass
    return [p for p in paths if os.path.exists(p)]


@lru_cache(maxsize=1)
def photos_rgb() -> tuple:
    """The colour photos, decoded once (PIL images in RGB)."""
    from PIL import Image

    out = []
    for path in photo_paths():
        with Image.open(path) as im:
            out.append(im.convert("RGB"))
    if not out:
        raise RuntimeError("no real photos found: install scikit-image (requirements/dev.txt)")
    return tuple(out)


@lru_cache(maxsize=1)
def photo_gray():
    """The grayscale photo (PIL, mode L), or None where scikit-image lacks it."""
    import skimage
    from PIL import Image

    path = os.path.join(os.path.dirname(skimage.__file__), "data", SKIMAGE_GRAY)
    if not os.path.exists(path):
        return None
    with Image.open(path) as im:
        return im.convert("L")


@lru_cache(maxsize=1)
def captions() -> tuple[str, ...]:
    """The real web captions (non-empty), in the parquet's order."""
    import pyarrow.parquet as pq

    texts = pq.read_table(CAPTIONS_PARQUET, columns=["TEXT"]).column("TEXT").to_pylist()
    return tuple(t for t in texts if t)


# -- images ------------------------------------------------------------------------------------------


def encode_jpeg(img, *, quality: int = 90, progressive: bool = False, subsampling: int = -1) -> bytes:
    """JPEG bytes of a PIL image (``subsampling`` 0 = 4:4:4, 2 = 4:2:0, -1 = Pillow's default)."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, progressive=progressive, subsampling=subsampling)
    return buf.getvalue()


def cut(photo, width: int, height: int, rng: random.Random):
    """A crop of ``photo`` with the aspect ratio ``width:height`` (between 30% and all of the
    largest such crop, at a random place), resized to ``width x height`` (LANCZOS)."""
    from PIL import Image

    pw, ph = photo.size
    aspect = width / height
    cw, ch = (pw, max(1, round(pw / aspect))) if pw / ph <= aspect else (max(1, round(ph * aspect)), ph)
    scale = rng.uniform(0.3, 1.0)
    cw, ch = max(1, min(pw, round(cw * scale))), max(1, min(ph, round(ch * scale)))
    x, y = rng.randint(0, pw - cw), rng.randint(0, ph - ch)
    return photo.crop((x, y, x + cw, y + ch)).resize((width, height), Image.Resampling.LANCZOS)


def image_size(rng: random.Random, size_class: str | None = None) -> tuple[int, int]:
    """(width, height) of an image of ``size_class`` (drawn by weight when None)."""
    classes = {name: sizes for name, _, sizes in SIZE_CLASSES}
    if size_class is None:
        size_class = rng.choices([c[0] for c in SIZE_CLASSES], weights=[c[1] for c in SIZE_CLASSES])[0]
    sizes = classes[size_class]
    if sizes is not None:
        return rng.choice(sizes)
    lo, hi = (100, 300) if size_class == "small" else (300, 700)
    side = rng.randint(lo, hi)
    aspect = rng.uniform(0.5, 2.0)
    return (
        (max(lo // 2, round(side * aspect)), side)
        if rng.random() < 0.5
        else (side, max(lo // 2, round(side / aspect)))
    )


def real_image(rng: random.Random, size_class: str | None = None) -> bytes:
    """A JPEG of a real photo (1 in 12 grayscale; some progressive, some 4:4:4)."""
    width, height = image_size(rng, size_class)
    gray = photo_gray()
    photo = gray if gray is not None and rng.random() < 1 / 12 else rng.choice(photos_rgb())
    return encode_jpeg(
        cut(photo, width, height, rng),
        quality=rng.randint(75, 95),
        progressive=rng.random() < 1 / 6,
        subsampling=0 if rng.random() < 1 / 6 else -1,
    )


# -- text --------------------------------------------------------------------------------------------


def real_text(rng: random.Random) -> str:
    """One real caption, or a paragraph of 2-40 of them (joined by spaces, ". " or a blank line)."""
    caps = captions()
    r = rng.random()
    if r < 0.4:
        return rng.choice(caps)
    count = rng.randint(2, 8) if r < 0.85 else rng.randint(15, 40)
    sep = rng.choice([" ", ". ", "\n\n"])
    start = rng.randrange(len(caps))
    return sep.join(caps[(start + j) % len(caps)] for j in range(count))


# -- documents ---------------------------------------------------------------------------------------


def document_key(seed: int, i: int) -> str:
    """Keys carry no dot (a WebDataset key ends at the first dot of a member's name)."""
    return f"doc-s{seed}-{i:05d}"


def _layout(rng: random.Random, i: int) -> list[str]:
    """The kinds of positions, "t" or "i", of document ``i``."""
    if i == 0:
        return ["i", "t", "i", "t"]  # starts with an image
    if i == 1:
        return ["t", "t"]  # text only: two text positions in a row, concatenated as they are
    if i == 2:
        return ["i"] if rng.random() < 0.5 else ["i", "i"]  # image only
    images = rng.choice([0, 1, 1, 2, 2, 3, 4])
    out: list[str] = []
    for _ in range(images):
        if rng.random() < 0.8:
            out.append("t")
            if rng.random() < 0.1:
                out.append("t")
        out.append("i")
    if not out or rng.random() < 0.6:
        out.append("t")
    return out


def real_document(i: int, seed: int = 0) -> dict:
    """Document ``i`` of ``seed`` (see the module's docstring)."""
    rng = random.Random(f"interleaved:{seed}:{i}")
    texts: list[str | None] = []
    images: list[bytes | None] = []
    for kind in _layout(rng, i):
        if kind == "t":
            texts.append(real_text(rng))
            images.append(None)
        else:
            texts.append(None)
            images.append(real_image(rng))
    return {"key": document_key(seed, i), "texts": texts, "images": images}


def real_documents(n: int, seed: int = 0) -> list[dict]:
    """``n`` documents of real text and photos, deterministic for ``seed`` (fresh dicts on every
    call: callers may change them)."""
    return [real_document(i, seed) for i in range(n)]


# -- writers -----------------------------------------------------------------------------------------


def _image_struct(entry, position: int, key: str) -> dict | None:
    if entry is None:
        return None
    if isinstance(entry, dict):  # given as is: a URL-only image, a path without bytes
        return {"bytes": entry.get("bytes"), "path": entry.get("path")}
    # a file name on every other image, as datasets writes for images read from files; the reader
    # must take the bytes whenever they are there
    return {"bytes": bytes(entry), "path": f"{key}-{position}.jpg" if position % 2 else None}


def obelics_table(docs: list[dict], image_kind: str = "struct", *, hf_features: bool = False):
    """The pyarrow table of :func:`write_obelics_parquet`."""
    import pyarrow as pa

    if image_kind == "struct":
        image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        images = [[_image_struct(e, j, d["key"]) for j, e in enumerate(d["images"])] for d in docs]
    elif image_kind == "binary":
        image_type = pa.binary()
        images = []
        for d in docs:
            if any(isinstance(e, dict) for e in d["images"]):
                raise ValueError(f"{d['key']}: a URL/path image needs image_kind='struct'")
            images.append([None if e is None else bytes(e) for e in d["images"]])
    else:
        raise ValueError(f"image_kind must be 'struct' or 'binary', not {image_kind!r}")
    table = pa.table(
        {
            "key": pa.array([d["key"] for d in docs], pa.string()),
            "texts": pa.array([list(d["texts"]) for d in docs], pa.list_(pa.string())),
            "images": pa.array(images, pa.list_(image_type)),
        }
    )
    if hf_features:
        if image_kind != "struct":
            raise ValueError("hf_features needs image_kind='struct' (datasets' Image feature)")
        import datasets

        features = datasets.Features(
            {
                "key": datasets.Value("string"),
                "texts": datasets.List(datasets.Value("string")),
                "images": datasets.List(datasets.Image()),
            }
        )
        table = table.replace_schema_metadata(features.arrow_schema.metadata)
    return table


def write_obelics_parquet(
    path: str,
    docs: list[dict],
    row_group_size: int = 8,
    image_kind: str = "struct",
    *,
    hf_features: bool = False,
) -> str:
    """One row per document: ``key: string``, ``texts: list<string>`` and ``images:
    list<struct<bytes: binary, path: string>>`` (``image_kind="struct"``, datasets' ``Image``
    layout; every other image also names a file in ``path``, which a reader must ignore when
    ``bytes`` is set) or ``list<binary>`` (``"binary"``). A null list element where the other list
    holds the position's value. An image entry given as a dict (``{"bytes": None, "path": URL}``)
    is written as is. ``hf_features`` adds datasets' schema metadata (``List(Image())``), so
    ``load_dataset`` decodes the images itself. Returns ``path``."""
    import pyarrow.parquet as pq

    pq.write_table(
        obelics_table(docs, image_kind, hf_features=hf_features), path, row_group_size=row_group_size
    )
    return path


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def mint_members(doc: dict, *, missing: frozenset[int] = frozenset()) -> list[tuple[str, bytes]]:
    """The tar members of one document: ``KEY.json`` (``{"texts": [...], "images": [...]}``, an
    image entry naming its member by extension, ``"<position>.jpg"``), then ``KEY.<position>.jpg``
    per image, leaving out the positions in ``missing``."""
    key = doc["key"]
    names = [None if e is None else f"{j}.jpg" for j, e in enumerate(doc["images"])]
    meta = json.dumps({"texts": list(doc["texts"]), "images": names}, ensure_ascii=False).encode()
    members = [(f"{key}.json", meta)]
    for j, entry in enumerate(doc["images"]):
        if entry is None or j in missing:
            continue
        if isinstance(entry, dict):
            raise ValueError(f"{key}: a tar sample holds image bytes, not a URL/path entry")
        members.append((f"{key}.{j}.jpg", bytes(entry)))
    return members


def write_mint_tar(path: str, docs: list[dict], *, missing: dict[str, set[int]] | None = None) -> str:
    """A WebDataset tar of the documents (MINT-1T-like): per document ``KEY.json`` and its image
    members (see :func:`mint_members`), fixed mtime/uid/gid, in the documents' order. ``missing``
    maps a key to image positions whose member is left out (the json still names them). Returns
    ``path``."""
    missing = missing or {}
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for doc in docs:
            for name, data in mint_members(doc, missing=frozenset(missing.get(doc["key"], ()))):
                _add(tar, name, data)
    return path


# -- bad inputs --------------------------------------------------------------------------------------

#: The defects of :func:`bad_document`, each with what a reader or the processor does with it.
BAD_KINDS = {
    "misaligned": "texts has 3 entries, images 2",
    "both_null": "position 1 has neither a text nor an image",
    "both_set": "position 1 has a text and an image",
    "url_image": "an image given only as a URL (bytes null, path http://...); parquet struct layout only",
    "many_images": "300 tiny (32x32) real-photo JPEGs between short texts",
    "truncated_jpeg": "an image whose JPEG bytes stop halfway",
    "not_an_image": "an image entry whose bytes are text",
    "extreme_aspect": "a 2x500 JPEG: smart_resize raises (aspect ratio over 200)",
    "empty": "both lists empty",
}


def bad_document(kind: str, key: str | None = None, seed: int = 0) -> dict:
    """A document with the defect ``kind`` (one of :data:`BAD_KINDS`), of real text and photos
    otherwise; its key is ``key`` or ``bad-<kind>``."""
    rng = random.Random(f"bad:{kind}:{seed}")
    key = key or f"bad-{kind.replace('_', '-')}"
    caption = rng.choice(captions())
    photo = real_image(rng, "small")
    if kind == "misaligned":
        return {"key": key, "texts": [caption, None, caption], "images": [None, photo]}
    if kind == "both_null":
        return {"key": key, "texts": [caption, None, caption], "images": [None, None, None]}
    if kind == "both_set":
        return {"key": key, "texts": [caption, caption], "images": [None, photo]}
    if kind == "url_image":
        url = {"bytes": None, "path": "http://127.0.0.1:9/images/cat.jpg"}
        return {"key": key, "texts": [caption, None], "images": [None, url]}
    if kind == "many_images":
        texts: list[str | None] = []
        images: list[bytes | None] = []
        for j in range(300):
            if j % 10 == 0:
                texts.append(rng.choice(captions()))
                images.append(None)
            texts.append(None)
            images.append(encode_jpeg(cut(rng.choice(photos_rgb()), 32, 32, rng), quality=85))
        return {"key": key, "texts": texts, "images": images}
    if kind == "truncated_jpeg":
        return {"key": key, "texts": [caption, None], "images": [None, photo[: len(photo) // 2]]}
    if kind == "not_an_image":
        return {"key": key, "texts": [caption, None], "images": [None, caption.encode()]}
    if kind == "extreme_aspect":
        strip = encode_jpeg(cut(rng.choice(photos_rgb()), 2, 500, rng))
        return {"key": key, "texts": [caption, None], "images": [None, strip]}
    if kind == "empty":
        return {"key": key, "texts": [], "images": []}
    raise ValueError(f"unknown bad document kind {kind!r}; known: {sorted(BAD_KINDS)}")


def with_good_neighbours(bad: dict, good: int = 2, seed: int = 7) -> list[dict]:
    """``good`` real documents, the bad one, then ``good`` more (keys ``doc-s<seed>-*``)."""
    docs = real_documents(2 * good, seed=seed)
    return docs[:good] + [bad] + docs[good:]


def write_bad_parquet(
    path: str, kind: str, *, good: int = 2, image_kind: str = "struct", row_group_size: int = 8
) -> tuple[str, str]:
    """A parquet file holding the bad document ``kind`` between ``good`` real documents on each
    side; returns (path, the bad document's key)."""
    bad = bad_document(kind)
    write_obelics_parquet(path, with_good_neighbours(bad, good), row_group_size, image_kind)
    return path, bad["key"]


def write_bad_tar(path: str, kind: str, *, good: int = 2) -> tuple[str, str]:
    """The tar of :func:`write_bad_parquet` (``kind`` not ``url_image``: a tar holds bytes)."""
    bad = bad_document(kind)
    write_mint_tar(path, with_good_neighbours(bad, good))
    return path, bad["key"]


def write_missing_member_tar(path: str, *, good: int = 2) -> tuple[str, str]:
    """A tar whose middle document's json names an image member (``1.jpg``) that the tar lacks;
    returns (path, that document's key)."""
    bad = {
        "key": "bad-missing-member",
        "texts": [captions()[0], None, captions()[1]],
        "images": [None, real_image(random.Random("bad:missing"), "small"), None],
    }
    write_mint_tar(path, with_good_neighbours(bad, good), missing={bad["key"]: {1}})
    return path, bad["key"]


# -- image-caption pairs -----------------------------------------------------------------------------


def write_caption_tar(path: str, n: int, seed: int = 3, *, bad: dict[int, str] | None = None) -> str:
    """A WebDataset tar of ``n`` pairs ``KEY.jpg`` + ``KEY.txt`` of real photos and real captions
    (CLIP data, read by the interleaved kind with ``layout=Captions()``); ``bad`` maps a pair's
    index to the member it lacks (``"jpg"`` or ``"txt"``). Keys carry the seed, so tars of other
    seeds hold other keys."""
    rng = random.Random(seed)
    caps = captions()
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            members = {"jpg": real_image(rng), "txt": rng.choice(caps).encode()}
            members.pop((bad or {}).get(i, ""), None)
            for ext, data in members.items():
                _add(tar, f"pair-{seed}-{i:04d}.{ext}", data)
    return path
