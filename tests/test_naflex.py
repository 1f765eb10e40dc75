"""The NaFlex sample kind (``sample=NaFlex(...)``): SigLIP 2's patch sequences, against
``transformers``' own processors, on bad inputs, across ranks and resumes, and into a real
``Siglip2Model``.

The reference processors, as transformers 5.24 names them: ``Siglip2ImageProcessorPil`` is the
"slow" one (PIL resize) and ``Siglip2ImageProcessor`` the "fast" one (torchvision; the old
``Siglip2ImageProcessorFast`` is now a deprecated alias of it). Both are built with
``do_rescale=False, do_normalize=False`` so their output is uint8 on our scale.
"""

from __future__ import annotations

import collections
import io
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from corpus import sample_members, tar_bytes, write_file, write_shards  # noqa: E402
from naflex_photos import photo_images  # noqa: E402
from PIL import Image  # noqa: E402
from shardstream import OptionError, ShardLoader  # noqa: E402
from shardstream.index import build_index, write_index  # noqa: E402
from shardstream.kinds import NaFlex, NaFlexBatch  # noqa: E402

TOKENIZER = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "tokenizers", "captions-bpe.json"
)


def shard_of(path: str, images: list[tuple[str, bytes]]) -> str:
    members = []
    for key, data in images:
        ext = "png" if data.startswith(b"\x89PNG") else "jpg"
        members += [(f"{key}.{ext}", data), (f"{key}.txt", f"a photo called {key}".encode())]
    return write_file(path, tar_bytes(members))


def by_key(loader) -> dict[str, tuple[np.ndarray, tuple[int, int], np.ndarray]]:
    out = {}
    for b in loader:
        assert isinstance(b, NaFlexBatch)
        for i, key in enumerate(b.keys):
            out[key] = (
                b.pixel_values[i].numpy(),
                tuple(b.spatial_shapes[i].tolist()),
                b.pixel_attention_mask[i].numpy(),
            )
    return out


def png(width: int, height: int) -> bytes:
    rng = np.random.default_rng(width * 7 + height)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos():
    return photo_images()


@pytest.fixture(scope="module")
def decoded(photos, tmp_path_factory):
    path = shard_of(str(tmp_path_factory.mktemp("naflex") / "photos.tar"), photos)
    loader = ShardLoader(path, batch_size=8, drop_last=False, threads=1, sample=NaFlex())
    out = by_key(loader)
    assert loader.stats["skipped_total"] == 0
    return out


@pytest.mark.parametrize("processor", ["Siglip2ImageProcessorPil", "Siglip2ImageProcessor"])
def test_grids_are_the_processors_and_pixels_within_a_stated_error(photos, decoded, processor):
    """Every image's spatial_shapes equal the processor's; its pixels differ by a mean absolute
    error (0-255 scale, over the image's patches) of at most 1.0 on average and 5.0 for any
    image, and under 1.0 for every image decoded at full size.

    Measured (48 images: 8 photos whole and cut to 5 aspects from 1:0.03 to 0.02:1, 4 PNGs of
    the webdataset test data, upscaled 9x): mean 0.48 against both processors, the largest 4.24
    (china.jpg whole, 640x427 to 304x208, decoded at 1/2 DCT scale). The differences remain
    because a JPEG that is at least twice the target on both sides is decoded at a reduced DCT
    scale (libjpeg's scaled IDCT, as Pillow's draft() would), and YCbCr planes are resized each at
    its own resolution and converted to RGB afterwards, where the processors convert a full-size
    RGB decode; both use the same antialiased BILINEAR filter. The two processors agree with each
    other to within 0.01.
    """
    reference = getattr(transformers, processor)(
        patch_size=16, max_num_patches=256, do_rescale=False, do_normalize=False
    )
    errors, full_size = {}, {}
    for key, data in photos:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        out = reference(images=[image], return_tensors="np")
        rows, cols = (int(v) for v in out["spatial_shapes"][0])
        pixels, grid, mask = decoded[key]
        assert grid == (rows, cols), (key, image.size)
        n = rows * cols
        assert mask.tolist() == out["pixel_attention_mask"][0].tolist()
        assert not pixels[n:].any(), "padding patches are zeros"
        errors[key] = float(
            np.abs(pixels[:n].astype(np.int16) - out["pixel_values"][0][:n].astype(np.int16)).mean()
        )
        w, h = image.size
        if data.startswith(b"\x89PNG") or w < 2 * cols * 16 or h < 2 * rows * 16:
            full_size[key] = errors[key]
    assert np.mean(list(errors.values())) < 1.0, errors
    assert max(errors.values()) < 5.0, errors
    assert len(full_size) > len(photos) // 2 and max(full_size.values()) < 1.0, full_size


