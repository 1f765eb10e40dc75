"""Settings cross into the core by name, and a name it does not read is refused (issue 53): a
misspelt or misplaced setting used to be ignored, its default taken in silence. For each kind,
the config its loader sends, with one key misspelt, fails with ``_core.UnknownSetting`` naming
the key; an interleaved layout's keys are checked the same way, and a layout of an unknown kind
is refused by name. The loaders' own configs pass (every other test reads through them)."""

from __future__ import annotations

import pytest
from corpus import good_shard
from interleaved_corpus import captions, real_documents, write_obelics_parquet
from qwen_reference import EOS, write_tokenizer_json
from shardstream import (
    InterleavedLoader,
    NaFlex,
    NaFlexBudgetLoader,
    QwenVL,
    ShardLoader,
    TextLoader,
    _core,
    count_interleaved,
    count_patches,
    count_tokens,
)
from text_corpus import write_parquet_corpus


def misspelt(loader, key: str, typo: str) -> None:
    """``loader``'s core config with ``key`` renamed ``typo``."""
    loader._config[typo] = loader._config.pop(key)


def first_batch(loader):
    return next(iter(loader))


def test_the_image_text_loader_refuses_a_misspelt_setting(tmp_path):
    loader = ShardLoader(good_shard(str(tmp_path / "a.tar"), 4), batch_size=2)
    first_batch(loader)  # its own config passes
    misspelt(loader, "max_member_bytes", "max_membr_bytes")
    with pytest.raises(_core.UnknownSetting, match="max_membr_bytes"):
        first_batch(loader)


def test_the_token_budget_naflex_loader_refuses_a_misspelt_setting(tmp_path):
    shards = [good_shard(str(tmp_path / f"{i}.tar"), 6, seed=i) for i in range(2)]
    counts = count_patches(
        shards, naflex=NaFlex(patch_size=16, max_num_patches=64), max_patches_per_batch=256
    )
    loader = NaFlexBudgetLoader(counts)
    first_batch(loader)
    misspelt(loader, "max_images_per_batch", "max_image_per_batch")
    with pytest.raises(_core.UnknownSetting, match="max_image_per_batch"):
        first_batch(loader)


def test_the_text_loader_refuses_a_misspelt_setting(tmp_path):
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    texts = [" ".join(captions()[i : i + 10]) for i in range(0, 400, 5)]
    counts = count_tokens(write_parquet_corpus(str(tmp_path / "text"), texts, files=1), tokenizer=tokenizer)
    loader = TextLoader(counts, batch_size=2, seq_len=64)
    first_batch(loader)
    misspelt(loader, "boundaries", "boundary")
    with pytest.raises(_core.UnknownSetting, match="boundary"):
        first_batch(loader)


def test_the_interleaved_loader_and_its_layouts_refuse_a_misspelt_setting(tmp_path):
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    files = [write_obelics_parquet(str(tmp_path / "docs.parquet"), real_documents(8, seed=2), 4)]
    spec = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    counts = count_interleaved(
        files, tokenizer=tokenizer, spec=spec, seq_len=512, batch_size=1, eos_token=EOS
    )
    loader = InterleavedLoader(counts)
    first_batch(loader)
    misspelt(loader, "max_images_per_document", "max_images_per_doc")
    with pytest.raises(_core.UnknownSetting, match="max_images_per_doc"):
        first_batch(loader)
    # A layout's keys: one misspelt, and a layout of a kind the core does not have.
    loader = InterleavedLoader(counts)
    loader._config["layout"] = {"kind": "captions", "image_keys": ["jpg"], "caption": "txt"}
    with pytest.raises(_core.UnknownSetting, match="'caption'"):
        first_batch(loader)
    loader._config["layout"] = {"kind": "conversation"}
    with pytest.raises(
        ValueError, match="layout kind must be 'conversations' or 'captions', not \"conversation\""
    ):
        first_batch(loader)


def test_a_missing_required_setting_is_refused_by_name(tmp_path):
    """A required key that is absent is ``_core.MissingSetting(key, kind, message)``, never a
    default taken in silence; the interleaved vision spec is one dict tagged by ``family``."""
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    files = [write_obelics_parquet(str(tmp_path / "docs.parquet"), real_documents(8, seed=2), 4)]
    spec = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    counts = count_interleaved(
        files, tokenizer=tokenizer, spec=spec, seq_len=512, batch_size=1, eos_token=EOS
    )
    loader = InterleavedLoader(counts)
    del loader._config["seq_len"]
    with pytest.raises(_core.MissingSetting) as e:
        first_batch(loader)
    assert e.value.args[:2] == ("seq_len", "interleaved")
    # The vision spec: its keys are checked as a kind's, and its tag is required.
    loader = InterleavedLoader(counts)
    vision = loader._config["vision"]
    assert vision["family"] == "qwen" and "vision_kind" not in loader._config
    loader._config["vision"] = {**vision, "merge": 2}
    with pytest.raises(_core.UnknownSetting) as u:
        first_batch(loader)
    assert u.value.args[:2] == ("merge", "QwenVL vision spec")
    loader._config["vision"] = {k: v for k, v in vision.items() if k != "family"}
    with pytest.raises(_core.MissingSetting) as e:
        first_batch(loader)
    assert e.value.args[:2] == ("family", "interleaved vision spec")
    # A layout's required key.
    loader._config["vision"] = vision
    loader._config["layout"] = {"kind": "captions", "image_keys": ["jpg"]}
    with pytest.raises(_core.MissingSetting) as e:
        first_batch(loader)
    assert e.value.args[:2] == ("caption_key", "interleaved captions layout")


