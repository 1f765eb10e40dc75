"""A count over a corpus in which a file cannot be read says so: ``count_tokens`` and
``count_patches`` warn (``UnreadableUnitsWarning``) naming each failed unit, URL redacted, with
its reason and a summary line; ``on_error="raise"`` raises the typed error naming the file and
saves nothing; and ``shardstream index --tokenizer`` exits 2 naming it, without the warning said
twice.

The corpora are real Parquet files written by pyarrow (stdlib sources and real captions), one of
them cut short as an interrupted download leaves it; served from disk and over loopback HTTP.
"""

from __future__ import annotations

import os
import warnings

import pytest
import shardstream
from shardstream import ShardError, UnreadableUnitsWarning, count_tokens
from shardstream.errors import OptionError
from text_corpus import GPT2_STYLE, documents, write_parquet_corpus

pytest.importorskip("tokenizers")


def cut_in_half(path: str) -> str:
    """``path`` with only its first half (no footer): what an interrupted copy leaves."""
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """Three files of 2 row groups each, the last one cut short."""
    root = str(tmp_path_factory.mktemp("failing"))
    paths = write_parquet_corpus(root, documents(12)[:240], files=3, rows_per_group=40)
    cut_in_half(paths[-1])
    return paths


def test_a_corpus_with_an_unreadable_file_warns_naming_it_and_its_reason(corpus):
    with pytest.warns(UnreadableUnitsWarning) as caught:
        counts = count_tokens(corpus, tokenizer=GPT2_STYLE, threads=2)
    assert [os.path.basename(f["url"]) for f in counts.failed] == ["part-002.parquet"]
    assert len(counts.units) == 4
    (warning,) = [w for w in caught if issubclass(w.category, UnreadableUnitsWarning)]
    text = str(warning.message)
    summary, *lines = text.splitlines()
    assert summary.startswith("count_tokens: 1 of 5 units could not be read"), summary
    reason = counts.failed[0]["error"]["reason"]
    assert lines == [f"  cannot read {corpus[-1]}: {reason}: {counts.failed[0]['error']['detail']}"]
    assert warning.message.failed == counts.failed
    assert warning.filename == __file__, "attributed to the caller's line"
    assert issubclass(UnreadableUnitsWarning, UserWarning)
    assert "UnreadableUnitsWarning" in shardstream.__all__


def test_on_error_raise_raises_the_typed_error_naming_the_file_and_saves_nothing(corpus, tmp_path):
    out = tmp_path / "counts.json"
    with pytest.raises(ShardError, match=r"part-002\.parquet.*1 of 5 units could not be read") as caught:
        count_tokens(corpus, tokenizer=GPT2_STYLE, on_error="raise", output=out)
    assert caught.value.url == corpus[-1] and caught.value.key == ""
    assert not out.exists()
    with pytest.raises(OptionError, match="on_error"):
        count_tokens(corpus, tokenizer=GPT2_STYLE, on_error="ignore")
    # A readable corpus neither warns nor raises.
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadableUnitsWarning)
        counts = count_tokens(corpus[:2], tokenizer=GPT2_STYLE, on_error="raise")
    assert counts.failed == [] and len(counts.units) == 4


def test_a_presigned_urls_query_never_appears_in_the_warning(corpus):
    from servers import RangeHTTPServer

    with RangeHTTPServer(os.path.dirname(corpus[0])) as server:
        urls = [server.url(os.path.basename(p)) for p in corpus[:1]]
        urls.append(server.url(os.path.basename(corpus[-1])) + "?X-Amz-Signature=sekrit")
        with pytest.warns(UnreadableUnitsWarning) as caught:
            counts = count_tokens(urls, tokenizer=GPT2_STYLE)
    text = "\n".join(str(w.message) for w in caught)
    assert "part-002.parquet?<redacted>" in text and "sekrit" not in text, text
    assert "1 of 3 units could not be read" in text
    assert len(counts.units) == 2


def test_count_patches_warns_and_raises_the_same_way(tmp_path):
    torch = pytest.importorskip("torch")  # noqa: F841 - the NaFlex kind's loader needs it
    from parquet_corpus import write_pairs
    from shardstream.kinds import NaFlex
    from shardstream.kinds.naflex_budget import count_patches

    parquets, _, _ = write_pairs(str(tmp_path), [6, 6], seed=5, layout="img2dataset", rows_per_group=3)
    cut_in_half(parquets[1])
    spec = NaFlex(patch_size=16, max_num_patches=64)
    keys = {"caption_key": "caption", "image_keys": ["jpg"]}
    summary = r"count_patches: 1 of 3 units could not be read"
    with pytest.warns(UnreadableUnitsWarning, match=summary) as caught:
        counts = count_patches(parquets, naflex=spec, max_patches_per_batch=256, **keys)
    assert [os.path.basename(f["url"]) for f in counts.failed] == [os.path.basename(parquets[1])]
    assert f"cannot read {parquets[1]}: " in str(caught[0].message)
    with pytest.raises(ShardError, match=os.path.basename(parquets[1])):
        count_patches(parquets, naflex=spec, max_patches_per_batch=256, on_error="raise", **keys)


def test_the_index_cli_exits_2_naming_the_file_and_says_it_once(corpus, tmp_path):
    from cli_runs import run_cli

    out = tmp_path / "c.json"
    run = run_cli(["index", *corpus, "--tokenizer", GPT2_STYLE, "-o", str(out)])
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"cannot read {corpus[-1]}" in run.stderr and "1 units could not be read" in run.stderr
    assert "UnreadableUnitsWarning" not in run.stderr, "the CLI reports the units itself"
    assert not out.exists()