def test_bad_inputs_give_the_processors_answer_or_a_typed_reason(tmp_path):
    reference = transformers.Siglip2ImageProcessorPil(
        patch_size=16, max_num_patches=256, do_rescale=False, do_normalize=False
    )
    images = [
        ("line", png(10000, 1)),
        ("column", png(1, 10000)),
        ("dot", png(1, 1)),
        ("narrow", png(8, 1200)),
    ]
    path = shard_of(str(tmp_path / "bad.tar"), images)
    got = by_key(ShardLoader(path, batch_size=2, threads=1, sample=NaFlex()))
    for key, data in images:
        out = reference(images=[Image.open(io.BytesIO(data)).convert("RGB")], return_tensors="np")
        assert got[key][1] == tuple(int(v) for v in out["spatial_shapes"][0]), key
    # 1x10000 is held at one patch row (16x4096); 1x1 upscaled 100x, to 7x7 patches; 8x1200 has
    # one column of 150, since a second column would need 151 rows more than the budget.
    assert (got["line"][1], got["column"][1], got["dot"][1], got["narrow"][1]) == (
        (1, 256),
        (256, 1),
        (7, 7),
        (150, 1),
    )
    # A minimum the narrow image (150) and the dot (49, the 100x upscale cap) cannot reach:
    # skipped with their typed reason and counted.
    loader = ShardLoader(path, batch_size=1, threads=1, sample=NaFlex(min_num_patches=200))
    kept = by_key(loader)
    assert sorted(kept) == ["column", "line"]
    assert loader.stats["skipped"] == {"too_few_patches": 2}
    assert sorted(f["key"] for f in loader.stats["faults"]) == ["dot", "narrow"]
    # Budgets under one patch, and square-image options beside the kind, are refused up front.
    with pytest.raises(OptionError) as no_budget:
        NaFlex(max_num_patches=0)
    assert no_budget.value.option == "max_num_patches"
    for bad in ({"patch_size": 0}, {"min_num_patches": 300}, {"random_crop_scale": (0.5, 1.5)}):
        with pytest.raises(OptionError):
            NaFlex(**bad)
    with pytest.raises(OptionError) as square:
        ShardLoader(path, batch_size=1, crop="random", sample=NaFlex())
    assert square.value.option == "crop"


def test_batches_never_exceed_the_configured_buffer(tmp_path):
    """Whatever the image (4 px or 10000 px a side), each batch is [B, N, 3p^2]."""
    images = [(f"k{i}", png(w, h)) for i, (w, h) in enumerate([(4, 4), (10000, 3), (640, 480), (3, 3000)])]
    path = shard_of(str(tmp_path / "sizes.tar"), images)
    spec = NaFlex(patch_size=14, max_num_patches=64)
    for b in ShardLoader(path, batch_size=2, threads=1, sample=spec):
        assert tuple(b.pixel_values.shape) == (2, 64, 3 * 14 * 14)
        assert tuple(b.pixel_attention_mask.shape) == (2, 64) and b.pixel_attention_mask.dtype == torch.int32
        counts = b.spatial_shapes.prod(1)
        assert (counts <= 64).all() and (b.pixel_attention_mask.sum(1) == counts).all()


COUNTS = [1, 7, 3, 12, 5, 9]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    d = tmp_path_factory.mktemp("naflex-exact")
    paths, keys = write_shards(d, COUNTS, seed=300)
    return paths, keys, write_index(build_index(paths), str(d / "index.json"))


