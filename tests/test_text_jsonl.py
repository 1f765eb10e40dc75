"""JSONL sources for the packed text kind, on real text: plain, gzip and zstd files count and
pack exactly as the same documents in Parquet, their ids are the ``tokenizers`` package's, each
kind of bad line is a counted skip with its reason and line number, a line over the cap is never
held, a truncated stream fails its file by name, and a corpus served over HTTP reads as on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from shardstream import TextLoader, UnreadableUnitsWarning, count_tokens
from shardstream.urls import SHARD_SUFFIXES, TEXT_SUFFIXES, expand_urls
from text_corpus import (
    GPT2_STYLE,
    documents,
    jsonl_lines,
    write_code_tars,
    write_jsonl,
    write_jsonl_corpus,
    write_parquet_corpus,
)

tokenizers = pytest.importorskip("tokenizers")

FILES = 3


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return documents(30)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory, docs) -> list[str]:
    # One row group per file: the same units as one JSONL file each.
    return write_parquet_corpus(
        str(tmp_path_factory.mktemp("parquet")), docs, files=FILES, rows_per_group=len(docs)
    )


@pytest.fixture(scope="module")
def jsonl_dir(tmp_path_factory, docs) -> str:
    """The Parquet corpus's documents as JSONL, once per compression."""
    root = str(tmp_path_factory.mktemp("jsonl"))
    for suffix in (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz"):
        write_jsonl_corpus(os.path.join(root, suffix.lstrip(".")), docs, files=FILES, suffix=suffix)
    return root


def reference_stream(texts: list[str]) -> list[int]:
    """The texts as the ``tokenizers`` package encodes them, each followed by the EOS."""
    tok = tokenizers.Tokenizer.from_file(GPT2_STYLE)
    eos = tok.token_to_id("</s>")
    return [i for e in tok.encode_batch(texts, add_special_tokens=False) for i in [*e.ids, eos]]


def rows_of(loader: TextLoader) -> list[np.ndarray]:
    return [row.copy() for batch in loader for row in batch.input_ids.numpy()]


LOADER = dict(batch_size=3, seq_len=64, block_rows=4, seed=7)


def test_plain_gzip_and_zstd_jsonl_count_and_pack_as_the_same_documents_in_parquet(jsonl_dir, parquet, docs):
    want = count_tokens(parquet, tokenizer=GPT2_STYLE)
    want_rows = [rows_of(TextLoader(want, rank=r, world_size=2, **LOADER)) for r in range(2)]
    streams = [reference_stream(docs[f::FILES]) for f in range(FILES)]
    assert [u["tokens"] for u in want.units] == [len(s) for s in streams]
    for name in ("jsonl", "jsonl.gz", "jsonl.zst", "json.gz"):
        # A directory: the text kind's listing takes JSONL files.
        counts = count_tokens(os.path.join(jsonl_dir, name), tokenizer=GPT2_STYLE, text_key="text")
        assert [os.path.basename(u["url"]) for u in counts.units] == [
            f"part-{f:03d}.{name}" for f in range(FILES)
        ]
        assert all(u["rows"] is None and u["first_row"] == 0 for u in counts.units)
        assert [u["tokens"] for u in counts.units] == [u["tokens"] for u in want.units], name
        assert (counts.documents, counts.skipped, counts.failed) == (len(docs), {}, []), name
        rows = [rows_of(TextLoader(counts, rank=r, world_size=2, **LOADER)) for r in range(2)]
        for got, expected in zip(rows, want_rows, strict=True):
            assert len(got) == len(expected) > 0
            assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)), name


