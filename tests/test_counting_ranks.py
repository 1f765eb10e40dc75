"""The one counting pass of the kinds planned over unit weights (shardstream.kinds.counting):
split across the ranks of a real torchrun (2 processes, gloo on loopback) it gives every rank the
counts of a one-process pass, and ``shardstream index --tokenizer`` writes the same file; given
the previous counts it reads only new and changed files (the bytes a real HTTP server sent are
counted per file), drops removed ones, and equals a fresh count."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from corpus import tar_bytes, write_file  # noqa: E402
from counting_worker import BUDGET, SPEC  # noqa: E402
from naflex_photos import photo_images  # noqa: E402
from servers import RangeHTTPServer, parse_range  # noqa: E402
from shardstream import PatchCounts, TokenCounts, count_patches, count_tokens  # noqa: E402
from shardstream.cli import main  # noqa: E402
from text_corpus import GPT2_STYLE, documents, write_jsonl, write_parquet_corpus  # noqa: E402
from train_support import torchrun  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "counting_worker.py")
TIMEOUT = 180


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """5 FineWeb-style Parquet files of real text (Python's standard library), 3 row groups each."""
    root = tmp_path_factory.mktemp("counting")
    return write_parquet_corpus(str(root / "data"), documents(20)[:300], files=5, rows_per_group=20)


@pytest.fixture(scope="module")
def photo_shards(tmp_path_factory) -> list[str]:
    """4 tar shards of the real photos (each photo in two shards under other keys)."""
    root = tmp_path_factory.mktemp("counting-photos")
    photos = photo_images()
    paths = []
    for s in range(4):
        members = []
        for key, data in photos[s % 2 :: 2]:
            ext = "png" if data.startswith(b"\x89PNG") else "jpg"
            members += [(f"s{s}-{key}.{ext}", data), (f"s{s}-{key}.txt", f"a photo called {key}".encode())]
        paths.append(write_file(str(root / f"shard-{s:02d}.tar"), tar_bytes(members)))
    return paths


def as_json(counts: TokenCounts | PatchCounts) -> dict:
    """The counts as their file holds them (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(counts)))


def run_worker(kind: str, urls: list[str], out: Path, *extra: str) -> list[dict]:
    """The worker's counts on each of 2 ranks, in rank order."""
    out.mkdir()
    run = torchrun(["--kind", kind, "--out", str(out), *extra, *urls], script=WORKER, timeout=TIMEOUT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


def served(tmp_path: Path, paths: list[str]) -> Path:
    """A folder to serve, holding copies of ``paths``."""
    root = tmp_path / "served"
    root.mkdir()
    for p in paths:
        shutil.copy(p, root)
    return root


def body_bytes(server: RangeHTTPServer, root: str) -> Counter[str]:
    """Body bytes the server sent per file name (GETs; a HEAD sends none)."""
    sent: Counter[str] = Counter()
    for r in server.requests:
        if r.method != "GET":
            continue
        name = r.path.lstrip("/")
        size = os.path.getsize(os.path.join(root, name))
        wanted = parse_range(r.range, size)
        sent[name] += (
            wanted[1] - wanted[0] + 1 if isinstance(wanted, tuple) else size if wanted is None else 0
        )
    return sent


@pytest.mark.slow
def test_two_ranks_count_tokens_as_one_process(corpus, tmp_path):
    one = count_tokens(corpus, tokenizer=GPT2_STYLE, threads=1, output=tmp_path / "one.json")
    ranks = run_worker("tokens", corpus, tmp_path / "job", "--tokenizer", GPT2_STYLE)
    assert ranks[0] == ranks[1] == as_json(one), "every rank holds the one-process counts"
    assert [u["url"] for u in one.units] == [p for p in corpus for _ in range(3)], "in file order"
    assert (tmp_path / "job" / "counts.json").read_bytes() == (tmp_path / "one.json").read_bytes()


@pytest.mark.slow
def test_two_ranks_count_patches_as_one_process_inside_a_training_script(photo_shards, tmp_path):
    one = count_patches(photo_shards, naflex=SPEC, max_patches_per_batch=BUDGET, threads=1)
    one.save(tmp_path / "one.json")
    # torch.distributed already initialised (gloo): the count runs over the caller's group.
    ranks = run_worker("patches", photo_shards, tmp_path / "job", "--init-group")
    assert ranks[0] == ranks[1] == as_json(one)
    assert one.total_batches > 0 and [u["url"] for u in one.units] == photo_shards
    assert (tmp_path / "job" / "counts.json").read_bytes() == (tmp_path / "one.json").read_bytes()


@pytest.mark.slow
def test_torchrun_index_writes_the_one_process_counts_then_reads_only_the_new_files(corpus, tmp_path):
    root = served(tmp_path, corpus[:3])
    names = [os.path.basename(p) for p in corpus]
    index = ["index", "--tokenizer", GPT2_STYLE, "--threads", "1"]
    with RangeHTTPServer(str(root)) as srv:
        urls = [srv.url(n) for n in names]
        assert main([*index, *urls[:3], "-o", str(tmp_path / "one.json"), "-q"]) == 0
        alone = body_bytes(srv, str(root))
        srv.requests.clear()
        run = torchrun(
            [*index, *urls[:3], "-o", str(tmp_path / "two.json")], module="shardstream", timeout=TIMEOUT
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
        assert (tmp_path / "two.json").read_bytes() == (tmp_path / "one.json").read_bytes()
        assert run.stdout.count("token counts written") == 1, "rank 0 alone reports"
        assert body_bytes(srv, str(root)) == alone, "each file read by one rank, as one process reads it"

        for p in corpus[3:]:  # the corpus grows by two files
            shutil.copy(p, root)
        srv.requests.clear()
        run = torchrun(
            [*index, *urls, "-o", str(tmp_path / "two.json")], module="shardstream", timeout=TIMEOUT
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
        sent = body_bytes(srv, str(root))
        assert set(sent) == set(names[3:]), f"only the new files are read: {sent}"
        heads = Counter(r.path.lstrip("/") for r in srv.requests if r.method == "HEAD")
        assert all(heads[n] == 1 for n in names[:3]), "each unchanged file's identity checked once"

        srv.requests.clear()
        assert main([*index, *urls, "-o", str(tmp_path / "fresh.json"), "-q"]) == 0
        fresh = body_bytes(srv, str(root))
        assert all(sent[n] == fresh[n] > 0 for n in names[3:]), (sent, fresh)
    assert (tmp_path / "two.json").read_bytes() == (tmp_path / "fresh.json").read_bytes()
    assert len(TokenCounts.load(tmp_path / "two.json").units) == 15


def test_previous_counts_read_only_new_and_changed_files_and_drop_removed_ones(corpus, tmp_path):
    root = served(tmp_path, corpus[:4])
    names = [os.path.basename(p) for p in corpus]
    with RangeHTTPServer(str(root)) as srv:
        urls = [srv.url(n) for n in names]
        before = count_tokens(urls[:4], tokenizer=GPT2_STYLE, threads=1)
        assert {u["version"] for u in before.units} == {u["identity"] for u in before.units} != {None}

        # names[1] rewritten (other documents, so another size and ETag), names[2] removed from
        # the list, names[4] new.
        write_parquet_corpus(str(tmp_path / "other"), documents(20)[300:330], files=1, rows_per_group=20)
        shutil.copy(tmp_path / "other" / "part-000.parquet", root / names[1])
        listed = [urls[0], urls[1], urls[3], urls[4]]
        shutil.copy(corpus[4], root)
        srv.requests.clear()
        after = count_tokens(listed, tokenizer=GPT2_STYLE, threads=1, previous=before)
        sent = body_bytes(srv, str(root))
        assert set(sent) == {names[1], names[4]}, f"only the changed and the new file are read: {sent}"
        assert sent[names[1]] > 0 and sent[names[4]] > 0
        assert not any(r.path == f"/{names[2]}" for r in srv.requests), "a removed file is not touched"

        fresh = count_tokens(listed, tokenizer=GPT2_STYLE, threads=1)
    assert as_json(after) == as_json(fresh)
    assert list(dict.fromkeys(u["url"] for u in after.units)) == listed, (
        "in the listed order, without names[2]"
    )
    changed = [u for u in after.units if u["url"] == urls[1]]
    assert changed != [u for u in before.units if u["url"] == urls[1]], "the rewritten file's new counts"


def test_a_local_file_rewritten_at_the_same_size_is_counted_again(tmp_path):
    path = tmp_path / "docs.jsonl"
    same = tmp_path / "same.jsonl"
    write_jsonl(str(path), [b'{"text": "aaaaaaaaaaaaaaaa"}\n'] * 20)
    write_jsonl(str(same), [b'{"text": "the cat sat down"}\n'] * 5)
    before = count_tokens([str(path), str(same)], tokenizer=GPT2_STYLE, text_key="text", threads=1)
    size = os.path.getsize(path)
    write_jsonl(str(path), [b'{"text": "a b c d e f g h "}\n'] * 20)
    assert os.path.getsize(path) == size, "the core's identity (the size) is unchanged"
    after = count_tokens(
        [str(path), str(same)], tokenizer=GPT2_STYLE, text_key="text", threads=1, previous=before
    )
    fresh = count_tokens([str(path), str(same)], tokenizer=GPT2_STYLE, text_key="text", threads=1)
    assert as_json(after) == as_json(fresh)
    assert after.units[0]["tokens"] != before.units[0]["tokens"], "counted again, not reused"
    assert after.units[1] == before.units[1]


def test_previous_patch_counts_saved_to_a_path_give_the_fresh_count(photo_shards, tmp_path):
    shards = [shutil.copy(p, tmp_path) for p in photo_shards[:3]]
    previous = tmp_path / "before.json.gz"
    count_patches(shards, naflex=SPEC, max_patches_per_batch=BUDGET, threads=1, output=previous)
    shutil.copy(photo_shards[3], shards[0])  # another shard's photos under this name
    after = count_patches(shards, naflex=SPEC, max_patches_per_batch=BUDGET, threads=1, previous=previous)
    fresh = count_patches(shards, naflex=SPEC, max_patches_per_batch=BUDGET, threads=1)
    assert as_json(after) == as_json(fresh)
    assert after.units[0]["version"] != PatchCounts.load(previous).units[0]["version"]


def test_previous_counts_under_other_settings_are_not_reused(corpus, tmp_path):
    other = count_tokens(corpus[:2], tokenizer=GPT2_STYLE, threads=1, max_document_bytes=1 << 20)
    with pytest.warns(
        UserWarning, match="other settings \\(max_document_bytes\\): counting every file"
    ) as seen:
        after = count_tokens(corpus[:2], tokenizer=GPT2_STYLE, threads=1, previous=other)
    assert seen[0].filename == __file__, "attributed to the caller's line"
    assert as_json(after) == as_json(count_tokens(corpus[:2], tokenizer=GPT2_STYLE, threads=1))
    with pytest.raises(ValueError, match="not a token counts file"):
        count_tokens(corpus[:2], tokenizer=GPT2_STYLE, threads=1, previous=corpus[0])


@pytest.mark.slow
def test_a_failure_on_rank_zero_ends_every_rank(corpus, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not counts")
    index = ["index", *corpus[:2], "--tokenizer", GPT2_STYLE, "--threads", "1", "-o", str(bad)]
    run = torchrun(index, module="shardstream", timeout=TIMEOUT)  # a rank left waiting fails it
    assert run.returncode != 0
    assert "not a token counts file" in run.stderr, run.stderr[-4000:]
    assert "rank 0: cannot read the previous counts" in run.stderr, "rank 1 says why it stopped"
    assert bad.read_text() == "not counts"
