"""One string of invalid UTF-8 in a Parquet file skips that one document or sample, as the tar
and JSONL paths do (``bad_utf8``), never its whole row group; and the skip's detail names the
file, the row and the first invalid byte, never the bytes themselves.

The files are real Parquet written by pyarrow (a ``string`` column whose one value is not UTF-8:
pyarrow writes what it is given, as a buggy producer's file holds it) with real captions (the
shared data's img2dataset file) and real photos.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus import good_samples, sample_members, tar_bytes, write_file
from shardstream import ShardLoader, TextLoader, count_tokens
from text_corpus import GPT2_STYLE, captions

tokenizers = pytest.importorskip("tokenizers")

BAD_ROW, BAD_BYTE = 37, 5


def with_bad_byte(texts: list[str], row: int) -> list[bytes]:
    """``texts`` as UTF-8, the one at ``row`` with a lone 0xff inserted at byte ``BAD_BYTE``."""
    data = [t.encode() for t in texts]
    data[row] = data[row][:BAD_BYTE] + b"\xff" + data[row][BAD_BYTE:]
    return data


def strings(values: list[bytes]) -> pa.Array:
    """A pyarrow ``string`` array holding ``values`` as they are (a view of binary: unchecked)."""
    return pa.array(values, pa.binary()).view(pa.string())


def test_one_bad_document_of_a_row_group_is_skipped_alone_by_count_tokens_and_textloader(tmp_path):
    docs = captions()[:100]
    path = str(tmp_path / "docs.parquet")
    pq.write_table(pa.table({"text": strings(with_bad_byte(docs, BAD_ROW))}), path, row_group_size=50)
    assert pq.ParquetFile(path).metadata.num_row_groups == 2
    assert pq.ParquetFile(path).schema_arrow.field("text").type == pa.string()

    counts = count_tokens(path, tokenizer=GPT2_STYLE, threads=2)
    assert counts.failed == [], counts.failed
    assert (counts.documents, counts.skipped) == (99, {"bad_utf8": 1})
    assert [u["documents"] for u in counts.units] == [49, 50]
    example = counts.units[0]["examples"][0]
    assert (example["reason"], example["key"]) == ("bad_utf8", f"docs/{BAD_ROW}")
    # File, row and the offset of the first invalid byte; never the document's bytes.
    assert "docs.parquet" in example["url"]
    assert f"row {BAD_ROW}" in example["detail"] and f"index {BAD_BYTE}" in example["detail"]
    assert docs[BAD_ROW][:BAD_BYTE] not in example["detail"] and len(example["detail"]) < 120

    tok = tokenizers.Tokenizer.from_file(GPT2_STYLE)
    eos = tok.token_to_id("</s>")
    ids = [e.ids + [eos] for e in tok.encode_batch(docs, add_special_tokens=False)]
    units = [
        [t for i in range(0, 50) if i != BAD_ROW for t in ids[i]],
        [t for i in range(50, 100) for t in ids[i]],
    ]
    assert [u["tokens"] for u in counts.units] == [len(u) for u in units]

    seq_len = 16
    loader = TextLoader(counts, batch_size=1, seq_len=seq_len, block_rows=1, rank=0, world_size=1)
    flat = [int(t) for batch in loader for row in batch.input_ids.numpy() for t in row]
    remainder = loader.stats["remainder_tokens"]
    assert len(flat) + remainder == counts.total_tokens and remainder < seq_len
    # The epoch lays the two row groups out in a seeded order: the rows are that stream, cut.
    assert any(flat == (a + b)[: len(flat)] for a, b in (units, units[::-1]))
    assert loader.stats["skipped"] == {"bad_utf8": 1}


def test_one_bad_caption_skips_its_sample_alone_and_the_rest_of_its_row_group_is_yielded(tmp_path):
    samples = good_samples(20, seed=11, prefix="k")
    texts = captions()[200:220]
    bad_row = 7
    path = str(tmp_path / "pairs.parquet")
    table = pa.table(
        {
            "key": pa.array([k for k, _ in samples], pa.string()),
            "caption": strings(with_bad_byte(texts, bad_row)),
            "jpg": pa.array([s["jpg"] for _, s in samples], pa.binary()),
        }
    )
    pq.write_table(table, path, row_group_size=10)
    # The same samples as a tar, the bad caption's bytes as they are: its path skips just that one.
    tar = str(tmp_path / "pairs.tar")
    members = []
    for (key, s), caption in zip(samples, with_bad_byte(texts, bad_row), strict=True):
        members += sample_members(key, {"jpg": s["jpg"], "caption": caption})
    write_file(tar, tar_bytes(members))

    def read(url: str) -> tuple[dict[str, tuple[bytes, str]], dict[str, int]]:
        loader = ShardLoader(
            url,
            batch_size=4,
            image_size=32,
            drop_last=False,
            caption_key="caption",
            image_keys=["jpg"],
            rank=0,
            world_size=1,
        )
        got = {
            key: (batch.images[i].numpy().tobytes(), batch.texts[i])
            for batch in loader
            for i, key in enumerate(batch.keys)
        }
        return got, loader.stats["skipped"]

    got, skipped = read(path)
    want_keys = [k for i, (k, _) in enumerate(samples) if i != bad_row]
    assert sorted(got) == want_keys, "the other 9 samples of the bad caption's row group are yielded"
    assert skipped == {"bad_utf8": 1}
    assert {k: t for k, (_, t) in got.items()} == {
        k: texts[i].strip() for i, (k, _) in enumerate(samples) if i != bad_row
    }
    assert (got, skipped) == read(tar), "the same samples, pixels and captions as the tar's path"
    assert os.path.getsize(path) > 0