def test_jsonl_ids_are_the_tokenizers_packages_in_file_order(jsonl_dir, docs):
    counts = count_tokens(os.path.join(jsonl_dir, "jsonl.zst"), tokenizer=GPT2_STYLE, text_key="json:text")
    loader = TextLoader(counts, batch_size=1, seq_len=32, block_rows=1, rank=0, world_size=1)
    flat = np.concatenate(rows_of(loader)).tolist()
    # One rank, no row shuffle: the epoch is the files' streams, each whole, in the plan's order.
    streams = [reference_stream(docs[f::FILES]) for f in range(FILES)]
    left, at = list(range(FILES)), 0
    while at < len(flat):
        (match,) = [f for f in left if flat[at : at + len(streams[f])] == streams[f][: len(flat) - at]]
        left.remove(match)
        at += len(streams[match])
    assert len(flat) + loader.stats["remainder_tokens"] == counts.total_tokens


# One bad line of each kind, each in a file of its own between real documents: (line, reason).
BAD_LINES = {
    "not_json": (b"<html><body>404</body></html>\n", "bad_json"),
    "array": (b'["text", "an array"]\n', "bad_json"),
    "two_objects": (b'{"text": "a"} {"text": "b"}\n', "bad_json"),
    "no_field": (b'{"id": 7, "content": "the text is elsewhere"}\n', "missing_text"),
    "null_field": (b'{"id": 7, "text": null}\n', "missing_text"),
    "blank": (b"  \n", "missing_text"),
    "number": (b'{"id": 7, "text": 12345}\n', "wrong_type"),
    "latin1": ('{"text": "caf\u00e9"}\n'.encode("latin-1"), "bad_utf8"),
    "huge": (b'{"text": "' + b"x = 1\\n" * 700_000 + b'"}\n', "member_too_large"),  # 5 MB
}


def test_each_kind_of_bad_line_is_a_counted_skip_with_its_reason_and_line_number(tmp_path, docs):
    good = docs[:5]
    paths = []
    for name, (line, _) in BAD_LINES.items():
        lines = jsonl_lines(good)
        lines.insert(3, line)
        paths.append(write_jsonl(str(tmp_path / f"{name}.jsonl.gz"), lines))
    counts = count_tokens(paths, tokenizer=GPT2_STYLE, max_document_bytes=64 << 10)
    assert counts.failed == []
    for unit, (name, (_, reason)) in zip(counts.units, BAD_LINES.items(), strict=True):
        assert os.path.basename(unit["url"]) == f"{name}.jsonl.gz"
        assert unit["skipped"] == {reason: 1}, name
        (example,) = unit["examples"]
        assert (example["reason"], example["key"]) == (reason, "line 4"), name
        assert example["url"].endswith(f"{name}.jsonl.gz")
        assert unit["documents"] == len(good) and unit["tokens"] == len(reference_stream(good)), name
    assert counts.skipped == {
        "bad_json": 3,
        "missing_text": 3,
        "wrong_type": 1,
        "bad_utf8": 1,
        "member_too_large": 1,
    }
    huge = counts.units[list(BAD_LINES).index("huge")]["examples"][0]
    assert "over max_document_bytes (65536)" in huge["detail"]


def test_the_cli_validates_a_jsonl_directory_by_typed_reason(tmp_path, docs):
    from cli_runs import run_cli

    lines = jsonl_lines(docs[:6])
    lines[2] = b"{not json\n"
    (tmp_path / "corpus").mkdir()
    write_jsonl(str(tmp_path / "corpus" / "a.jsonl"), lines)
    write_jsonl(str(tmp_path / "corpus" / "b.jsonl.zst"), jsonl_lines(docs[6:9]))
    report = tmp_path / "r.json"
    run = run_cli(["validate", str(tmp_path / "corpus"), "--tokenizer", GPT2_STYLE, "--json", str(report)])
    assert run.returncode == 1 and "bad_json 1" in run.stdout, run.stdout + run.stderr
    data = json.loads(report.read_text())
    assert data["units"] == 2 and data["documents"] == 8 and data["skipped"] == {"bad_json": 1}
    assert data["examples"][0]["key"] == "line 3" and data["examples"][0]["url"].endswith("a.jsonl")


