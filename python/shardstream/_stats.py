"""A pass's counters across readers: merged over DataLoader workers (each sends what changed in its
stats with every batch), and the error for a pass in which every sample was skipped."""

from __future__ import annotations

from typing import Any

from shardstream.errors import SampleError


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums the counters of several readers: numbers add, dicts add per key, lists concatenate."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                target = merged.setdefault(key, {})
                for k, v in value.items():
                    target[k] = target.get(k, 0) + v
            elif isinstance(value, list):
                merged.setdefault(key, []).extend(value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                merged[key] = merged.get(key, 0) + value
            else:
                merged[key] = value
    return merged


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def stats_delta(current: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """What changed in a reader's stats since the ones recorded in ``sent``, which is updated to
    ``current``: counters as increments, lists (faults, remainder keys: they only grow) as their
    new items, anything else (seconds) as its new value; what did not change is left out. A
    DataLoader worker sends this with each batch instead of its whole stats, whose fault list
    alone may hold a thousand entries."""
    delta: dict[str, Any] = {}
    for key, value in current.items():
        new = key not in sent  # sent whole the first time, so that every key reaches the totals
        if isinstance(value, dict):
            change: Any = stats_delta(value, sent.setdefault(key, {}))
            if change or new:
                delta[key] = change
        elif isinstance(value, list):
            if len(value) > sent.get(key, 0) or new:
                delta[key] = value[sent.get(key, 0) :]
            sent[key] = len(value)
        elif _is_count(value):
            if value != sent.get(key, 0) or new:
                delta[key] = value - sent.get(key, 0)
            sent[key] = value
        else:
            if new or sent[key] != value:
                delta[key] = value
            sent[key] = value
    return delta


def add_stats_delta(total: dict[str, Any], delta: dict[str, Any]) -> None:
    """Applies a :func:`stats_delta` to the totals it was taken against (the inverse)."""
    for key, change in delta.items():
        if isinstance(change, dict):
            add_stats_delta(total.setdefault(key, {}), change)
        elif isinstance(change, list):
            total.setdefault(key, []).extend(change)
        elif _is_count(change):
            total[key] = total.get(key, 0) + change
        else:
            total[key] = change


def raise_if_all_skipped(stats: dict[str, Any]) -> None:
    """Raises for a pass that yielded no batch and read no good sample but skipped samples or
    lost shards: every sample it read was skipped, which a training loop would otherwise meet as
    an epoch that never steps.

    Args:
        stats: The pass's stats (merged over its DataLoader workers).

    Raises:
        SampleError: ``reason`` is the most frequent reason samples were skipped for (without
            skipped samples: shards failed for); the message gives its count, the others and one
            fault's detail.
    """
    if stats.get("samples", 0):  # a good sample read (dropped with a short remainder): not this
        return
    skipped = {reason: n for reason, n in (stats.get("skipped") or {}).items() if n}
    failed = {reason: n for reason, n in (stats.get("shard_errors") or {}).items() if n}
    counts, unit = (skipped, "samples") if skipped else (failed, "shards")
    if not counts:
        return
    reason, count = max(counts.items(), key=lambda item: (item[1], item[0]))
    example = next((f for f in stats.get("faults") or [] if f.get("reason") == reason), None)
    seen = ""
    if example is not None:
        where = f"key {example['key']!r} of {example['url']}" if example.get("key") else example["url"]
        seen = f"; e.g. {where}: {example['detail']}"
    others = [f"{r}: {n:,} {unit}" for r, n in sorted(counts.items()) if r != reason]
    if skipped and failed:
        others += [f"{r}: {n:,} shards" for r, n in sorted(failed.items())]
    raise SampleError(
        reason,
        detail=f"the pass yielded no batch, every sample it read was skipped: {count:,} of "
        f"{sum(counts.values()):,} {unit} for {reason}"
        + (f" (also {', '.join(others)})" if others else "")
        + seen,
    )


def is_skip_reason(reason: str, stats: dict[str, Any]) -> bool:
    """Whether the pass skipped samples (or lost shards) for ``reason``: the core names a pass
    that cannot go on because everything failed by its top skip reason."""
    return reason in (stats.get("skipped") or {}) or reason in (stats.get("shard_errors") or {})
