"""Digests of interleaved batches for the exactness tests of the interleaved kind (documents and
conversations), and the check that a batch read in a distributed epoch is the batch read whole
by one rank, except that the runs of a document the epoch cuts (a batch of it read by no rank:
the plan's remainder) hold no label."""

from __future__ import annotations

import hashlib


def batch_digest(b) -> str:
    """Every field of the batch, labels included."""
    h = hashlib.sha256()
    for t in (b.input_ids, b.labels, b.position_ids, b.pixel_values, b.image_grid_thw, b.cu_seqlens):
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def content_digest(b) -> str:
    """What the batch holds, its labels apart (a cut document's runs differ only there)."""
    h = hashlib.sha256()
    for t in (b.input_ids, b.position_ids, b.pixel_values, b.image_grid_thw, b.cu_seqlens):
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def labels_by_content(batches) -> dict:
    """Each batch's labels, by its content digest."""
    return {content_digest(b): b.labels.clone() for b in batches}


def check_learned_or_cut(b, whole: dict) -> None:
    """``b`` is a batch of ``whole`` (labels by content digest, of the epoch read by one rank),
    and each of its runs (``cu_seqlens`` segments) has that batch's labels or none at all."""
    digest = content_digest(b)
    assert digest in whole, "a batch made up"
    labels, want = b.labels.reshape(-1), whole[digest].reshape(-1)
    cu = b.cu_seqlens.tolist()
    for a, e in zip(cu, cu[1:], strict=False):
        if not bool((labels[a:e] == want[a:e]).all()):
            assert bool((labels[a:e] == -100).all()), "a run learned in part"