def test_a_line_over_the_cap_is_never_held_in_memory(tmp_path, docs):
    """Peak RSS of counting a file whose second line is 128 MiB: under a 64 KiB cap it grows by
    far less than the line; with a cap above the line (the control) it grows by the line."""
    import gzip

    small = write_jsonl(str(tmp_path / "small.jsonl.gz"), jsonl_lines(docs[:3]))
    big = str(tmp_path / "big.jsonl.gz")
    head, *tail = jsonl_lines(docs[:3])
    with gzip.open(big, "wb", compresslevel=1) as f:
        f.write(head + b'{"text": 5, "pad": "')  # no text: the control never tokenizes it
        for _ in range(128):
            f.write(b"x" * (1 << 20))
        f.write(b'"}\n' + b"".join(tail))
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec.
    script = textwrap.dedent(
        f"""
        import json
        from shardstream import count_tokens

        def peak():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmHWM:"))

        peaks, skipped = [], []
        for path, cap in (({small!r}, 64 << 10), ({big!r}, 64 << 10), ({big!r}, 1 << 30)):
            c = count_tokens(path, tokenizer={GPT2_STYLE!r}, max_document_bytes=cap, threads=1)
            skipped.append(c.skipped)
            peaks.append(peak())
        print(json.dumps([peaks, skipped]))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    (base, capped, uncapped), skipped = json.loads(run.stdout)
    assert skipped == [{}, {"member_too_large": 1}, {"wrong_type": 1}]
    assert capped - base < 24 << 20, f"the capped read grew by {(capped - base) >> 20} MiB"
    assert uncapped - capped > 100 << 20, "the control: a line within the cap is held"


def test_a_truncated_stream_fails_its_file_by_name(tmp_path, docs):
    whole = write_jsonl(str(tmp_path / "whole.jsonl"), jsonl_lines(docs[:20]))
    cut = []
    for suffix in (".jsonl.gz", ".jsonl.zst"):
        path = write_jsonl(str(tmp_path / f"cut{suffix}"), jsonl_lines(docs[:20]))
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
        cut.append(path)
    with pytest.warns(UnreadableUnitsWarning, match=r"cut\.jsonl\.gz: corrupt_stream"):
        counts = count_tokens([whole, *cut], tokenizer=GPT2_STYLE)
    assert [os.path.basename(u["url"]) for u in counts.units] == ["whole.jsonl"]
    assert [(os.path.basename(f["url"]), f["error"]["reason"]) for f in counts.failed] == [
        ("cut.jsonl.gz", "corrupt_stream"),
        ("cut.jsonl.zst", "corrupt_stream"),
    ]
    assert "gzip stream is truncated or corrupt after line" in counts.failed[0]["error"]["detail"]
    with pytest.raises(
        ValueError, match=r"corrupt_stream in 1 files \(e\.g\. .*cut\.jsonl\.gz: the gzip stream"
    ):
        count_tokens(cut[0], tokenizer=GPT2_STYLE)


def test_an_empty_or_blank_file_gives_the_no_document_error(tmp_path):
    empty = write_jsonl(str(tmp_path / "empty.jsonl"), [])
    with pytest.raises(ValueError, match="no document of .* encodes to a token: the files hold no documents"):
        count_tokens(empty, tokenizer=GPT2_STYLE)
    empty_gz = write_jsonl(str(tmp_path / "empty.jsonl.gz"), [])
    with pytest.raises(ValueError, match="the files hold no documents"):
        count_tokens(empty_gz, tokenizer=GPT2_STYLE)
    blank = write_jsonl(str(tmp_path / "blank.jsonl"), [b"\n", b"\n"])
    with pytest.raises(
        ValueError, match=r"2 documents missing_text \(e\.g\. .*blank\.jsonl line 1: a blank line"
    ):
        count_tokens(blank, tokenizer=GPT2_STYLE)


def test_a_jsonl_corpus_over_http_reads_as_the_local_files(jsonl_dir):
    from servers import RangeHTTPServer

    local = count_tokens(os.path.join(jsonl_dir, "jsonl.gz"), tokenizer=GPT2_STYLE)
    local_rows = rows_of(TextLoader(local, rank=0, world_size=1, **LOADER))
    with RangeHTTPServer(os.path.join(jsonl_dir, "jsonl.gz")) as server:
        urls = [server.url(f"part-{f:03d}.jsonl.gz") for f in range(FILES)]
        remote = count_tokens(urls, tokenizer=GPT2_STYLE)
        assert [u["tokens"] for u in remote.units] == [u["tokens"] for u in local.units]
        assert (remote.documents, remote.skipped) == (local.documents, {})
        assert all(u["identity"] for u in remote.units)
        rows = rows_of(TextLoader(remote, rank=0, world_size=1, **LOADER))
    assert len(rows) == len(local_rows) > 0
    assert all(np.array_equal(a, b) for a, b in zip(rows, local_rows, strict=True))


def test_only_text_corpus_listings_take_jsonl_files(tmp_path):
    write_code_tars(str(tmp_path), [("a", b"x = 1\n")], shards=1)
    for name in ("b.jsonl", "c.jsonl.zst", "d.json.gz", "notes.json", "e.parquet"):
        (tmp_path / name).write_bytes(b"")

    def names(shards: list) -> list[str]:
        return sorted(os.path.basename(s.url) for s in shards)

    assert names(expand_urls(str(tmp_path))) == ["code-000.tar", "e.parquet"]
    assert names(expand_urls(str(tmp_path), suffixes=TEXT_SUFFIXES)) == [
        "b.jsonl",
        "c.jsonl.zst",
        "code-000.tar",
        "d.json.gz",
        "e.parquet",
    ]
    assert set(SHARD_SUFFIXES) < set(TEXT_SUFFIXES)


def test_a_jsonl_folder_on_the_hub_reads_as_the_local_files(jsonl_dir, monkeypatch, tmp_path):
    from hub_server import LocalHub

    folder = os.path.join(jsonl_dir, "jsonl.zst")
    local = count_tokens(folder, tokenizer=GPT2_STYLE)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with LocalHub(token="hf_jsonl_test_token") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        files = {f"data/{n}": open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}
        hub.push("acme/fineweb-like", {**files, "data/README.md": b"# not a shard\n"})
        # The folder's listing takes the JSONL files and leaves the README.
        remote = count_tokens("hf://datasets/acme/fineweb-like/data/", tokenizer=GPT2_STYLE)
        assert [u["display"].rsplit("/", 1)[1] for u in remote.units] == sorted(os.listdir(folder))
        assert [u["tokens"] for u in remote.units] == [u["tokens"] for u in local.units]
        assert (remote.documents, remote.skipped, remote.failed) == (local.documents, {}, [])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_jsonl_prefix_on_s3_reads_as_the_local_files(jsonl_dir, hermetic_aws_env, monkeypatch, tmp_path):
    from servers import SeaweedS3
    from shardstream import SourceOptions

    folder = os.path.join(jsonl_dir, "jsonl.gz")
    local = count_tokens(folder, tokenizer=GPT2_STYLE)
    local_rows = rows_of(TextLoader(local, rank=1, world_size=2, **LOADER))
    with SeaweedS3(str(tmp_path / "seaweed")) as server:
        server.upload_dir("text-corpus", folder, prefix="fineweb/")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        source = SourceOptions(**server.s3_options())
        # A prefix: the listing takes the JSONL files; each is read through a presigned URL.
        remote = count_tokens("s3://text-corpus/fineweb/", tokenizer=GPT2_STYLE, source=source)
        assert [u["display"] for u in remote.units] == [
            f"s3://text-corpus/fineweb/part-{f:03d}.jsonl.gz" for f in range(FILES)
        ]
        assert [u["tokens"] for u in remote.units] == [u["tokens"] for u in local.units]
        assert (remote.documents, remote.skipped, remote.failed) == (local.documents, {}, [])
        rows = rows_of(TextLoader(remote, rank=1, world_size=2, source=source, **LOADER))
    assert len(rows) == len(local_rows) > 0
    assert all(np.array_equal(a, b) for a, b in zip(rows, local_rows, strict=True))
