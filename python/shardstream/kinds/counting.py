"""The one counting pass of every kind planned over unit weights (token counts of the packed text
kind, patch counts of the token-budget NaFlex kind, and the next such kind's): one algorithm,
generic over the kind, which gives it a :class:`CountingKind`.

- **One process** (the default): every file is counted here.
- **Split across ranks** (``distributed=True`` under torchrun, or with ``torch.distributed``
  initialised): each rank probes and counts every world-th file, rank 0 merges the units in the
  order of the file list (JSON over uint8 tensors, as ``shardstream index`` gathers its scans:
  :mod:`shardstream._rank_group`), writes ``output`` and hands the merged units to every rank, so
  that every rank returns the identical counts (and raises the same error).
- **Grown or changed corpus** (``previous=``): each file's content identity is probed first (a
  ``stat`` or a ``HEAD``, as ``shardstream index`` probes shards: :mod:`shardstream.identity`);
  a file ``previous`` holds with the same identity keeps its units unread, a new or changed
  file (or one that failed before) is counted, and a file no longer listed is dropped. The
  result equals a fresh count of the same files.

Each unit records that probe as ``version``, beside the ``identity`` the core pins reads with
(an ETag, or only the size of a local file): a local file rewritten at the same size keeps its
``identity`` but not its ``version`` (size and mtime), so it is counted again.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shardstream.kinds import counts_file
from shardstream.progress import Progress
from shardstream.urls import Shard

C = TypeVar("C")

#: The fields of a counts object that are not its settings.
_UNIT_FIELDS = ("units", "failed")


@dataclass(frozen=True)
class CountingKind(Generic[C]):
    """What the counting pass needs from a kind.

    Attributes:
        caller: The public function's name, first on warnings (``count_tokens``).
        counts_type: The kind's counts class (``load`` reads a saved one).
        count: Counts files: ``(urls, threads)`` to one dict per unit, in file order (the
            ``_core.count_*`` function with the kind's settings bound): ``url``, ``first_row``,
            ``rows``, ``identity``, the kind's numbers, ``examples`` and ``error`` (None, or
            why the file could not be read).
        build: ``(units, failed)`` to the kind's counts object under its settings.
        nothing: The error message when the counts hold nothing to plan (no token, no
            batch), else None.
        unchecked: Settings fields that may differ from ``previous``'s (a path whose bytes a
            fingerprint pins).
    """

    caller: str
    counts_type: Any
    count: Callable[[list[str], int], list[dict[str, Any]]]
    build: Callable[[list[dict[str, Any]], list[dict[str, Any]]], C]
    nothing: Callable[[C], str | None]
    unchecked: tuple[str, ...] = ()


def count_units(
    kind: CountingKind[C],
    shards: Sequence[Shard],
    *,
    threads: int,
    source_options: dict[str, Any],
    on_error: str,
    previous: C | str | os.PathLike[str] | None = None,
    output: str | os.PathLike[str] | None = None,
    distributed: bool = False,
) -> C:
    """Counts the units of ``shards`` for ``kind`` (see the module's description).

    Args:
        kind: The kind counted.
        shards: The files, expanded, in corpus order.
        threads: Threads counting on each rank.
        source_options: The source options (for the identity probes' CA bundle).
        on_error: ``"skip"`` or ``"raise"`` (as the kinds' ``on_error``).
        previous: Counts of an earlier pass (or their path), read on rank 0 only: files it holds
            with an unchanged identity are not read again.
        output: Saved there by rank 0, before any rank returns.
        distributed: Split the files across the ranks of a torchrun job; every rank must call.

    Returns:
        The counts, the same on every rank.

    Raises:
        ShardError: with ``on_error="raise"``, a unit could not be read (on every rank).
        ValueError: the counts hold nothing to plan (on every rank).
    """
    from shardstream._rank_group import RankGroup, SoloGroup, share

    rank, world = _rank_world(distributed)
    with SoloGroup() if world == 1 else RankGroup(rank, world) as group:
        probing = share(shards, rank, world)
        probed = group.gather_json(_probe(probing, source_options))
        plan: dict[str, Any] | None = None
        reused: dict[int, list[dict[str, Any]]] = {}
        error: BaseException | None = None
        if probed is not None:  # rank 0 decides which files to count, from its previous counts
            try:
                plan, reused = _plan(kind, shards, probed, previous)
            except (OSError, ValueError) as e:  # told to every rank, which would wait for the plan
                error, plan = e, {"error": f"rank 0: cannot read the previous counts: {e}"}
        plan = group.broadcast_json(plan)
        _raise_if_failed(kind, plan, error)
        counting = share(plan["count"], rank, world)
        try:
            mine = [shards[i] for _, i in counting]
            with _progress(kind, mine, rank) as progress:
                counted: Any = _count(kind, mine, [i for _, i in counting], threads, progress)
        except Exception as e:  # every rank must reach the gather, or the others wait for it
            error, counted = e, {"error": f"rank {rank}: {type(e).__name__}: {e}"}
        gathered = group.gather_json(counted)
        merged = None
        if gathered is not None:  # rank 0 merges in the order of the file list
            errors = [part["error"] for part in gathered if isinstance(part, dict)]
            files = {i: units for part in gathered if not isinstance(part, dict) for i, units in part}
            merged = {"error": errors[0]} if errors else _merge(shards, plan["versions"], reused, files)
        merged = group.broadcast_json(merged)
        _raise_if_failed(kind, merged, error)
        # Every rank judges the same merged units the same way: the same counts, or the same error.
        counts = kind.build(merged["units"], merged["failed"])
        if on_error == "raise":
            counts_file.report_failed(kind.caller, merged["failed"], len(merged["units"]), on_error)
        message = kind.nothing(counts)
        if message is not None:
            raise ValueError(message)
        if rank == 0:  # one warning per job, not one per rank
            counts_file.report_failed(
                kind.caller, merged["failed"], len(merged["units"]), on_error, stacklevel=4
            )
        _save_on_rank_zero(group, counts, output)
        return counts


def _plan(
    kind: CountingKind[Any], shards: Sequence[Shard], probed: list[Any], previous: Any
) -> tuple[dict[str, Any], dict[int, list[dict[str, Any]]]]:
    """Rank 0's plan (every file's probed version, the positions of the files to count) and the
    previous units of the files that are not counted again, by position."""
    versions: list[str | None] = [None] * len(shards)
    for part in probed:
        for i, version in part:
            versions[i] = version
    old = _previous_units(kind, previous)
    reused = {i: old[s.url] for i, s in enumerate(shards) if _same(old, s, versions[i])}
    return {"versions": versions, "count": [i for i in range(len(shards)) if i not in reused]}, reused


def _raise_if_failed(kind: CountingKind[Any], told: dict[str, Any], error: BaseException | None) -> None:
    """Raises on every rank when rank 0 says a step failed: the rank where it failed raises its
    own exception, the others a RuntimeError naming it."""
    if "error" in told:
        raise error if error is not None else RuntimeError(f"{kind.caller}: {told['error']}")


def _rank_world(distributed: bool) -> tuple[int, int]:
    """(rank, world) to split over: 0 of 1 unless ``distributed``; then torch.distributed's when
    it is initialised (a training script), else torchrun's environment."""
    if not distributed:
        return 0, 1
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    from shardstream._system import launch_rank_world

    return launch_rank_world()


def _probe(probing: list[tuple[int, Shard]], source_options: dict[str, Any]) -> list[list[Any]]:
    """[position, content identity or None] of this rank's share of the files."""
    from shardstream.identity import probe_identities

    found = probe_identities([s for _, s in probing], source_options=source_options)
    return [[i, f.identity] for (i, _), f in zip(probing, found, strict=True)]


def _previous_units(kind: CountingKind[Any], previous: Any) -> dict[str, list[dict[str, Any]]]:
    """``previous``'s units by URL, in order; none when there is none, or when it was counted
    under other settings (it then cannot be reused: everything is counted, with a warning)."""
    if previous is None:
        return {}
    if not isinstance(previous, kind.counts_type):
        previous = kind.counts_type.load(previous)
    fresh = kind.build([], [])
    fields = dataclasses.fields(fresh)  # type: ignore[arg-type]
    checked = [f.name for f in fields if f.name not in (*_UNIT_FIELDS, *kind.unchecked)]
    differ = [name for name in checked if getattr(previous, name) != getattr(fresh, name)]
    if differ:
        warnings.warn(
            f"{kind.caller}: the previous counts were made with other settings ({', '.join(differ)}): "
            "counting every file",
            stacklevel=5,  # past _plan and count_units: the user's call of count_tokens
        )
        return {}
    by_url: dict[str, list[dict[str, Any]]] = {}
    for unit in previous.units:
        by_url.setdefault(unit["url"], []).append(unit)
    return by_url


def _same(old: dict[str, list[dict[str, Any]]], shard: Shard, version: str | None) -> bool:
    """Whether every unit ``old`` holds of ``shard`` was counted from the version there now (a
    file whose identity cannot be probed, or counts without versions, are always counted)."""
    units = old.get(shard.url)
    return version is not None and bool(units) and all(u.get("version") == version for u in units)


def _progress(kind: CountingKind[Any], shards: list[Shard], rank: int) -> Progress:
    """The pass's progress line, on rank 0's terminal only (see :mod:`shardstream.progress`)."""
    label = kind.caller if rank == 0 else f"{kind.caller} (rank {rank})"
    return Progress(
        label, total=len(shards), unit="files", items="units", enabled=None if rank == 0 else False
    )


def _file_bytes(shard: Shard) -> int:
    """The file's size where it is known without a request (a local file, a listed object)."""
    if shard.listed is not None:
        return int(shard.listed[0])
    try:
        return os.path.getsize(shard.url)
    except OSError:
        return 0


def _count(
    kind: CountingKind[Any], shards: list[Shard], positions: list[int], threads: int, progress: Progress
) -> list[list[Any]]:
    """[position, that file's unit dicts] of each file in ``shards``: counted in one call, so the
    threads share files; on a terminal, in calls of a few files per thread, so the progress line
    moves (each call waits for its slowest file, a cost taken only where someone watches)."""
    if not shards:
        return []
    step = len(shards) if not progress.enabled else max(1, 4 * threads)
    results: list[dict[str, Any]] = []
    for start in range(0, len(shards), step):
        chunk = shards[start : start + step]
        counted = kind.count([s.url for s in chunk], threads)
        results += counted
        progress.advance(len(chunk), samples=len(counted), nbytes=sum(_file_bytes(s) for s in chunk))
    # The core gives each file's units consecutively, in the order of the URLs.
    out: list[list[Any]] = []
    at = 0
    for position, shard in zip(positions, shards, strict=True):
        start = at
        while at < len(results) and results[at]["url"] == shard.url:
            at += 1
        out.append([position, results[start:at]])
    return out


def _merge(
    shards: Sequence[Shard],
    versions: list[str | None],
    reused: dict[int, list[dict[str, Any]]],
    counted: dict[int, list[dict[str, Any]]],
) -> dict[str, list[dict[str, Any]]]:
    """Every file's units in the order of ``shards``: reused ones as they were (named as now),
    counted ones with their version; units that could not be read go to ``failed``."""
    units: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for i, shard in enumerate(shards):
        if i in reused:
            units.extend({**u, "display": shard.display} for u in reused[i])
            continue
        for r in counted[i]:
            unit = _unit(r, versions[i], shard.display)
            error = unit.pop("error")
            if error is not None:
                failed.append({"url": unit["url"], "display": unit["display"], "error": error})
            else:
                units.append(unit)
    return {"units": units, "failed": failed}


def _unit(result: dict[str, Any], version: str | None, display: str) -> dict[str, Any]:
    """A core result as a counts unit: ``version`` after the core's ``identity``, ``display``,
    and at most 3 of its examples last."""
    unit: dict[str, Any] = {}
    for key, value in result.items():
        if key != "examples":
            unit[key] = value
        if key == "identity":
            unit["version"] = version
    unit["display"] = display
    unit["examples"] = result["examples"][:3]
    return unit


def _save_on_rank_zero(group: Any, counts: Any, output: str | os.PathLike[str] | None) -> None:
    """Rank 0 saves the counts; no rank returns before the file is there (or raises if rank 0
    could not write it)."""
    if output is None:
        return
    error: OSError | None = None
    if group.rank == 0:
        try:
            counts.save(output)
        except OSError as e:
            error = e
    if group.broadcast_int(0 if error is None else 1):
        if error is not None:
            raise error
        raise RuntimeError(f"rank 0 could not write the counts to {os.fspath(output)}")
