"""A video where a document holds an image, in every layout the interleaved kind reads (issue
54): OBELICS-style Parquet (an MP4 or WebM in the ``images`` list, binary or a ``datasets``
struct), a MINT-style tar (its JSON naming the member), and LLaVA-Video conversations in Parquet
(a ``video`` or ``videos`` column beside ``image``). Each layout gives the same ids, labels,
grids and rows as the others, and the ids are ``Qwen2VLProcessor``'s for the document's text
with its videos' runs; a list entry is a video by its container's bytes (an ``ftyp`` box, the
EBML magic), so a JPEG beside it stays an image."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import video_clips  # noqa: E402
from interleaved_corpus import encode_jpeg, photos_rgb, write_mint_tar, write_obelics_parquet  # noqa: E402
from qwen_reference import EOS, IMAGE_PAD, VISION_END, VISION_START  # noqa: E402
from shardstream import Conversations, InterleavedLoader, QwenVideo, QwenVL, count_interleaved  # noqa: E402
from video_conversations import VIDEO_PAD, write_tokenizer  # noqa: E402

PAD = 2
SPEC = QwenVL(
    min_pixels=56 * 56,
    max_pixels=28 * 28 * 64,
    video=QwenVideo(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 16, total_pixels=28 * 28 * 64),
)
OPTIONS = dict(spec=SPEC, seq_len=512, batch_size=2, max_patches_per_batch=4096, eos_token=EOS)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return write_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, bytes]:
    d = str(tmp_path_factory.mktemp("clips"))
    paths = {
        "mp4": video_clips.make_clip(d, size=(160, 120), seconds=2.0, fps="25"),
        "webm": video_clips.make_clip(d, codec="vp9", container="webm", size=(128, 96), seconds=1.5),
    }
    out = {}
    for name, path in paths.items():
        with open(path, "rb") as f:
            out[name] = f.read()
    out["jpg"] = encode_jpeg(photos_rgb()[0].resize((150, 100)))
    return out


def documents(media: dict[str, bytes]) -> list[dict]:
    """Three documents: text, video, text, photo, text; a video alone with its caption; and
    photo, text, video."""
    return [
        {
            "key": "doc-0",
            "texts": ["A walk past the exhibit.", None, " Then the poster:", None, " the end."],
            "images": [None, media["mp4"], None, media["jpg"], None],
        },
        {"key": "doc-1", "texts": [None, "An astronaut, panned over."], "images": [media["webm"], None]},
        {
            "key": "doc-2",
            "texts": [None, "A cup, and later", None],
            "images": [media["jpg"], None, media["mp4"]],
        },
    ]


def read(files: list[str], tokenizer: str, **kw) -> dict[str, dict]:
    counts = count_interleaved(files, tokenizer=tokenizer, **{**OPTIONS, **kw})
    assert counts.skipped == {}, counts.skipped
    loader = InterleavedLoader(counts, pad_token_id=PAD, threads=2)
    out: dict[str, dict] = {}
    for b in loader:
        flat = b.input_ids.reshape(-1).tolist()
        cu = b.cu_seqlens.tolist()
        runs = [(a, e) for a, e in zip(cu, cu[1:], strict=False) if any(t != PAD for t in flat[a:e])]
        assert len(runs) == len(b.keys)
        videos = [] if b.video_grid_thw is None else b.video_grid_thw.tolist()
        images = b.image_grid_thw.tolist()
        v = i = v_row = i_row = 0
        for (a, e), key in zip(runs, b.keys, strict=True):
            doc = out.setdefault(key, {"ids": [], "labels": [], "videos": [], "images": []})
            doc["ids"] += flat[a:e]
            doc["labels"] += b.labels.reshape(-1)[a:e].tolist()
            for j in range(a, e - 1):
                if flat[j] != loader.vision_token_ids[0]:
                    continue
                if flat[j + 1] == loader.video_token_id:
                    n = int(np.prod(videos[v]))
                    doc["videos"].append((videos[v], b.pixel_values_videos[v_row : v_row + n].numpy()))
                    v, v_row = v + 1, v_row + n
                else:
                    n = int(np.prod(images[i]))
                    doc["images"].append((images[i], b.pixel_values[i_row : i_row + n].numpy()))
                    i, i_row = i + 1, i_row + n
        assert v == len(videos) and i == len(images)
    return out


def assert_same(a: dict[str, dict], b: dict[str, dict]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key]["ids"] == b[key]["ids"], key
        assert a[key]["labels"] == b[key]["labels"], key
        for kind in ("videos", "images"):
            assert len(a[key][kind]) == len(b[key][kind]), (key, kind)
            for (ga, ra), (gb, rb) in zip(a[key][kind], b[key][kind], strict=True):
                assert ga == gb and np.array_equal(ra, rb), (key, kind)


def kinds(doc: dict, media: dict[str, bytes]) -> list[str]:
    """ "video" or "image" for each entry of the document's image list, by what the test put
    there."""
    videos = (media["mp4"], media["webm"])
    return ["video" if b in videos else "image" for b in doc["images"] if b is not None]


def reference_ids(doc: dict, media: dict[str, bytes], tokenizer: str) -> list[int]:
    """The tokenizer's ids (as ``Qwen2VLProcessor`` tokenizes) for the document's text with one
    pad token for each image and video run, before the runs are expanded to their grids (the
    grids themselves are checked against the processor and qwen-vl-utils in
    tests/test_interleaved_video.py)."""
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer)
    runs = iter(kinds(doc, media))
    pad = {"video": VIDEO_PAD, "image": IMAGE_PAD}
    text = "".join(t if t is not None else VISION_START + pad[next(runs)] + VISION_END for t in doc["texts"])
    return tok(text, add_special_tokens=False)["input_ids"]


def expand(ids: list[int], grids: list[tuple[str, list[int]]], pads: dict[str, int]) -> list[int]:
    """``ids`` with each pad token repeated as many times as its grid has merge blocks, in order."""
    out, grids = [], iter(grids)
    by_id = {v: k for k, v in pads.items()}
    for t in ids:
        if t in by_id:
            kind, grid = next(grids)
            assert kind == by_id[t]
            out += [t] * (int(np.prod(grid)) // 4)
        else:
            out.append(t)
    return out


def test_a_document_holds_a_video_where_it_holds_an_image_in_parquet_and_tar(media, tokenizer, tmp_path):
    docs = documents(media)
    struct = read([write_obelics_parquet(str(tmp_path / "s.parquet"), docs, 2)], tokenizer)
    binary = read([write_obelics_parquet(str(tmp_path / "b.parquet"), docs, 2, "binary")], tokenizer)
    tar = read([write_mint_tar(str(tmp_path / "d.tar"), docs)], tokenizer)
    assert_same(struct, binary)
    assert_same(struct, tar)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer)
    pads = {"video": tok.convert_tokens_to_ids(VIDEO_PAD), "image": tok.convert_tokens_to_ids(IMAGE_PAD)}
    eos = tok.convert_tokens_to_ids(EOS)
    for doc in docs:
        got = struct[doc["key"]]
        entries = kinds(doc, media)
        assert len(got["videos"]) == entries.count("video") and len(got["images"]) == entries.count("image")
        # The grids in the order of the runs, as the document lays its images and videos out.
        read_back = {"video": iter(got["videos"]), "image": iter(got["images"])}
        order = [(kind, next(read_back[kind])[0]) for kind in entries]
        assert got["ids"] == expand(reference_ids(doc, media, tokenizer), order, pads) + [eos], doc["key"]
    # A video's frames decode to 2 temporal patches of 84x112 (the clip's 4 sampled frames).
    assert struct["doc-0"]["videos"][0][0] == [2, 6, 8]


def test_a_parquet_conversation_reads_its_video_columns_as_a_tar_reads_its_members(
    media, tokenizer, tmp_path
):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conversation_corpus import write_llava_tar

    turns = [
        [{"from": "human", "value": "<image> and <video>: the same place?"}, {"from": "gpt", "value": "No."}],
        [
            {"from": "human", "value": "<video><video> Which is longer?"},
            {"from": "gpt", "value": "The first."},
        ],
    ]
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "key": pa.array(["c0", "c1"]),
            "conversations": pa.array(turns),
            "image": pa.array([media["jpg"], None], pa.binary()),
            "videos": pa.array(
                [
                    [{"bytes": media["webm"], "path": "a.webm"}],
                    [{"bytes": media["mp4"], "path": "b.mp4"}, {"bytes": media["webm"], "path": None}],
                ],
                pa.list_(struct),
            ),
        }
    )
    pq.write_table(table, str(tmp_path / "convs.parquet"))
    tar_convs = [
        {
            "key": "c0",
            "conversations": turns[0],
            "names": "jpg",
            "images": [media["jpg"]],
            "json": {"videos": ["webm"]},
            "members": [("jpg", media["jpg"]), ("webm", media["webm"])],
        },
        {
            "key": "c1",
            "conversations": turns[1],
            "names": None,
            "images": [],
            "json": {"videos": ["0.mp4", "1.webm"]},
            "members": [("0.mp4", media["mp4"]), ("1.webm", media["webm"])],
        },
    ]
    write_llava_tar(str(tmp_path / "convs.tar"), tar_convs)
    from_parquet = read([str(tmp_path / "convs.parquet")], tokenizer, layout=Conversations())
    from_tar = read([str(tmp_path / "convs.tar")], tokenizer, layout=Conversations())
    assert_same(from_parquet, from_tar)
    assert [len(from_tar[k]["videos"]) for k in ("c0", "c1")] == [1, 2]
    # A null video in the list is its conversation's reason, counted.
    table = table.set_column(
        3, "videos", pa.array([[None], [{"bytes": media["mp4"], "path": None}] * 2], pa.list_(struct))
    )
    pq.write_table(table, str(tmp_path / "null.parquet"))
    counts = count_interleaved(
        [str(tmp_path / "null.parquet")], tokenizer=tokenizer, layout=Conversations(), **OPTIONS
    )
    assert counts.skipped == {"missing_video": 1}, counts.skipped


def test_an_image_list_entry_is_a_video_by_its_container(media, tokenizer, tmp_path):
    """A PNG, a WebP and a JPEG stay images; a video named ``.jpg`` is still a video; a spec
    without a video rule skips the document with a video by reason."""
    from PIL import Image

    def encoded(fmt: str) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", (60, 40), (10, 200, 30)).save(out, fmt)
        return out.getvalue()

    docs = [
        {"key": "png", "texts": [None, "green"], "images": [encoded("PNG"), None]},
        {"key": "webp", "texts": [None, "green"], "images": [encoded("WEBP"), None]},
        {"key": "vid", "texts": [None, "a pan"], "images": [media["mp4"], None]},
    ]
    got = read([write_mint_tar(str(tmp_path / "d.tar"), docs)], tokenizer)
    assert [(len(got[k]["images"]), len(got[k]["videos"])) for k in ("png", "webp", "vid")] == [
        (1, 0),
        (1, 0),
        (0, 1),
    ]
    no_video = QwenVL(min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels)
    counts = count_interleaved(
        [str(tmp_path / "d.tar")], tokenizer=tokenizer, **{**OPTIONS, "spec": no_video}
    )
    assert counts.skipped == {"misaligned_document": 1}, counts.skipped
