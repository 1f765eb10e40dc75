"""Tokenizer resolution for ``ShardLoader(tokenizer=...)``: the Rust pipeline tokenizes.

``tokenizer`` is an open_clip model name (``"ViT-B-32"``: open_clip's CLIP BPE vocabulary file,
shipped inside the open_clip package, and the model's context length) or the path of a Hugging
Face ``tokenizer.json``, which the ``tokenizers`` library (the Rust crate behind the Python
package) runs with the file's own normalizer, pre-tokenizer, model (BPE, WordPiece, Unigram) and
post-processor: the tokens are the package's ``encode(text)`` with ``enable_truncation(77)``,
padded to 77 with the tokenizer's own pad id, as transformers pads: the ``pad_token`` its folder's
``tokenizer_config.json`` (else ``special_tokens_map.json``) names, else the file's ``padding``
``pad_id``, else 0. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import os
from typing import Any

DEFAULT_CONTEXT_LENGTH = 77


def resolve_tokenizer(tokenizer: str, context_length: int | None = None) -> tuple[str, str, int]:
    """(kind, path, context_length) for the Rust tokenizer: kind "bpe" or "json".
    ``context_length``: tokens per caption; None: the open_clip model's, or 77 for a file."""
    if tokenizer.endswith(".json") or os.path.isfile(tokenizer):
        if not os.path.isfile(tokenizer):
            raise FileNotFoundError(f"tokenizer file {tokenizer!r} does not exist")
        resolved = ("json", tokenizer, context_length or DEFAULT_CONTEXT_LENGTH)
        # Loaded once here so that a file that is not a tokenizer.json fails when the loader is
        # made, naming the file, rather than at its first batch.
        rust_tokenizer_of(resolved)
        return resolved
    if tokenizer.startswith("hf-hub:"):
        # open_clip would download it (and the Rust tokenizer reproduces only its CLIP BPE).
        raise ValueError(
            f"tokenizer={tokenizer!r}: an open_clip hf-hub model is not looked up (nothing is "
            "downloaded); pass the path of its tokenizer.json"
        )
    if os.sep in tokenizer or tokenizer.startswith("."):
        # Not a file and not a model name: open_clip would hand back its default tokenizer.
        raise FileNotFoundError(
            f"tokenizer file {tokenizer!r} does not exist (nor is it an open_clip model name)"
        )
    kind, path, own_length = _resolve_open_clip(tokenizer)
    return kind, path, context_length or own_length


@functools.cache
def _resolve_open_clip(tokenizer: str) -> tuple[str, str, int]:
    """An open_clip model name's (kind, path, context_length), once per process: finding it
    builds open_clip's Python tokenizer (a few hundred ms, and 100k objects for the garbage
    collector), which a loader made per epoch or per evaluation must not pay again."""
    from shardstream._deps import require

    needed_for = f"tokenizer={tokenizer!r} (an open_clip model name; or pass a tokenizer.json path)"
    open_clip = require("open_clip", needed_for)
    from open_clip.tokenizer import SimpleTokenizer, default_bpe

    tok = open_clip.get_tokenizer(tokenizer)
    if type(tok) is not SimpleTokenizer or getattr(tok, "reduction_fn", None) is not None:
        raise ValueError(
            f"open_clip model {tokenizer!r} uses {type(tok).__name__}, not the CLIP BPE tokenizer "
            "the Rust pipeline reproduces; pass a tokenizer.json path or tokenize in Python"
        )
    if tok.clean_fn.__name__ != "_clean_lower":
        raise ValueError(f"open_clip model {tokenizer!r} cleans with {tok.clean_fn.__name__}, not 'lower'")
    return "bpe", default_bpe(), int(tok.context_length)


def rust_tokenizer(tokenizer: str) -> Any:
    """The Rust tokenizer on its own (``_core.ClipTokenizer``), as the loader would build it."""
    return rust_tokenizer_of(resolve_tokenizer(tokenizer))


def core_tokenizer(resolved: tuple[str, str, int] | None) -> dict[str, Any] | None:
    """A resolved (kind, path, context_length) as the core's ``tokenizer`` setting (kind
    "caption tokenizer": ``kind``, ``path``, ``context_length``, each required), or None."""
    if resolved is None:
        return None
    kind, path, context_length = resolved
    return {"kind": kind, "path": path, "context_length": context_length}


def rust_tokenizer_of(resolved: tuple[str, str, int]) -> Any:
    """``_core.ClipTokenizer`` of a resolved (kind, path, context_length); a file it cannot
    load raises ValueError naming the file."""
    from shardstream import _core

    return _core.ClipTokenizer(*resolved)
