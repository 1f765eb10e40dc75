"""``_core.pyi`` against the compiled ``_core`` (issue 53): the config keys each pipeline
function's stub documents are the keys the binding's settings struct of its kind takes
(``_core.settings_keys``, generated from the structs), so a key added to or removed from a struct
without the stub fails here. The names and parameters of every function and class are checked by
``tests/test_wheel.py::test_stubs_match_extension``.

A stub documents a function's config in one paragraph: ``Config keys (kind "KIND"): ``key``,
...; and the source options and the sample options.``, the groups named only when the kind
takes them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import shardstream
from shardstream import _core

STUB = Path(shardstream.__file__).parent / "_core.pyi"

# Each function that takes a config dict, and the kind of settings it reads it as.
CONFIG_KINDS = {
    # The reader options only, read from a dict that may hold other settings (not refused).
    "scan_shard": "source",
    "sample_pipeline": "loader",
    "count_tokens": "token count",
    "packed_pipeline": "packed text",
    "count_patches": "token-budget NaFlex",
    "budget_pipeline": "token-budget NaFlex",
    "interleaved_tokens": "interleaved",
    "count_interleaved": "interleaved",
    "interleaved_pipeline": "interleaved",
    "count_clips": "video clips",
    "video_pipeline": "video clips",
}

PARAGRAPH = re.compile(r'Config keys \(kind "([^"]+)"\):(.*?)\.(?:\s|$)', re.DOTALL)
GROUPS = {"the source options": "source", "the sample options": "sample"}


def documented(doc: str) -> tuple[str, set[str]] | None:
    """The kind and the keys a docstring's config paragraph names, its groups expanded."""
    m = PARAGRAPH.search(doc)
    if m is None:
        return None
    kind, text = m.group(1), m.group(2)
    keys = set(re.findall(r"``(\w+)``", text))
    for phrase, group in GROUPS.items():
        if phrase in text:
            keys |= set(_core.settings_keys(group))
    return kind, keys


def stub_functions(source: str) -> dict[str, ast.FunctionDef]:
    """The stub's module-level functions by name."""
    tree = ast.parse(source)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def drift(source: str) -> list[str]:
    """What a stub's source says that the binding does not: one line a disagreement."""
    problems = []
    functions = stub_functions(source)
    for name, fn in functions.items():
        takes_config = any(a.arg == "config" for a in fn.args.args + fn.args.kwonlyargs)
        if takes_config and name not in CONFIG_KINDS and hasattr(_core, name):
            problems.append(f"{name} takes a config but this test does not know its kind")
    for name, kind in CONFIG_KINDS.items():
        if name not in functions:
            problems.append(f"{name}: no stub")
            continue
        found = documented(ast.get_docstring(functions[name]) or "")
        if found is None:
            problems.append(f"{name}: its stub documents no config keys")
            continue
        doc_kind, keys = found
        if doc_kind != kind:
            problems.append(f"{name}: documented as kind {doc_kind!r}, reads {kind!r}")
        accepted = set(_core.settings_keys(kind))
        if keys != accepted:
            problems.append(
                f"{name}: stub documents {sorted(keys - accepted)} the binding does not take, "
                f"lacks {sorted(accepted - keys)} it takes"
            )
    return problems


def test_the_stub_documents_the_keys_each_pipeline_function_takes():
    assert drift(STUB.read_text()) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # A key the binding does not take (what `vision_kind` was).
        ("``batch_size``, ``eos_token``", "``batch_size``, ``vision_kind``, ``eos_token``"),
        # A key the binding takes, left out.
        ("``bos_token``, ", ""),
        # A group named that the kind does not take.
        (
            '(kind "token count"): the source options',
            '(kind "token count"): the source options and the sample options',
        ),
    ],
)
def test_a_drifted_stub_fails(old, new):
    source = STUB.read_text()
    assert old in source
    assert drift(source.replace(old, new, 1)) != []


def test_every_settings_kind_is_a_struct_of_the_binding():
    """Each kind named above (and the nested specs') answers with its keys."""
    kinds = {
        *CONFIG_KINDS.values(),
        "source",
        "sample",
        "QwenVL vision spec",
        "NaFlexVL vision spec",
        "NaFlex spec",
    }
    kinds |= {"interleaved captions layout", "interleaved conversations layout"}
    for kind in kinds:
        assert _core.settings_keys(kind), kind
    assert "vision_kind" not in _core.settings_keys("interleaved")
    assert "family" in _core.settings_keys("NaFlexVL vision spec")
