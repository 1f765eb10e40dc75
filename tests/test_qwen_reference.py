"""The interleaved kind's reference (tests/qwen_reference.py) and corpus
(tests/interleaved_corpus.py) checked against themselves: what transformers' Qwen2VLProcessor
makes of real documents is what the reference's docstring says, so the kind's tests can compare
against it with confidence. No shardstream code runs here."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("torchvision")  # Qwen2VLVideoProcessor, which Qwen2VLProcessor requires
transformers = pytest.importorskip("transformers")

import qwen_reference as qr  # noqa: E402
from interleaved_corpus import BAD_KINDS, bad_document, real_documents  # noqa: E402
from PIL import Image  # noqa: E402

MAX_PIXELS = 28 * 28 * 256


@pytest.fixture(scope="module")
def processor():
    return qr.make_processor(qr.DEFAULT_MIN_PIXELS, MAX_PIXELS)


@pytest.fixture(scope="module")
def docs():
    return real_documents(3)


def segments(doc: dict) -> list[str | bytes]:
    """Adjacent text positions joined; images as they are."""
    out: list[str | bytes] = []
    for text, image in zip(doc["texts"], doc["images"], strict=True):
        if text is not None and out and isinstance(out[-1], str):
            out[-1] += text
        else:
            out.append(text if text is not None else image)
    return out


def test_the_three_fixed_documents_are_the_cases_they_promise(docs):
    first, text_only, image_only = docs
    assert first["images"][0] is not None and first["texts"][0] is None
    assert all(i is None for i in text_only["images"]) and len(text_only["texts"]) >= 2
    assert all(t is None for t in image_only["texts"]) and image_only["images"]
    for d in docs:
        assert len(d["texts"]) == len(d["images"])
        assert all((t is None) != (i is None) for t, i in zip(d["texts"], d["images"], strict=True))
    assert real_documents(3) == docs, "deterministic"


def test_image_runs_grids_and_pixels_are_the_processors(processor, docs):
    """Per image: a run of t*h*w/4 pads between vision_start and vision_end, its grid from
    smart_resize of the decoded size; pixel_values rows = sum(t*h*w), whole numbers in 0..255, and
    the slow processor's pixels are PIL's BICUBIC resize of the uint8 RGB image."""
    vs, ve, pad = qr.reference_added_ids(processor)
    assert (vs, ve, pad) == (1000, 1001, 1002)
    eos = qr.eos_id(processor)
    assert eos == 1
    for doc in docs:
        ref = qr.reference_document(processor, doc, eos)
        ids, grids, pixels = ref["input_ids"], ref["image_grid_thw"], ref["pixel_values"]
        images = [b for b in doc["images"] if b is not None]
        assert grids.shape == (len(images), 3) and grids.dtype == np.int64
        assert pixels.shape == (int(grids.prod(axis=1).sum()), qr.PATCH_DIM)
        assert pixels.dtype == np.float32
        assert pixels.min(initial=0) >= 0 and pixels.max(initial=0) <= 255
        assert np.array_equal(pixels, np.round(pixels))
        assert ids[-1] == eos and ids.count(eos) == 1
        starts = [i for i, t in enumerate(ids) if t == vs]
        assert len(starts) == len(images) == ids.count(ve)
        offset = 0
        for start, grid, data in zip(starts, grids, images, strict=True):
            n = qr.image_tokens(grid)
            assert n == int(grid[0] * grid[1] * grid[2]) // 4
            assert ids[start + 1 : start + 1 + n] == [pad] * n and ids[start + 1 + n] == ve
            image = qr.decode_image(data)
            assert tuple(grid) == qr.grid_thw(image.height, image.width, qr.DEFAULT_MIN_PIXELS, MAX_PIXELS)
            rows = pixels[offset : offset + int(grid.prod())]
            offset += len(rows)
            resized = image.resize((int(grid[2]) * 14, int(grid[1]) * 14), Image.Resampling.BICUBIC)
            assert np.array_equal(qr.unpatchify(rows, grid), np.asarray(resized, dtype=np.float32))
            assert np.array_equal(qr.patchify(qr.unpatchify(rows, grid)), rows)
        assert ids.count(pad) == sum(qr.image_tokens(g) for g in grids)


def test_ids_are_each_text_run_tokenized_apart(processor, docs):
    """The document's ids are: each run of adjacent text positions tokenized on its own (no
    special tokens added; ByteLevel's prefix space applies to every run), each image as
    [vision_start] + pads + [vision_end], then the EOS. A text-only document is the tokenizer's
    ids of its concatenated text plus the EOS."""
    tok = processor.tokenizer
    vs, ve, pad = qr.reference_added_ids(processor)
    eos = qr.eos_id(processor)
    for doc in docs:
        ref = qr.reference_document(processor, doc, eos)
        expected: list[int] = []
        grids = iter(ref["image_grid_thw"])
        for seg in segments(doc):
            if isinstance(seg, str):
                expected += tok(seg, add_special_tokens=False).input_ids
            else:
                expected += [vs] + [pad] * qr.image_tokens(next(grids)) + [ve]
        assert ref["input_ids"] == expected + [eos], doc["key"]
    text_only = docs[1]
    text = "".join(text_only["texts"])
    ref = qr.reference_document(processor, text_only, eos)
    assert ref["input_ids"] == tok(text, add_special_tokens=False).input_ids + [eos]
    assert ref["input_ids"][0] != tok.convert_tokens_to_ids("<s>"), "no <s>: add_special_tokens=False"
    assert ref["image_grid_thw"].shape == (0, 3) and ref["pixel_values"].shape == (0, qr.PATCH_DIM)


def test_smart_resize_rounds_ties_to_even_and_refuses_aspect_over_200():
    # 70 / 28 = 2.5 -> 2, 126 / 28 = 4.5 -> 4 (rounding half up would give 3 and 5)
    assert qr.grid_thw(70, 126, qr.DEFAULT_MIN_PIXELS, 10**7) == (1, 4, 8)
    assert qr.grid_thw(42, 98, qr.DEFAULT_MIN_PIXELS, 10**7) == (1, 4, 8)  # 1.5 -> 2, 3.5 -> 4 either way
    # a thin strip: the min-pixels branch's ceil leaves it above max_pixels
    t, h, w = qr.grid_thw(10, 1990, qr.DEFAULT_MIN_PIXELS, 28 * 28 * 16)
    assert (h * 14) * (w * 14) > 28 * 28 * 16
    with pytest.raises(ValueError, match="aspect ratio"):
        qr.grid_thw(2, 500, qr.DEFAULT_MIN_PIXELS, MAX_PIXELS)


def test_a_tokenizer_json_holding_the_vision_tokens_gives_the_same_ids(processor, tmp_path):
    path = qr.write_tokenizer_json(str(tmp_path / "qwen-tokens.json"))
    tok = qr.make_tokenizer(path)
    assert len(tok) == len(processor.tokenizer) == 1003
    assert tok.convert_tokens_to_ids([qr.VISION_START, qr.VISION_END, qr.IMAGE_PAD]) == [1000, 1001, 1002]
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(path)
    text = "a cat" + qr.IMAGE_PLACEHOLDER + "on a mat"
    assert raw.encode(text, add_special_tokens=False).ids == tok(text, add_special_tokens=False).input_ids


def test_bad_documents_are_what_they_say(processor):
    eos = qr.eos_id(processor)
    for kind in ("misaligned", "both_null", "both_set"):
        with pytest.raises(ValueError, match="position|differ"):
            qr.document_text(bad_document(kind))
    with pytest.raises(ValueError, match="aspect ratio"):
        qr.reference_document(processor, bad_document("extreme_aspect"), eos)
    broken = bad_document("truncated_jpeg")
    with pytest.raises(OSError):
        Image.open(io.BytesIO(broken["images"][1])).convert("RGB")
    assert set(BAD_KINDS) >= {"url_image", "many_images", "not_an_image", "empty"}