def epoch(paths, index, *, rank, world, seed=0, state=None, stop_after=None, random_crop=False):
    loader = ShardLoader(
        paths,
        index=index,
        batch_size=4,
        seed=seed,
        rank=rank,
        world_size=world,
        shuffle_buffer=5,
        threads=1,
        sample=NaFlex(max_num_patches=32, random_crop=random_crop),
    )
    if state is not None:
        loader.load_state_dict(state)
    batches = []
    for b in loader:
        batches.append((list(b.keys), b.spatial_shapes.clone(), b.pixel_values.clone()))
        if stop_after is not None and len(batches) == stop_after:
            return batches, loader.state_dict(), loader
    return batches, None, loader


def test_exact_on_two_ranks_and_deterministic(indexed):
    paths, keys, index = indexed
    ranks = [epoch(paths, index, rank=r, world=2)[0] for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) > 0, "equal batches on every rank"
    seen = [k for batches in ranks for b in batches for k in b[0]]
    assert len(seen) == len(set(seen))
    remainder = epoch(paths, index, rank=0, world=2)[2].stats["remainder_keys"]
    assert sorted(seen + remainder) == sorted(keys)
    again = epoch(paths, index, rank=1, world=2)[0]
    for (k1, s1, p1), (k2, s2, p2) in zip(ranks[1], again, strict=True):
        assert k1 == k2 and torch.equal(s1, s2) and torch.equal(p1, p2)
    # Random crops: a function of (seed, epoch, key), so the same run gives the same pixels, and
    # another seed other crops of the same images.
    crops = epoch(paths, index, rank=0, world=2, random_crop=True)[0]
    crops_again = epoch(paths, index, rank=0, world=2, random_crop=True)[0]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(crops, crops_again, strict=True))
    whole = {k: p for ks, _, ps in ranks[0] for k, p in zip(ks, ps, strict=True)}
    cropped = {k: p for ks, _, ps in crops for k, p in zip(ks, ps, strict=True)}
    assert any(not torch.equal(whole[k], cropped[k]) for k in cropped)


@pytest.mark.parametrize("stop", [1, 2])
def test_resume_mid_epoch_continues_with_the_exact_next_batches(indexed, stop):
    paths, _, index = indexed
    full = epoch(paths, index, rank=0, world=2, seed=3)[0]
    states = [epoch(paths, index, rank=r, world=2, seed=3, stop_after=stop)[1] for r in range(2)]
    assert states[0] is not None
    rest = epoch(paths, index, rank=0, world=2, seed=3, state=states[0])[0]
    assert len(rest) == len(full) - stop
    for (k1, s1, p1), (k2, s2, p2) in zip(full[stop:], rest, strict=True):
        assert k1 == k2 and torch.equal(s1, s2) and torch.equal(p1, p2)


def test_a_tiny_siglip2_model_trains_on_naflex_batches(tmp_path):
    """transformers.Siglip2Model (vision hidden 32, 1 layer, patch 16; text vocab of the real
    byte-level BPE tokenizer.json in tests/data) takes the loader's batches as they are, after
    the processors' normalisation on the device: loss finite, logit_bias gets a gradient."""
    from corpus import good_samples

    vocab = len(json.load(open(TOKENIZER))["model"]["vocab"])
    members = [m for key, sample in good_samples(12, seed=5) for m in sample_members(key, sample)]
    path = write_file(str(tmp_path / "train.tar"), tar_bytes(members))
    loader = ShardLoader(
        path,
        batch_size=4,
        threads=1,
        tokenizer=TOKENIZER,
        context_length=16,
        sample=NaFlex(patch_size=16, max_num_patches=64, random_crop=True),
    )
    torch.manual_seed(0)
    config = transformers.Siglip2Config(
        text_config={
            "vocab_size": vocab,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 16,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "patch_size": 16,
            "num_patches": 64,
        },
    )
    model = transformers.Siglip2Model(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for batch in loader:
        pixels = batch.pixel_values.float() / 127.5 - 1.0  # the processors' rescale, mean/std 0.5
        out = model(
            input_ids=batch.tokens,
            pixel_values=pixels,
            pixel_attention_mask=batch.pixel_attention_mask,
            spatial_shapes=batch.spatial_shapes,
            return_loss=True,
        )
        assert torch.isfinite(out.loss)
        optimizer.zero_grad()
        out.loss.backward()
        grad = model.logit_bias.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
        optimizer.step()
        steps += 1
    assert steps == 3
    assert collections.Counter(loader.stats["skipped"]) == collections.Counter()
