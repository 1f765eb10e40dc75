"""The interleaved kind under the NaFlex (SigLIP 2) spec (``spec=NaFlexVL(...)``) on real photos
and real captions: every image's grid is ``Siglip2ImageProcessor``'s ``spatial_shapes`` and its
pixel rows are within the NaFlex kind's stated error of that processor's; its run in the text is
one pad per patch between the start and end tokens; the text around the images is tokenized as
under the Qwen2-VL spec; and a corpus packs and reads exactly as under that spec, another family
being another spec, not another kind."""

from __future__ import annotations

import collections
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from interleaved_corpus import real_documents, write_obelics_parquet  # noqa: E402
from PIL import Image  # noqa: E402
from qwen_reference import EOS, write_tokenizer_json  # noqa: E402
from shardstream import InterleavedLoader, NaFlexVL, OptionError, QwenVL, count_interleaved  # noqa: E402

SPEC = NaFlexVL(patch_size=16, max_num_patches=256)
SEQ_LEN, BATCH, PAD = 2048, 2, 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("naflex-docs")
    tokenizer = write_tokenizer_json(str(root / "tokenizer.json"))
    docs = real_documents(20, seed=4)
    path = write_obelics_parquet(str(root / "docs.parquet"), docs, 4)
    return tokenizer, docs, path


def read(counts):
    """Per document key, in read order: its ids (runs joined) and its images as (grid, rows)."""
    out = collections.defaultdict(lambda: {"ids": [], "images": []})
    start, end, pad = InterleavedLoader(counts, pad_token_id=PAD).vision_token_ids
    for b in InterleavedLoader(counts, pad_token_id=PAD):
        flat, cu = b.input_ids.reshape(-1).tolist(), b.cu_seqlens.tolist()
        grids, pixels, at = b.image_grid_thw.tolist(), b.pixel_values.numpy(), 0
        runs = iter(b.keys)
        for a, e in zip(cu[:-1], cu[1:], strict=True):
            seq = flat[a:e]
            if all(t == PAD for t in seq):
                continue
            doc = out[next(runs)]
            doc["ids"] += seq
            for _ in range(seq.count(start)):
                t, h, w = grids.pop(0)
                doc["images"].append(((h, w), pixels[at : at + h * w]))
                at += h * w
        assert not grids and at == len(pixels)
    return out, (start, end, pad)


def test_every_image_is_siglip2s_grid_and_pixels_and_one_pad_a_patch(corpus):
    """Each image's (rows, columns) equal ``Siglip2ImageProcessor``'s ``spatial_shapes``; its
    rows differ from the processor's un-normalised ``pixel_values`` by a mean absolute error of
    at most 5.0 for any image and 1.0 on average (the NaFlex kind's bound, for the same reason:
    large JPEGs are decoded at a reduced DCT scale and YCbCr resized before RGB); its run is the
    start token, one pad per patch, the end token. Measured on the 35 images: mean 0.48, the
    largest 2.82."""
    tokenizer, docs, path = corpus
    counts = count_interleaved(
        path, tokenizer=tokenizer, spec=SPEC, seq_len=SEQ_LEN, batch_size=BATCH, eos_token=EOS
    )
    assert counts.skipped == {} and counts.documents == len(docs)
    got, (start, end, pad) = read(counts)
    reference = transformers.Siglip2ImageProcessor(
        patch_size=16, max_num_patches=256, do_rescale=False, do_normalize=False
    )
    errors = []
    for doc in docs:
        mine = got[doc["key"]]
        images = [b for b in doc["images"] if b is not None]
        assert len(mine["images"]) == len(images), doc["key"]
        ids = mine["ids"]
        runs = [i for i, t in enumerate(ids) if t == start]
        for (grid, rows), data, at in zip(mine["images"], images, runs, strict=True):
            image = Image.open(io.BytesIO(data)).convert("RGB")
            out = reference(images=[image], return_tensors="np")
            assert grid == tuple(int(v) for v in out["spatial_shapes"][0]), doc["key"]
            n = grid[0] * grid[1]
            assert ids[at + 1 : at + 1 + n] == [pad] * n and ids[at + 1 + n] == end
            want = out["pixel_values"][0][:n]
            errors.append(float(np.abs(rows.astype(np.int16) - want.astype(np.int16)).mean()))
    assert len(errors) > 20
    assert max(errors) < 5.0 and np.mean(errors) < 1.0, errors


def test_the_text_is_the_qwen2_vl_specs_and_both_read_every_document_once(corpus):
    """The same corpus under ``QwenVL``: with every image run taken out, each document's tokens
    are the same (the text does not depend on the spec), and both specs read every document."""
    tokenizer, docs, path = corpus
    common = {"tokenizer": tokenizer, "seq_len": SEQ_LEN, "batch_size": BATCH, "eos_token": EOS}
    naflex, ids = read(count_interleaved(path, spec=SPEC, **common))
    qwen, qids = read(count_interleaved(path, spec=QwenVL(max_pixels=28 * 28 * 256), **common))
    assert set(naflex) == set(qwen) == {d["key"] for d in docs}

    def text(tokens, start, end):
        out, inside = [], False
        for t in tokens:
            inside = (inside or t == start) and t != end
            if not inside and t != end:
                out.append(t)
        return out

    for key in naflex:
        assert text(naflex[key]["ids"], ids[0], ids[1]) == text(qwen[key]["ids"], qids[0], qids[1]), key


def test_a_patch_cap_under_one_largest_image_is_refused(corpus):
    tokenizer, _, path = corpus
    with pytest.raises(OptionError, match="max_patches_per_batch"):
        count_interleaved(
            path, tokenizer=tokenizer, spec=SPEC, seq_len=SEQ_LEN, batch_size=1, max_patches_per_batch=100
        )


def test_positions_are_one_d_and_restart_at_every_run(corpus):
    """Under NaFlex a run's positions are 1-D, images included: 0, 1, 2, ... over each
    document's run in a row (and each row's padding), the same on all four rows of
    ``packed_position_ids``, so a model masks and positions each document as if alone."""
    tokenizer, docs, path = corpus
    counts = count_interleaved(path, tokenizer=tokenizer, spec=SPEC, seq_len=512, batch_size=2, eos_token=EOS)
    runs = 0
    for b in InterleavedLoader(counts, pad_token_id=PAD):
        packed = b.packed_position_ids
        assert packed.shape == (4, *b.input_ids.shape)
        assert all(torch.equal(packed[i], b.position_ids) for i in range(4))
        flat, cu = b.position_ids.reshape(-1), b.cu_seqlens.tolist()
        for a, e in zip(cu[:-1], cu[1:], strict=True):
            assert flat[a:e].tolist() == list(range(e - a))
            runs += 1
    assert runs > len(docs)
