"""Conversations and image-caption pairs read from Parquet (``count_interleaved(...,
layout=Conversations() or Captions())``) as the hub stores them: LLaVA-OneVision-Data's
``conversations`` (list<struct<from, value>>) beside one ``image`` or an ``images`` list of
``datasets`` Image structs, the Cauldron's ``texts`` (list<struct<user, assistant, source>>)
beside ``images``, and img2dataset's ``jpg`` + ``txt`` (or an Image struct beside ``caption``).
Each is built from the same real conversations and pairs as the tar-layout tests, and its batches
equal the tar's batch for batch (ids, labels, positions, pixels, grids); a malformed conversation
row is skipped and counted with the reason the same conversation has in a tar."""

from __future__ import annotations

import hashlib
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from conversation_corpus import BAD_KINDS, IMAGE, bad_conversation, real_conversations, write_llava_tar  # noqa: E402
from interleaved_corpus import write_caption_tar  # noqa: E402
from qwen_reference import EOS, write_chat_tokenizer_json  # noqa: E402
from shardstream import Captions, Conversations, InterleavedLoader, QwenVL, count_interleaved  # noqa: E402

SPEC = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 256)
SEQ_LEN, BATCH, PAD = 1024, 2, 2
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
TURN = pa.struct([("from", pa.string()), ("value", pa.string())])
CAULDRON_TURN = pa.struct([("user", pa.string()), ("assistant", pa.string()), ("source", pa.string())])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return write_chat_tokenizer_json(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.fixture(scope="module")
def convs() -> list[dict]:
    return real_conversations(24)


def count(files, tokenizer, layout):
    return count_interleaved(
        files,
        tokenizer=tokenizer,
        spec=SPEC,
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        eos_token=EOS,
        threads=2,
        layout=layout,
    )


def batches(counts) -> list[tuple[list[str], str]]:
    """Every batch of an epoch: its keys and a digest of its tensors."""
    out = []
    for b in InterleavedLoader(counts, pad_token_id=PAD, threads=1):
        h = hashlib.sha256()
        for t in (b.input_ids, b.labels, b.position_ids, b.pixel_values, b.image_grid_thw, b.cu_seqlens):
            h.update(t.numpy().tobytes())
        out.append((list(b.keys), h.hexdigest()))
    return out


def turns_column(convs: list[dict]) -> pa.Array:
    return pa.array(
        [[{"from": t.get("from"), "value": t.get("value")} for t in c["conversations"]] for c in convs],
        pa.list_(TURN),
    )


def llava_onevision_parquet(path, convs: list[dict], images: str, row_group_size: int = 5) -> str:
    """LLaVA-OneVision-Data's shape: ``key``, ``conversations`` and either ``image`` (one Image
    struct, its ``path`` the LLaVA name; null for none) or ``images`` (a list of them)."""
    columns = {"key": pa.array([c["key"] for c in convs]), "conversations": turns_column(convs)}
    if images == "image":
        assert all(len(c["images"]) <= 1 for c in convs)
        names = [c["names"] if isinstance(c["names"], str) else None for c in convs]
        columns["image"] = pa.array(
            [
                {"bytes": c["images"][0], "path": n} if c["images"] else None
                for c, n in zip(convs, names, strict=True)
            ],
            IMAGE_STRUCT,
        )
    else:
        columns["images"] = pa.array(
            [[{"bytes": b, "path": None} for b in c["images"]] for c in convs], pa.list_(IMAGE_STRUCT)
        )
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def test_llava_onevision_conversations_with_one_image_equal_the_tar_s_batches(convs, tokenizer, tmp_path):
    single = [c for c in convs if len(c["images"]) <= 1]
    assert len(single) >= 8 and any(not c["images"] for c in single)
    tar = count([write_llava_tar(str(tmp_path / "one.tar"), single)], tokenizer, Conversations())
    path = llava_onevision_parquet(str(tmp_path / "one.parquet"), single, "image")
    parquet = count([path], tokenizer, Conversations())
    assert (parquet.documents, parquet.skipped) == (len(single), {}) == (tar.documents, tar.skipped)
    got, want = batches(parquet), batches(tar)
    assert len(got) > 1 and got == want


def test_llava_onevision_conversations_with_an_images_list_equal_the_tar_s_batches(
    convs, tokenizer, tmp_path
):
    tar = count([write_llava_tar(str(tmp_path / "all.tar"), convs)], tokenizer, Conversations())
    path = llava_onevision_parquet(str(tmp_path / "all.parquet"), convs, "images")
    parquet = count([path], tokenizer, Conversations())
    assert (parquet.documents, parquet.skipped) == (len(convs), {}) == (tar.documents, tar.skipped)
    assert parquet.total_batches == tar.total_batches
    got, want = batches(parquet), batches(tar)
    assert len(got) > 1 and got == want


def test_the_cauldron_s_turns_equal_the_llava_conversation_with_its_images_first(convs, tokenizer, tmp_path):
    """A Cauldron row names no image in its turns: its images lead the first user turn, as the
    LLaVA conversation whose first human value starts with one ``<image>`` per image."""
    rows, llava = [], []
    for c in convs:
        if c["conversations"][0]["from"] == "system":
            continue
        pairs = list(zip(c["conversations"][::2], c["conversations"][1::2], strict=True))
        items = [
            {"user": h["value"].replace(IMAGE, "").strip(), "assistant": g["value"], "source": "vqa"}
            for h, g in pairs
        ]
        rows.append({"key": c["key"], "texts": items, "images": c["images"]})
        turns = []
        for j, item in enumerate(items):
            lead = IMAGE * len(c["images"]) if j == 0 else ""
            turns += [
                {"from": "human", "value": lead + item["user"]},
                {"from": "gpt", "value": item["assistant"]},
            ]
        names = [f"{j}.jpg" for j in range(len(c["images"]))]
        llava.append({"key": c["key"], "conversations": turns, "images": c["images"], "names": names})
    path = str(tmp_path / "cauldron.parquet")
    table = pa.table(
        {
            "key": pa.array([r["key"] for r in rows]),
            "images": pa.array(
                [[{"bytes": b, "path": None} for b in r["images"]] for r in rows], pa.list_(IMAGE_STRUCT)
            ),
            "texts": pa.array([r["texts"] for r in rows], pa.list_(CAULDRON_TURN)),
        }
    )
    pq.write_table(table, path, row_group_size=4)
    tar = count([write_llava_tar(str(tmp_path / "cauldron.tar"), llava)], tokenizer, Conversations())
    parquet = count([path], tokenizer, Conversations(field="texts"))
    assert (parquet.documents, parquet.skipped) == (len(rows), {}) == (tar.documents, tar.skipped)
    got, want = batches(parquet), batches(tar)
    assert len(got) > 1 and got == want


def pairs_of(tar_path: str) -> list[tuple[str, bytes, str]]:
    with tarfile.open(tar_path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    keys = sorted({name.rsplit(".", 1)[0] for name in members})
    return [(k, members[f"{k}.jpg"], members[f"{k}.txt"].decode()) for k in keys]


@pytest.mark.parametrize("shape", ["img2dataset", "datasets"])
def test_caption_pairs_equal_the_tar_s_batches(shape, tokenizer, tmp_path):
    """img2dataset's ``jpg`` (binary) + ``txt``, or a ``datasets`` Image struct ``image`` beside
    ``caption`` under ``Captions(image_keys=("image",), caption_key="caption")``."""
    tar_path = write_caption_tar(str(tmp_path / "pairs.tar"), 30, seed=4)
    pairs = pairs_of(tar_path)
    keys = pa.array([k for k, _, _ in pairs])
    if shape == "img2dataset":
        table = pa.table(
            {
                "__key__": keys,
                "jpg": pa.array([j for _, j, _ in pairs], pa.binary()),
                "txt": [t for *_, t in pairs],
            }
        )
        layout = Captions()
    else:
        images = pa.array([{"bytes": j, "path": f"{k}.jpg"} for k, j, _ in pairs], IMAGE_STRUCT)
        table = pa.table({"key": keys, "image": images, "caption": [t for *_, t in pairs]})
        layout = Captions(image_keys=("image",), caption_key="caption")
    path = str(tmp_path / "pairs.parquet")
    pq.write_table(table, path, row_group_size=7)
    tar = count([tar_path], tokenizer, Captions())
    parquet = count([path], tokenizer, layout)
    assert (parquet.documents, parquet.skipped) == (30, {}) == (tar.documents, tar.skipped)
    got, want = batches(parquet), batches(tar)
    assert len(got) > 1 and got == want


def test_a_pair_without_its_image_or_caption_is_skipped_with_the_tar_s_reason(tokenizer, tmp_path):
    tar_path = write_caption_tar(str(tmp_path / "pairs.tar"), 6, seed=4)
    pairs = pairs_of(tar_path)
    jpgs = [None if i == 1 else j for i, (_, j, _) in enumerate(pairs)]
    txts = [None if i == 4 else t for i, (*_, t) in enumerate(pairs)]
    path = str(tmp_path / "pairs.parquet")
    pq.write_table(pa.table({"jpg": pa.array(jpgs, pa.binary()), "txt": txts}), path)
    counts = count([path], tokenizer, Captions())
    assert counts.skipped == {"missing_image": 1, "missing_text": 1} and counts.documents == 4


# The defects a Parquet row can hold: a value that is not a string, or a conversation that is not
# a list, cannot be written in these columns' types.
PARQUET_BAD_KINDS = [
    "more_placeholders",
    "fewer_placeholders",
    "unknown_role",
    "from_missing",
    "no_assistant",
]


@pytest.mark.parametrize("kind", PARQUET_BAD_KINDS)
def test_a_malformed_conversation_row_is_skipped_with_the_tar_s_reason(kind, tokenizer, tmp_path):
    good = real_conversations(4, seed=7)
    convs = good[:2] + [bad_conversation(kind)] + good[2:]
    tar = count([write_llava_tar(str(tmp_path / "bad.tar"), convs)], tokenizer, Conversations())
    path = llava_onevision_parquet(str(tmp_path / "bad.parquet"), convs, "images", row_group_size=2)
    parquet = count([path], tokenizer, Conversations())
    assert parquet.skipped == tar.skipped == {BAD_KINDS[kind]: 1}
    assert parquet.documents == tar.documents == 4
    assert batches(parquet) == batches(tar)


def test_a_null_conversation_and_a_file_without_the_turns_column(tokenizer, tmp_path):
    """A null ``conversations`` is ``bad_json``, as a sample without the list; a file without the
    column cannot be read at all and says which column it lacks."""
    convs = real_conversations(3, seed=7)
    path = llava_onevision_parquet(str(tmp_path / "c.parquet"), convs, "images")
    table = pq.read_table(path)
    turns = table.column("conversations").to_pylist()
    turns[1] = None
    nulled = table.set_column(1, "conversations", pa.array(turns, pa.list_(TURN)))
    pq.write_table(nulled, path)
    assert count([path], tokenizer, Conversations()).skipped == {"bad_json": 1}
    with pytest.raises(ValueError, match="turns"):
        count([path], tokenizer, Conversations(field="turns"))
