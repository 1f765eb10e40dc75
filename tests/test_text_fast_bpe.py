"""The packed text kind's fast byte-level BPE path: TextLoader's rows are the ``tokenizers``
package's ids for a GPT-2-style and a Llama-3-style tokenizer.json (which take the fast path), and
for a BERT-style WordPiece one (which does not, and is encoded by the library)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import shardstream
from shardstream import TextLoader, count_tokens
from text_corpus import (
    BERT_STYLE,
    FIXTURES,
    GPT2_STYLE,
    documents,
    llama3_style_tokenizer,
    parquet_units,
    write_parquet_corpus,
)

tokenizers = pytest.importorskip("tokenizers")

LLAMA3_STYLE = os.path.join(FIXTURES, "llama3-style-bpe.json")

#: Documents with what the fast path must get right or hand to the library: added tokens inside
#: text, CRLF, tabs, runs of spaces and newlines, digit runs, contractions in mixed case, NFC.
EDGE_DOCS = [
    "a </s> b <s>c <|end_of_text|>d<|begin_of_text|> e",
    "I'm YOU'RE he'Ll we'd IT'S 'ſ\r\n\r\n\tx  \t  y\n\n\n   z 1234567 ½ ١٢٣",
    "e\u0301 A\u030a \u212b 🎉👍🏻 👨\u200d👩\u200d👧 𝔘𝔫𝔦 漢字 \u00a0\u3000 \u2028",
]


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return documents(12) + EDGE_DOCS


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory, docs) -> dict[str, tuple[str, str]]:
    """(path, EOS) by style; the Llama-3-style one both committed and trained here."""
    trained = llama3_style_tokenizer(str(tmp_path_factory.mktemp("tok") / "llama3.json"), docs[::3])
    return {
        "gpt2": (GPT2_STYLE, "</s>"),
        "llama3": (LLAMA3_STYLE, "<|end_of_text|>"),
        "llama3-trained": (trained, "<|end_of_text|>"),
        "bert": (BERT_STYLE, "[SEP]"),
    }


def library_ids(path: str, texts: list[str], eos: str) -> list[list[int]]:
    tok = tokenizers.Tokenizer.from_file(path)
    eos_id = tok.token_to_id(eos)
    return [e.ids + [eos_id] for e in tok.encode_batch(texts, add_special_tokens=False)]


@pytest.mark.parametrize("style", ["gpt2", "llama3", "llama3-trained", "bert"])
def test_loader_rows_are_the_librarys_ids_on_the_fast_path_and_off_it(style, tokenizer_files, docs, tmp_path):
    path, eos = tokenizer_files[style]
    fast, why = shardstream._core.packed_fast_path(path, eos)
    assert fast == (style != "bert"), why
    if style == "bert":
        assert "not BPE" in why
    assert shardstream._core.packed_encode(path, docs, eos) == library_ids(path, docs, eos)

    files = write_parquet_corpus(str(tmp_path / "corpus"), docs, files=2, rows_per_group=5)
    counts = count_tokens(files, tokenizer=path, eos_token=eos, threads=1)
    units = parquet_units(files)
    streams = [[i for ids in library_ids(path, unit, eos) for i in ids] for unit in units]
    assert [u["tokens"] for u in counts.units] == [len(s) for s in streams]

    seq_len = 64
    loader = TextLoader(counts, batch_size=2, seq_len=seq_len, block_rows=1, rank=0, world_size=1, threads=1)
    assert loader.fast_path == (style != "bert")
    flat = np.concatenate([row for batch in loader for row in batch.input_ids.numpy()]).tolist()
    assert loader.stats["encoder"] == ("tokenizers" if style == "bert" else "fast_bpe")
    assert len(flat) + loader.stats["remainder_tokens"] == counts.total_tokens
    # The rows tile the units' streams (shuffled), each whole and in its own order.
    left, at = list(range(len(streams))), 0
    while at < len(flat):
        match = [
            u for u in left if streams[u] and flat[at : at + len(streams[u])] == streams[u][: len(flat) - at]
        ]
        assert len(match) >= 1, f"no unit's tokens at {at}"
        left.remove(match[0])
        at += len(streams[match[0]])
