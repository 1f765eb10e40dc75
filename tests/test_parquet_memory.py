"""Parquet files whose row groups are far larger than memory should allow: a reader holds a piece
of a row group at a time, never the whole, and a value over its cap is skipped as it streams past
(``member_too_large``) without being held. Each file is built here from real text, then counted
and loaded in a fresh process that reports its peak resident memory (VmHWM) over its baseline,
checked against the bound docs/guides/memory.md states."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from text_corpus import GPT2_STYLE, documents

MiB = 1 << 20


def text_bound(cap: int, compressed: int) -> int:
    """docs/guides/memory.md's bound of one Parquet reader thread, R = C + 2 x cap + 150 MiB, and
    64 MiB for the tokenizer and the batches of a loader of one thread."""
    return compressed + 2 * cap + 150 * MiB + 64 * MiB


@pytest.fixture(scope="module")
def text() -> bytes:
    return "\n\n".join(documents(20)).encode()


def repeat_to(text: bytes, size: int) -> str:
    return (text * (size // len(text) + 1))[:size].decode("utf-8", "ignore")


def peak_of(script: str) -> dict:
    """Runs `script` in a fresh process that prints a JSON object; adds ``grown``, its peak
    resident memory over the baseline it measured after importing."""
    prelude = textwrap.dedent(
        """
        import json
        def peak():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmHWM:"))
        import shardstream
        from shardstream import TextLoader, count_tokens
        base = peak()
        """
    )
    epilogue = "\nout['grown'] = peak() - base\nprint(json.dumps(out))\n"
    run = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script) + epilogue],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bomb(tmp_path_factory, text) -> tuple[str, list[str]]:
    """48 documents of 48 MiB in one zstd row group without a dictionary (about 300 KB on disk,
    2.4 GB decompressed), with three ordinary documents among them."""
    big = repeat_to(text[:4096], 48 * MiB)  # a 4 KB period: zstd's window keeps it, ~300 KB
    small = [repeat_to(text[i * 1000 :], 3000) for i in range(3)]
    docs = [small[0], *[big] * 24, small[1], *[big] * 24, small[2]]
    path = str(tmp_path_factory.mktemp("bomb") / "bomb.parquet")
    pq.write_table(pa.table({"text": docs}), path, compression="zstd", use_dictionary=False)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    return path, small


@pytest.fixture(scope="module")
def one_big_group(tmp_path_factory, text) -> str:
    """120,000 ordinary documents of 4 KB in the one row group pq.write_table writes by default
    (480 MB of text; the issue's 300,000 show the same, slower)."""
    docs = [repeat_to(text[(i * 997) % (len(text) - 5000) :], 4096) for i in range(120_000)]
    path = str(tmp_path_factory.mktemp("big") / "big.parquet")
    pq.write_table(pa.table({"text": docs}), path)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    return path


def test_values_over_the_cap_stream_past_and_the_rest_is_read(bomb):
    path, small = bomb
    cap = 16 * MiB
    out = peak_of(
        f"""
        c = count_tokens({path!r}, tokenizer={GPT2_STYLE!r}, max_document_bytes={cap}, threads=1)
        out = {{"documents": c.documents, "skipped": c.skipped}}
        """
    )
    assert out["skipped"] == {"member_too_large": 48}
    assert out["documents"] == 3
    bound = text_bound(cap, os.path.getsize(path))
    assert out["grown"] < min(bound, 1 << 30), f"counting grew by {out['grown'] >> 20} MiB"


def test_a_loader_over_the_bomb_yields_the_ordinary_documents(bomb):
    path, small = bomb
    cap = 16 * MiB
    out = peak_of(
        f"""
        c = count_tokens({path!r}, tokenizer={GPT2_STYLE!r}, max_document_bytes={cap}, threads=1)
        loader = TextLoader(c, batch_size=1, seq_len=64, threads=1)
        flat = [i for b in loader for i in b.input_ids.flatten().tolist()]
        s = loader.stats
        out = {{"flat": flat, "skipped": s["skipped"], "rest": s["remainder_tokens"]}}
        out["total"] = c.total_tokens
        """
    )
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(GPT2_STYLE)
    eos = tok.token_to_id("</s>")
    want = Counter(i for s in small for i in [*tok.encode(s, add_special_tokens=False).ids, eos])
    assert out["skipped"] == {"member_too_large": 48}
    assert len(out["flat"]) + out["rest"] == out["total"] == sum(want.values())
    assert not Counter(out["flat"]) - want, "every token loaded is one of the ordinary documents'"
    assert out["grown"] < 1 << 30, f"loading grew by {out['grown'] >> 20} MiB"


def test_one_large_row_group_is_read_in_pieces(one_big_group):
    out = peak_of(
        f"""
        c = count_tokens({one_big_group!r}, tokenizer={GPT2_STYLE!r}, threads=1)
        out = {{"documents": c.documents, "skipped": c.skipped}}
        loader = TextLoader(c, batch_size=8, seq_len=512, threads=1)
        for i, b in zip(range(50), loader):
            pass
        """
    )
    assert (out["documents"], out["skipped"]) == (120_000, {})
    bound = text_bound(64 * MiB, os.path.getsize(one_big_group))
    assert out["grown"] < min(bound, 1 << 30), f"grew by {out['grown'] >> 20} MiB"


def test_image_bytes_over_the_cap_are_skipped_by_reason(tmp_path, text):
    """The same shape as image bytes: a ShardLoader over Parquet skips 8 values of 48 MiB under
    a 16 MiB member cap without holding them, and decodes the real photos beside them."""
    from PIL import Image
    from skimage import data as images

    photos = []
    for name in ("astronaut", "coffee", "chelsea"):
        buf = io.BytesIO()
        Image.fromarray(getattr(images, name)()).save(buf, format="JPEG")
        photos.append(buf.getvalue())
    big = repeat_to(text[:4096], 48 * MiB).encode()
    jpgs = [photos[0], *[big] * 4, photos[1], *[big] * 4, photos[2]]
    caps = [f"caption {i}" for i in range(len(jpgs))]
    path = str(tmp_path / "images.parquet")
    pq.write_table(
        pa.table({"jpg": pa.array(jpgs, pa.binary()), "txt": caps}),
        path,
        compression="zstd",
        use_dictionary=False,
    )
    out = peak_of(
        f"""
        loader = shardstream.ShardLoader({path!r}, batch_size=1, image_size=32, image_keys=["jpg"],
                                         caption_key="txt", max_member_bytes={16 * MiB}, drop_last=False)
        n = sum(len(b.keys) for b in loader)
        out = {{"images": n, "skipped": loader.stats["skipped"]}}
        """
    )
    assert out["images"] == 3
    assert out["skipped"] == {"member_too_large": 8}
    assert out["grown"] < 1 << 30, f"grew by {out['grown'] >> 20} MiB"


# -- the interleaved kind ----------------------------------------------------------------------------

INTERLEAVED_DOCS, INTERLEAVED_BOMBS = 600, 12


def interleaved_table(text: bytes) -> pa.Table:
    """OBELICS-style documents (``key``, ``texts: list<string>``, ``images: list<binary>``):
    600 ordinary ones of real captions around real photos (scikit-image, as JPEG), and among
    them 12 of one 48 MiB text each (a 4 KB period: zstd keeps them to ~300 KB each)."""
    from PIL import Image
    from skimage import data as images

    photos = []
    for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry"):
        buf = io.BytesIO()
        Image.fromarray(getattr(images, name)()).save(buf, format="JPEG", quality=85)
        photos.append(buf.getvalue())
    big = repeat_to(text[:4096], 48 * MiB)
    keys, texts, imgs = [], [], []
    every = INTERLEAVED_DOCS // INTERLEAVED_BOMBS
    for i in range(INTERLEAVED_DOCS):
        a, b = (i * 997) % (len(text) - 2000), (i * 577) % (len(text) - 2000)
        keys.append(f"doc-{i:05d}")
        texts.append([repeat_to(text[a:], 600), None, repeat_to(text[b:], 300)])
        imgs.append([None, photos[i % len(photos)], None])
        if i % every == every // 2:
            keys.append(f"bomb-{i:05d}")
            texts.append([big])
            imgs.append([None])
    return pa.table(
        {
            "key": keys,
            "texts": pa.array(texts, pa.list_(pa.string())),
            "images": pa.array(imgs, pa.list_(pa.binary())),
        }
    )


@pytest.fixture(scope="module")
def interleaved_files(tmp_path_factory, text) -> tuple[str, str]:
    """The documents of :func:`interleaved_table` in one zstd row group without a dictionary
    (about 2 MB of compressed text, the photos, and 576 MiB of text decompressed), and the same
    rewritten in row groups of 50 rows."""
    root = tmp_path_factory.mktemp("interleaved")
    table = interleaved_table(text)
    one, small = str(root / "one.parquet"), str(root / "small.parquet")
    pq.write_table(table, one, compression="zstd", use_dictionary=False)
    pq.write_table(table, small, compression="zstd", use_dictionary=False, row_group_size=50)
    assert pq.ParquetFile(one).metadata.num_row_groups == 1
    assert pq.ParquetFile(small).metadata.num_row_groups > 10
    return one, small


@pytest.fixture(scope="module")
def vlm_tokenizer(tmp_path_factory) -> str:
    from qwen_reference import write_tokenizer_json

    return write_tokenizer_json(str(tmp_path_factory.mktemp("vlm-tok") / "tokenizer.json"))


INTERLEAVED_COUNT = """
from shardstream import InterleavedLoader, QwenVL, count_interleaved
c = count_interleaved({path!r}, tokenizer={tokenizer!r}, spec=QwenVL(max_pixels=28 * 28 * 64), seq_len=512,
                      batch_size=2, eos_token="</s>", max_document_bytes={cap}, threads=1)
"""


def test_an_interleaved_row_group_is_read_in_pieces(interleaved_files, vlm_tokenizer):
    """docs/guides/memory.md's bound for the interleaved kind: the 576 MiB of text over the cap
    are skipped as they stream past, and the one row group is read a piece at a time."""
    path, _ = interleaved_files
    cap = 16 * MiB
    out = peak_of(
        INTERLEAVED_COUNT.format(path=path, tokenizer=vlm_tokenizer, cap=cap)
        + """
loader = InterleavedLoader(c, pad_token_id=2, threads=1)
n = sum(len(b.keys) for b, _ in zip(loader, range(40)))
out = {"documents": c.documents, "skipped": c.skipped, "read": n}
"""
    )
    assert out["skipped"] == {"member_too_large": INTERLEAVED_BOMBS}
    assert out["documents"] == INTERLEAVED_DOCS and out["read"] > 40
    bound = text_bound(cap, os.path.getsize(path))
    assert out["grown"] < min(bound, 1 << 30), f"grew by {out['grown'] >> 20} MiB (bound {bound >> 20} MiB)"


def test_an_interleaved_file_in_small_row_groups_yields_the_same_batches(interleaved_files, vlm_tokenizer):
    """The pieces never change what a file yields: the one row group and the same documents in
    row groups of 50 give the same documents, skips and batches, byte for byte."""
    import hashlib

    pytest.importorskip("torch")
    from shardstream import InterleavedLoader, QwenVL, count_interleaved

    def epoch(path):
        c = count_interleaved(
            path,
            tokenizer=vlm_tokenizer,
            spec=QwenVL(max_pixels=28 * 28 * 64),
            seq_len=512,
            batch_size=2,
            eos_token="</s>",
            max_document_bytes=16 * MiB,
            threads=1,
        )
        digests = []
        for b in InterleavedLoader(c, pad_token_id=2, threads=1):
            h = hashlib.sha256()
            for t in (b.input_ids, b.labels, b.position_ids, b.pixel_values, b.image_grid_thw):
                h.update(t.numpy().tobytes())
            digests.append((list(b.keys), h.hexdigest()))
        return c.documents, c.skipped, c.total_batches, digests

    one, small = interleaved_files
    got, want = epoch(one), epoch(small)
    assert got[:3] == (INTERLEAVED_DOCS, {"member_too_large": INTERLEAVED_BOMBS}, len(got[3]))
    assert got == want
