"""``ShardLoader(tokenizer="path/tokenizer.json")`` on real Hugging Face tokenizer.json files.

The files in tests/data/tokenizers were written by the ``tokenizers`` package
(tests/data/tokenizers/make.py): a byte-level BPE and a WordPiece trained on the 1,000 real
captions, with that package's encoding of every caption (truncated to 77 by the library, padded
with 0). The loader reads real-photo shards of those captions and must give exactly those tokens (of
the captions as it yields them in ``batch.texts``, stripped of surrounding whitespace).
Where the ``tokenizers`` package is installed, the same is checked against it live, and on CLIP's
own tokenizer.json layout built from open_clip's vocabulary.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from corpus import good_samples, good_shard, sample_members, tar_bytes, write_file  # noqa: E402
from servers import CAPTIONS_PARQUET  # noqa: E402
from shardstream import ShardLoader  # noqa: E402
from shardstream.tokenizer import resolve_tokenizer  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tokenizers")
NAMES = ("captions-bpe.json", "captions-wordpiece.json")


def _captions() -> list[str]:
    import pyarrow.parquet as pq

    return [t or "" for t in pq.read_table(CAPTIONS_PARQUET, columns=["TEXT"]).column("TEXT").to_pylist()]


def _make():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tokenizers", os.path.join(FIXTURES, "make.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def caption_shard(tmp_path_factory) -> tuple[str, list[str]]:
    """One shard of real-photo JPEGs, each with one of the 1,000 real captions (all of them)."""
    captions = _captions()
    members = []
    for (key, sample), caption in zip(good_samples(len(captions)), captions, strict=True):
        members += sample_members(key, dict(sample, txt=caption))
    path = str(tmp_path_factory.mktemp("tokjson") / "caps-0000.tar")
    return write_file(path, tar_bytes(members)), captions


def _loader_rows(shard: str, tokenizer: str) -> dict[str, np.ndarray]:
    """caption -> its token row, from every batch of one pass (shuffled, 2 decode threads)."""
    rows: dict[str, np.ndarray] = {}
    loader = ShardLoader(shard, batch_size=64, image_size=32, threads=2, drop_last=False, tokenizer=tokenizer)
    n = 0
    for batch in loader:
        assert batch.tokens.dtype == torch.int64 and tuple(batch.tokens.shape) == (len(batch.texts), 77)
        for text, row in zip(batch.texts, batch.tokens.numpy(), strict=True):
            rows.setdefault(text, row.copy())
            assert np.array_equal(rows[text], row)  # the same caption, the same tokens
        n += len(batch.texts)
    assert n == 1000
    return rows


def _assert_rows_equal(rows: dict[str, np.ndarray], captions: list[str], want: np.ndarray) -> None:
    """``want[i]``: the tokens of ``captions[i]`` as the loader yields it (stripped)."""
    diffs = [(i, c) for i, c in enumerate(captions) if not np.array_equal(rows[c.strip()], want[i])]
    for i, c in diffs[:10]:
        print(f"DIFF #{i}: {c[:100]!r}\n  loader {rows[c.strip()][:20]}\n  wanted {want[i][:20]}")
    assert diffs == []


@pytest.mark.parametrize("name", NAMES)
def test_loader_tokens_equal_the_tokenizers_packages_recorded_encoding(caption_shard, name):
    shard, captions = caption_shard
    reference = np.load(os.path.join(FIXTURES, "reference.npz"), allow_pickle=False)
    assert str(reference["captions_sha256"]) == _make().captions_sha256(captions), "captions changed"
    want = reference[name.removesuffix(".json")].astype(np.int64)
    # The fixture exercises truncation (long captions fill all 77) and padding.
    assert (want[:, -1] != 0).any() and (want[:, -1] == 0).any()
    _assert_rows_equal(_loader_rows(shard, os.path.join(FIXTURES, name)), captions, want)


def test_loader_tokens_equal_the_tokenizers_package_live(caption_shard, tmp_path):
    """Against ``tokenizers`` itself: the committed files, and CLIP's tokenizer.json layout
    (CLIPTokenizerFast's: NFC, no ftfy or HTML unescaping, unlike open_clip) from open_clip's
    vocabulary, which the loader's former CLIP-only reader tokenized with open_clip's cleaning
    (4 of the 1,000 captions differed: `&quot;` and the like)."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("open_clip")
    make = _make()
    shard, captions = caption_shard
    clip = make.clip_tokenizer_json(str(tmp_path / "clip-tokenizer.json"))
    for path in [os.path.join(FIXTURES, n) for n in NAMES] + [clip]:
        want = make.reference_ids(path, [c.strip() for c in captions])
        _assert_rows_equal(_loader_rows(shard, path), captions, want)


def _pad_one_tokenizer(captions: list[str]):
    """A WordLevel tokenizer trained on the real captions, SigLIP-like: ``</s>`` after the text
    and a pad id that is not 0 (``<unk>`` 0, ``<pad>`` 1, ``</s>`` 2)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=2000, special_tokens=["<unk>", "<pad>", "</s>"])
    tok.train_from_iterator(captions, trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return tok


def test_rows_are_padded_with_the_tokenizers_own_pad_id(caption_shard, tmp_path):
    """A tokenizer.json whose padding section says pad_id 1 pads with 1, as the ``tokenizers``
    package and transformers pad it (formerly with 0); a Hugging Face folder whose
    tokenizer_config.json names its pad token (SigLIP's is ``</s>``) pads with that token's id, as
    open_clip's HFTokenizer (transformers, ``padding="max_length"``) does."""
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from shardstream import _core

    shard, captions = caption_shard
    texts = [c.strip() for c in captions]
    tok = _pad_one_tokenizer(texts)
    tok.enable_padding(pad_id=1, pad_token="<pad>")
    padded = tmp_path / "padded" / "tokenizer.json"
    padded.parent.mkdir()
    tok.save(str(padded))
    tok.enable_truncation(max_length=77)
    tok.enable_padding(pad_id=1, pad_token="<pad>", length=77)
    want = np.array([e.ids for e in tok.encode_batch(texts)], dtype=np.int64)
    assert (want[:, -1] == 1).any(), "the captions are padded"
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(padded))
    assert hf.pad_token_id == 1
    theirs = hf(texts, padding="max_length", max_length=77, truncation=True)["input_ids"]
    assert np.array_equal(np.array(theirs), want)
    assert _core.ClipTokenizer("json", str(padded), 77).pad_id == 1
    _assert_rows_equal(_loader_rows(shard, str(padded)), captions, want)

    folder = tmp_path / "siglip-like"
    folder.mkdir()
    tok.no_padding()
    tok.save(str(folder / "tokenizer.json"))
    config = {"pad_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf.pad_token_id == 2
    want = np.array(hf(texts, padding="max_length", max_length=77, truncation=True)["input_ids"])
    rust = _core.ClipTokenizer("json", str(folder / "tokenizer.json"), 77)
    assert rust.pad_id == 2
    rows = torch.zeros((len(texts), 77), dtype=torch.int64)
    rust.tokenize_into(texts, rows.data_ptr(), rows.numel())
    assert np.array_equal(rows.numpy(), want)

    config["pad_token"] = "<nothing>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match='tokenizer_config.json: pad_token "<nothing>" is not in'):
        ShardLoader(shard, batch_size=4, tokenizer=str(folder / "tokenizer.json"))


def test_a_missing_tokenizer_file_is_named(tmp_path):
    shard = good_shard(str(tmp_path / "s-0000.tar"), 4)
    for missing in (str(tmp_path / "nope" / "tokenizer.json"), str(tmp_path / "tokenizer")):
        with pytest.raises(FileNotFoundError, match="nope/tokenizer.json|tokenizer'"):
            ShardLoader(shard, batch_size=4, tokenizer=missing)
    # Formerly a path without ".json" that did not exist went to open_clip as a model name,
    # which hands back its default tokenizer: the loader silently tokenized with CLIP's.
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer")):
        resolve_tokenizer(str(tmp_path / "tokenizer"))


def test_a_malformed_tokenizer_file_is_named_when_the_loader_is_made(tmp_path):
    shard = good_shard(str(tmp_path / "s-0000.tar"), 4)
    real = open(os.path.join(FIXTURES, NAMES[0]), encoding="utf-8").read()
    cases = {
        "truncated.json": real[: len(real) // 2],  # a real file cut short
        "empty.json": "",
        "not-a-tokenizer.json": '{"model": {"type": "BPE"}, "version": "1.0"}',
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=f"bad tokenizer file {path}: "):
            ShardLoader(shard, batch_size=4, tokenizer=str(path))


def test_an_open_clip_hf_hub_name_is_not_downloaded():
    with pytest.raises(ValueError, match="nothing is downloaded"):
        resolve_tokenizer("hf-hub:timm/ViT-B-16-SigLIP")
