"""Scanning many shards, and the report of what the scan found.

The one scan of shardstream: ``shardstream validate``, ``shardstream index`` and the library's
``build_index``/``update_index`` all go through :func:`scan_shards`, a thread pool over
``_core.scan_shard`` (which releases the GIL), with one set of defaults (:class:`ScanOptions`).
The one thing each entry point chooses is ``on_unreadable``, what a shard that cannot be read
at all does: the CLI records it (and reports it, exit status 2), the library raises.

The report depends only on the inputs, never on thread timing: results are kept in input order,
invalid samples are listed by (shard position, ordinal), and the shard an error names is the
first unreadable one in input order.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any, Literal

from shardstream import _core
from shardstream._system import available_cores

from .config import DEFAULTS
from .progress import human_bytes
from .urls import Shard, source_config

REPORT_FORMAT = "shardstream-validate/1"

# The scan's defaults are the core's (rust/src/defaults.rs, here shardstream.config.DEFAULTS),
# its decode size included, which is smaller than the loader's for speed (defaults.rs says why).
SCAN_IMAGE_SIZE: int = DEFAULTS.scan_image_size

OnUnreadable = Literal["raise", "record"]
"""What a scan does with a shard it cannot read at all (it cannot be opened, signed or fetched):
``"record"`` makes it the shard's fatal ``unreadable`` fault in the results, next to the others;
``"raise"`` raises ShardError once every shard was scanned, naming the first such shard and how
many there were."""


@dataclass(frozen=True)
class ScanOptions:
    """What counts as a valid sample; passed through to ``_core.scan_shard``."""

    decode: bool = True
    caption_key: str = DEFAULTS.caption_key
    image_keys: tuple[str, ...] = DEFAULTS.image_keys
    require_caption: bool = True
    max_pixels: int = DEFAULTS.max_pixels
    max_member_bytes: int = DEFAULTS.max_member_bytes
    image_size: int = SCAN_IMAGE_SIZE

    def __post_init__(self) -> None:
        # Library callers pass a list (``build_index(spec, image_keys=[...])``).
        object.__setattr__(self, "image_keys", tuple(self.image_keys))

    def scan_kwargs(self) -> dict[str, Any]:
        kwargs = asdict(self)
        kwargs["image_keys"] = list(self.image_keys)
        return kwargs


@dataclass(frozen=True)
class ShardScan:
    """What scanning one shard takes besides the shard: what a valid sample is, the reader
    options (timeouts, retries, ``ca_bundle``, cache) and what an unreadable shard does."""

    options: ScanOptions
    source_options: Mapping[str, Any]
    on_unreadable: OnUnreadable


def default_threads(shards: Sequence[Shard], *, decode: bool = True) -> int:
    """One thread per core for local shards decoded (CPU-bound); four per core when the shards
    are remote or not decoded, where threads spend most of their time waiting on the network or
    the disk (a footer-only index of many Parquet files from a cold page cache: 1,600 files/s on
    one thread, 2,700 on four, on one core)."""
    cores = available_cores()
    remote = any("://" in s.url and not s.url.startswith("file://") for s in shards)
    return min(32, 4 * cores) if remote or not decode else cores


def scan_one(shard: Shard, scan: ShardScan) -> dict[str, Any]:
    """Scans one shard (``shard.url`` is opened, ``shard.display`` is reported). The scanner
    reports a shard it cannot open as its fatal ``unreadable`` fault; a failure before it opens
    (signing the URL, the reader options) is recorded the same way, or raised as it is when
    ``scan.on_unreadable`` is ``"raise"``."""
    from .errors import ShardError

    try:
        config = source_config([shard], dict(scan.source_options))
        result = _core.scan_shard(shard.url, config=config, **scan.options.scan_kwargs())
    except (ShardError, OSError, ValueError) as e:
        if scan.on_unreadable == "raise":
            raise
        return unreadable_result(shard.display, str(e))
    result["url"] = shard.display
    return result


def unreadable_result(display: str, detail: str) -> dict[str, Any]:
    return {
        "url": display,
        "bytes": 0,
        "samples": 0,
        "offsets": [],
        "keys": [],
        "invalid": [],
        "fatal": {"reason": "unreadable", "kind": "other", "detail": detail},
        "compressed": False,
    }


def is_unreadable(result: dict[str, Any]) -> bool:
    """Whether the shard of ``result`` could not be read at all (as opposed to read up to a
    corrupt or truncated part)."""
    return bool(result["fatal"]) and result["fatal"]["reason"] == "unreadable"


def is_not_a_shard(result: dict[str, Any]) -> bool:
    """Whether the file of ``result`` is neither a tar nor a Parquet file: its very first bytes
    are no tar header, or (a file named ``.parquet``) its footer does not decode."""
    fatal = result["fatal"]
    return (
        bool(fatal)
        and result["samples"] == 0
        and fatal["reason"] in ("corrupt_tar", "truncated_tar", "corrupt_parquet")
    )


def scan_shards(
    shards: Sequence[Shard],
    options: ScanOptions,
    *,
    threads: int | None = None,
    on_unreadable: OnUnreadable = "record",
    source_options: Mapping[str, Any] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    keep_offsets: bool = False,
) -> list[dict[str, Any]]:
    """Scans ``shards`` on ``threads`` threads (default: :func:`default_threads`); returns the
    results in the order of ``shards``. ``on_unreadable``: see :data:`OnUnreadable` (the default
    is the CLI's). Per-sample offsets and keys are dropped unless ``keep_offsets`` (the index
    needs them; validation of a large dataset would otherwise hold every key in memory)."""
    scan = ShardScan(options, source_options or {}, on_unreadable)
    results: list[dict[str, Any] | None] = [None] * len(shards)
    workers = threads or default_threads(shards, decode=options.decode)
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="shardstream-scan") as pool:
        futures = [pool.submit(scan_one, shard, scan) for shard in shards]
        position = {future: i for i, future in enumerate(futures)}
        # Completion order only drives the progress line; the results keep input order.
        for future in as_completed(futures):
            if future.exception() is not None:
                continue  # raised below, in input order
            result = future.result()
            if not keep_offsets:
                result["offsets"], result["keys"] = [], []
            results[position[future]] = result
            if on_result is not None:
                on_result(result)
    for future in futures:
        if (error := future.exception()) is not None:
            raise error
    done = [r for r in results if r is not None]
    if on_unreadable == "raise":
        raise_unreadable(done)
    return done


def raise_unreadable(results: Sequence[dict[str, Any]]) -> None:
    """Raises for the first shard among ``results`` that could not be read, the class the one
    table (``shardstream.errors``) gives its kind of source failure, as the loader would."""
    from .errors import source_error_class

    unreadable = [r for r in results if is_unreadable(r)]
    if unreadable:
        first = unreadable[0]
        raise source_error_class(first["fatal"].get("kind", "other"))(
            "unreadable",
            first["url"],
            "",
            f"{first['fatal']['detail']} ({len(unreadable)} of {len(results)} shards unreadable)",
        )


def exit_status(results: Sequence[dict[str, Any]]) -> int:
    """0 all valid, 1 invalid samples or corrupt shards, 2 a shard could not be read at all."""
    if any(is_unreadable(r) for r in results):
        return 2
    if any(r["invalid"] or r["fatal"] for r in results):
        return 1
    return 0


def build_report(
    results: Sequence[dict[str, Any]],
    options: ScanOptions,
    *,
    elapsed: float | None = None,
    version: str = "",
) -> dict[str, Any]:
    """The machine-readable report: totals, counts by reason, one entry per shard and one per
    invalid sample (shard, ordinal, key, reason, detail)."""
    by_reason: Counter[str] = Counter()
    invalid: list[dict[str, Any]] = []
    shards: list[dict[str, Any]] = []
    for r in results:
        for item in r["invalid"]:
            by_reason[item["reason"]] += 1
            invalid.append(
                {
                    "shard": r["url"],
                    "ordinal": item["ordinal"],
                    "key": item["key"],
                    "reason": item["reason"],
                    "detail": item["detail"],
                }
            )
        shards.append(
            {
                "url": r["url"],
                "bytes": r["bytes"],
                "samples": r["samples"],
                "invalid": len(r["invalid"]),
                "fatal": _reported_fatal(r["fatal"]),
                "compressed": r["compressed"],
            }
        )
    samples = sum(r["samples"] for r in results)
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "version": version,
        "options": options.scan_kwargs(),
        "totals": {
            "shards": len(results),
            "shards_with_errors": sum(1 for r in results if r["invalid"] or r["fatal"]),
            "unreadable_shards": sum(1 for r in results if is_unreadable(r)),
            "corrupt_shards": sum(1 for r in results if r["fatal"] and not is_unreadable(r)),
            "samples": samples,
            "valid_samples": samples - len(invalid),
            "invalid_samples": len(invalid),
            "bytes": sum(r["bytes"] for r in results),
        },
        "by_reason": dict(sorted(by_reason.items())),
        "shard_errors": [{"shard": r["url"], **_reported_fatal(r["fatal"])} for r in results if r["fatal"]],
        "shards": shards,
        "invalid": invalid,
        "exit_status": exit_status(results),
    }
    if elapsed is not None:
        report["elapsed_s"] = round(elapsed, 3)
    return report


def _reported_fatal(fatal: dict[str, Any] | None) -> dict[str, Any] | None:
    # The report format (shardstream-validate/1) predates the source kind: it keeps the reason
    # and detail only, so that reports stay what their readers expect.
    return None if fatal is None else {"reason": fatal["reason"], "detail": fatal["detail"]}


def format_summary(report: dict[str, Any], *, worst: int = 10, show: int = 10) -> str:
    """The human summary: totals and rate, invalid samples by reason, shard-level errors, the
    worst shards and the first few invalid samples."""
    totals = report["totals"]
    lines = []
    rate = ""
    elapsed = report.get("elapsed_s")
    if elapsed:
        rate = (
            f" in {elapsed:.1f} s ({totals['samples'] / elapsed:,.0f} samples/s, "
            f"{human_bytes(totals['bytes'] / elapsed)}/s)"
        )
    mode = "decoded" if report["options"]["decode"] else "structure only, no decode"
    lines.append(
        f"checked {totals['shards']:,} shards, {totals['samples']:,} samples, "
        f"{human_bytes(totals['bytes'])}{rate} [{mode}]"
    )
    if totals["invalid_samples"]:
        share = 100 * totals["invalid_samples"] / max(1, totals["samples"])
        lines.append(
            f"invalid samples: {totals['invalid_samples']:,} of {totals['samples']:,} ({share:.2f}%)"
        )
        for reason, count in sorted(report["by_reason"].items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {reason:<20} {count:>10,}")
    if report["shard_errors"]:
        lines.append(f"shards with a fatal error: {len(report['shard_errors']):,}")
        for err in report["shard_errors"][:show]:
            lines.append(f"  {err['reason']:<20} {err['shard']}: {err['detail']}")
        if len(report["shard_errors"]) > show:
            lines.append(f"  ... and {len(report['shard_errors']) - show:,} more")
    bad_shards = [s for s in report["shards"] if s["invalid"] or s["fatal"]]
    if bad_shards:
        bad_shards.sort(key=lambda s: -s["invalid"])  # stable: ties stay in input order
        lines.append(f"worst shards (of {len(bad_shards):,} with errors):")
        for s in bad_shards[:worst]:
            fatal = f", then {s['fatal']['reason']}" if s["fatal"] else ""
            lines.append(f"  {s['invalid']:>8,} invalid of {s['samples']:,} samples{fatal}  {s['url']}")
    if report["invalid"]:
        lines.append(
            f"first invalid samples (all {len(report['invalid']):,} are in the --json report):"
            if len(report["invalid"]) > show
            else "invalid samples:"
        )
        for item in report["invalid"][:show]:
            lines.append(
                f"  {item['shard']} #{item['ordinal']} key {item['key']!r}: "
                f"{item['reason']}: {item['detail']}"
            )
    verdict = {0: "all samples valid", 1: "INVALID samples found", 2: "UNREADABLE input"}[
        report["exit_status"]
    ]
    lines.append(f"result: {verdict} (exit status {report['exit_status']})")
    return "\n".join(lines)


def timed_scan(
    shards: Sequence[Shard],
    options: ScanOptions,
    *,
    threads: int | None = None,
    on_unreadable: OnUnreadable = "record",
    on_result: Callable[[dict[str, Any]], None] | None = None,
    keep_offsets: bool = False,
) -> tuple[list[dict[str, Any]], float]:
    """:func:`scan_shards`, and the seconds it took."""
    start = time.perf_counter()
    results = scan_shards(
        shards,
        options,
        threads=threads,
        on_unreadable=on_unreadable,
        on_result=on_result,
        keep_offsets=keep_offsets,
    )
    return results, time.perf_counter() - start
