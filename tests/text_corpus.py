"""Real text corpora for the packed text kind's tests: Python standard library sources (code, with
its indentation, some non-ASCII and astral characters) and the real captions of
``../shared/data`` (64 of them non-ASCII), written as Parquet files (FineWeb layout: a ``text``
column, row groups as units), as JSONL files (plain, gzip, zstd; one unit each) and as tars of
``.py`` members (StarCoder layout); and tokenizer.json files: the committed GPT-2-style and
BERT-style fixtures plus a Llama-3-style one trained here."""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import sysconfig
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
from servers import CAPTIONS_PARQUET

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tokenizers")
GPT2_STYLE = os.path.join(FIXTURES, "captions-bpe.json")  # byte-level BPE, </s>
BERT_STYLE = os.path.join(FIXTURES, "captions-wordpiece.json")  # WordPiece, [SEP]
# Llama 3's pre-tokenizer pattern (its tokenizer.json's Split regex).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def stdlib_sources(count: int) -> list[tuple[str, str]]:
    """(module name, source) of ``count`` standard library modules, always including one with
    astral-plane characters (lib2to3's parser tests)."""
    root = sysconfig.get_paths()["stdlib"]
    paths = sorted(glob.glob(os.path.join(root, "*.py")))[:count]
    paths.append(os.path.join(root, "lib2to3", "tests", "test_parser.py"))
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            out.append((os.path.relpath(p, root).replace(os.sep, "_").removesuffix(".py"), f.read()))
    return out


def captions() -> list[str]:
    table = pq.read_table(CAPTIONS_PARQUET, columns=["TEXT"])
    return [c for c in table.column("TEXT").to_pylist() if c]


def documents(sources: int = 60) -> list[str]:
    """Code and captions, interleaved so that every file holds both."""
    code = [s for _, s in stdlib_sources(sources)]
    caps = captions()
    out: list[str] = []
    step = max(1, len(caps) // max(1, len(code)))
    for i, c in enumerate(code):
        out.append(c)
        out.extend(caps[i * step : (i + 1) * step])
    out.extend(caps[len(code) * step :])
    return out


def write_parquet_corpus(
    directory: str, docs: list[str], *, files: int = 3, rows_per_group: int = 40
) -> list[str]:
    """FineWeb-style files (``id``, ``text``), document i in file i mod ``files``; their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for f in range(files):
        part = docs[f::files]
        path = os.path.join(directory, f"part-{f:03d}.parquet")
        pq.write_table(
            pa.table({"id": list(range(len(part))), "text": part}), path, row_group_size=rows_per_group
        )
        paths.append(path)
    return paths


def parquet_units(paths: list[str], column: str = "text") -> list[list[str]]:
    """Each row group's documents, files in order: what the loader's units hold."""
    units = []
    for p in paths:
        f = pq.ParquetFile(p)
        for g in range(f.num_row_groups):
            units.append(f.read_row_group(g, columns=[column]).column(column).to_pylist())
    return units


def write_code_tars(directory: str, sources: list[tuple[str, bytes]], *, shards: int = 2) -> list[str]:
    """StarCoder-style tars: one ``NAME.py`` member per file, file i in shard i mod ``shards``."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"code-{s:03d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in sources[s::shards]:
                info = tarfile.TarInfo(f"{name}.py")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def llama3_style_tokenizer(path: str, docs: list[str], vocab: int = 2000) -> str:
    """A byte-level BPE with Llama 3's pre-tokenizer split and special tokens, trained on
    ``docs`` with the ``tokenizers`` package, saved as ``path``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer)
    tok.save(path)
    return path


def jsonl_lines(docs: list[str], *, start: int = 0) -> list[bytes]:
    """FineWeb-style JSONL lines: ``text`` among metadata fields (a nested object, a number, a
    list), so the reader has to find the field rather than take the first one."""
    return [
        json.dumps(
            {
                "id": f"<urn:uuid:{start + i}>",
                "meta": {"dump": "CC-MAIN-2024-10", "text": None},
                "text": doc,
                "language_score": 0.93,
                "token_ids": [1, 2, 3],
            }
        ).encode()
        + b"\n"
        for i, doc in enumerate(docs)
    ]


def write_jsonl(path: str, lines: list[bytes]) -> str:
    """``lines`` as one file, compressed as its name says (``.gz``: gzip, ``.zst``: zstd)."""
    data = b"".join(lines)
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    elif path.endswith(".zst"):
        with pa.output_stream(path, compression="zstd") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return path


def write_jsonl_corpus(
    directory: str, docs: list[str], *, files: int = 3, suffix: str = ".jsonl"
) -> list[str]:
    """The documents of :func:`write_parquet_corpus` (document i in file i mod ``files``) as
    JSONL files ``part-NNN{suffix}``; their paths."""
    os.makedirs(directory, exist_ok=True)
    return [
        write_jsonl(os.path.join(directory, f"part-{f:03d}{suffix}"), jsonl_lines(docs[f::files]))
        for f in range(files)
    ]