def test_the_keys_a_kind_takes_are_the_binding_s(tmp_path):
    """``_core.settings_keys(kind)`` is the list the binding refuses others against."""
    loader = ShardLoader(good_shard(str(tmp_path / "a.tar"), 4), batch_size=2)
    first_batch(loader)
    assert set(loader._config) <= set(_core.settings_keys("loader"))
    assert set(_core.settings_keys("source")) <= set(_core.settings_keys("packed text"))
    with pytest.raises(ValueError, match="no settings of kind"):
        _core.settings_keys("loaders")


def test_a_setting_of_the_wrong_type_is_refused_by_name(tmp_path):
    """A value the core cannot read as its setting's type, or out of its range, is
    ``_core.WrongSetting(key, kind, message)`` (a ``TypeError``) naming the key and its kind, for
    every kind and a nested spec: before, a bare conversion error named no key."""
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    shards = [good_shard(str(tmp_path / f"{i}.tar"), 6, seed=i) for i in range(2)]
    texts = [" ".join(captions()[i : i + 10]) for i in range(0, 400, 5)]
    files = [write_obelics_parquet(str(tmp_path / "docs.parquet"), real_documents(8, seed=2), 4)]
    naflex = count_patches(
        shards, naflex=NaFlex(patch_size=16, max_num_patches=64), max_patches_per_batch=256
    )
    text = count_tokens(write_parquet_corpus(str(tmp_path / "text"), texts, files=1), tokenizer=tokenizer)
    spec = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    interleaved = count_interleaved(
        files, tokenizer=tokenizer, spec=spec, seq_len=512, batch_size=1, eos_token=EOS
    )
    cases = [
        (lambda: ShardLoader(shards[0], batch_size=2), "max_member_bytes", "loader"),
        (lambda: NaFlexBudgetLoader(naflex), "max_images_per_batch", "token-budget NaFlex"),
        (lambda: TextLoader(text, batch_size=2, seq_len=64), "max_document_bytes", "packed text"),
        (lambda: InterleavedLoader(interleaved), "max_images_per_document", "interleaved"),
    ]
    for make, key, kind in cases:
        for wrong in ("8", -1):
            loader = make()
            assert isinstance(loader._config[key], int)
            loader._config[key] = wrong
            with pytest.raises(_core.WrongSetting) as e:
                first_batch(loader)
            assert e.value.args[:2] == (key, kind), e.value.args
            assert isinstance(e.value, TypeError) and repr(key) in str(e.value)
    # A nested spec's value names its own key and kind.
    loader = InterleavedLoader(interleaved)
    loader._config["vision"] = {**loader._config["vision"], "min_pixels": "3136"}
    with pytest.raises(_core.WrongSetting) as e:
        first_batch(loader)
    assert e.value.args[:2] == ("min_pixels", "QwenVL vision spec")


def test_the_caption_tokenizer_setting_is_a_declared_dict(tmp_path):
    """The captions' tokenizer crosses as a dict of kind "caption tokenizer" (it was a positional
    (kind, path, context_length) tuple, read by position): a loader with one tokenizes its
    captions to its context length, and a misspelt or missing key is refused by name."""
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    shard = good_shard(str(tmp_path / "a.tar"), 4)
    loader = ShardLoader(shard, batch_size=2, tokenizer=tokenizer, context_length=16)
    assert loader._config["tokenizer"] == {"kind": "json", "path": tokenizer, "context_length": 16}
    batch = first_batch(loader)
    assert tuple(batch.tokens.shape) == (2, 16)
    assert set(_core.settings_keys("caption tokenizer")) == {"kind", "path", "context_length"}
    loader._config["tokenizer"] = {"kind": "json", "path": tokenizer, "context_len": 16}
    with pytest.raises(_core.UnknownSetting) as u:
        first_batch(loader)
    assert u.value.args[:2] == ("context_len", "caption tokenizer")
    loader._config["tokenizer"] = {"kind": "json", "path": tokenizer}
    with pytest.raises(_core.MissingSetting) as m:
        first_batch(loader)
    assert m.value.args[:2] == ("context_length", "caption tokenizer")
