"""Subsets of an indexed dataset without resharding: by key, by DataComp uid, or by a filter on
per-sample metadata (``similarity >= 0.28 and width >= 200``).

A subset is an index whose shards keep only the selected samples (rust/src/index/subset.rs): its
manifest holds per shard the count kept (O(shards) on every rank, as for the whole dataset) and
each shard's detail block the kept ordinals. The plan schedules only those, and readers pass
the others over, so nothing is decoded to be thrown away. ``shardstream subset`` makes one
(under torchrun each rank reads the metadata of its share of the shards); a ``Source(keys=...,
uids=..., filter=...)`` makes one when the loader starts.

Metadata comes from each sample's ``json`` member (what img2dataset and DataComp write), or from
the Parquet file img2dataset writes beside each shard (``00012.parquet`` next to ``00012.tar``),
joined by key.
"""

from __future__ import annotations

import ast
import operator
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shardstream._deps import require
from shardstream.errors import ShardError

UID_FIELD = "uid"
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class _Missing(Exception):
    """A field the expression names is absent from this sample's metadata."""

    def __init__(self, name: str) -> None:
        self.name = name


@dataclass(frozen=True)
class Filter:
    """A parsed filter: comparisons of metadata fields with constants, joined by ``and``, ``or``
    and ``not``. Parsed with Python's own grammar but never evaluated by Python: only those node
    kinds are accepted, so a filter cannot call or import anything."""

    text: str
    tree: ast.Expression
    fields: tuple[str, ...]

    @property
    def clauses(self) -> list[str]:
        """The top-level ``and`` terms, reported one by one."""
        body = self.tree.body
        terms = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
        return [ast.get_source_segment(self.text, t) or ast.unparse(t) for t in terms]

    def evaluate(self, record: dict[str, Any]) -> bool:
        """Whether the sample passes; raises _Missing for an absent field."""
        return bool(_evaluate(self.tree.body, record))

    def clause_results(self, record: dict[str, Any]) -> list[bool | None]:
        """Each top-level term's result (None: a field it names is absent)."""
        body = self.tree.body
        terms = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
        out: list[bool | None] = []
        for term in terms:
            try:
                out.append(bool(_evaluate(term, record)))
            except _Missing:
                out.append(None)
        return out


def parse_filter(text: str) -> Filter:
    """Parses a filter; a syntax error or an unsupported construct is a ValueError that says where."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"filter {text!r}: syntax error at column {e.offset or 0}: {e.msg}") from None
    fields: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            fields.append(node.id)
        elif isinstance(node, ast.Attribute):
            fields.append(_dotted(node))
        elif not isinstance(node, _ALLOWED):
            raise ValueError(
                f"filter {text!r}: {type(node).__name__} is not allowed (only fields, constants, "
                "comparisons, and/or/not)"
            )
    if not fields:
        raise ValueError(f"filter {text!r} names no field")
    # An attribute's own Name node (a in a.b) is not a field of its own.
    names = {f for f in fields}
    dotted_roots = {f.split(".")[0] for f in names if "." in f}
    kept = [f for f in dict.fromkeys(fields) if "." in f or f not in dotted_roots]
    return Filter(text.strip(), tree, tuple(kept))


_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.Compare,
    ast.Constant, ast.Load, ast.List, ast.Tuple, ast.Set, *_COMPARE.keys(),
)  # fmt: skip


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    raise ValueError("a field is a name or a dotted path (meta.width)")


def _lookup(record: dict[str, Any], path: str) -> Any:
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            raise _Missing(path)
        value = value[part]
    return value


def _evaluate(node: ast.AST, record: dict[str, Any]) -> Any:
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_evaluate(v, record) for v in node.values)
        return any(_evaluate(v, record) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, record)
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, record)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(comparator, record)
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except TypeError:
                return False  # a string field compared with a number: not selected
            left = right
        return True
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _lookup(record, _dotted(node))
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_evaluate(e, record) for e in node.elts]
    raise ValueError(f"unsupported filter node {type(node).__name__}")


def load_uids(source: Any) -> set[str]:
    """DataComp uids as 32 hex digits: from a list, a ``.npy`` of 128-bit uids (DataComp's
    subset files: pairs of uint64, high then low), a ``.parquet`` with a ``uid`` column, or a
    text file of one uid per line."""
    if not isinstance(source, (str, os.PathLike)):
        return {_uid_text(u) for u in source}
    path = os.fspath(source)
    if path.endswith(".npy"):
        import numpy as np

        array = np.load(path, allow_pickle=False)  # never unpickle a file we were handed
        if array.dtype.names:  # a structured array: its first field holds the uid
            array = array[array.dtype.names[0]]
        if array.dtype.kind in "SU":
            return {_uid_text(u.decode() if isinstance(u, bytes) else str(u)) for u in array.ravel()}
        pairs = np.asarray(array, dtype=np.uint64).reshape(-1, 2)
        return {f"{int(hi):016x}{int(lo):016x}" for hi, lo in pairs}
    if path.endswith(".parquet"):
        pq = require("pyarrow.parquet", "a uid list in Parquet")
        return {_uid_text(u) for u in pq.read_table(path, columns=[UID_FIELD]).column(UID_FIELD).to_pylist()}
    with open(path) as f:
        return {_uid_text(line) for line in f if line.strip()}


def _uid_text(uid: Any) -> str:
    text = str(uid).strip().lower()
    return text.removeprefix("0x")


def load_keys(source: Any) -> set[str]:
    """Sample keys from a list, or a text file of one key per line."""
    if isinstance(source, (str, os.PathLike)):
        with open(os.fspath(source)) as f:
            return {line.strip() for line in f if line.strip()}
    return {str(k) for k in source}


@dataclass
class SubsetReport:
    """What a subset kept, for the CLI and for errors."""

    considered: int = 0
    kept: int = 0
    by_keys: int | None = None
    by_uids: int | None = None
    uids_given: int = 0
    clauses: dict[str, int] = field(default_factory=dict)
    lacking: Counter = field(default_factory=Counter)  # field -> samples without it
    without_metadata: int = 0

    def merge(self, other: SubsetReport) -> None:
        self.considered += other.considered
        self.kept += other.kept
        for name in ("by_keys", "by_uids"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is not None:
                setattr(self, name, (mine or 0) + theirs)
        for clause, n in other.clauses.items():
            self.clauses[clause] = self.clauses.get(clause, 0) + n
        self.lacking.update(other.lacking)
        self.without_metadata += other.without_metadata

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "lacking": dict(self.lacking)}

    @staticmethod
    def from_json(value: dict[str, Any]) -> SubsetReport:
        return SubsetReport(**{**value, "lacking": Counter(value.get("lacking", {}))})

    def lines(self) -> list[str]:
        pct = (lambda n: f"{100 * n / self.considered:.1f} %") if self.considered else (lambda n: "-")
        out = []
        if self.by_keys is not None:
            out.append(f"keys: {self.by_keys:,} samples match ({pct(self.by_keys)})")
        if self.by_uids is not None:
            out.append(
                f"uids: {self.by_uids:,} samples match ({pct(self.by_uids)}) "
                f"of {self.uids_given:,} uids given"
            )
        for clause, n in self.clauses.items():
            out.append(f"filter term {clause!r}: {n:,} samples pass ({pct(n)})")
        for name, n in sorted(self.lacking.items()):
            out.append(f"field {name!r} is absent from {n:,} samples: they are left out")
        if self.without_metadata:
            out.append(f"{self.without_metadata:,} samples have no metadata: they are left out")
        out.append(f"kept {self.kept:,} of {self.considered:,} samples ({pct(self.kept)})")
        return out


@dataclass(frozen=True)
class Selector:
    """What a subset keeps: samples whose key is in ``keys``, whose uid is in ``uids``, and that
    pass ``filter`` (all that are given). ``metadata``: "json" (each sample's json member) or
    "parquet" (img2dataset's Parquet beside each shard, joined by key)."""

    keys: frozenset[str] | None = None
    uids: frozenset[str] | None = None
    filter: Filter | None = None
    metadata: str = "json"
    uid_field: str = UID_FIELD

    @staticmethod
    def make(
        *, keys: Any = None, uids: Any = None, filter: str | Filter | None = None, metadata: str = "json"
    ) -> Selector:
        if keys is None and uids is None and filter is None:
            raise ValueError("a subset needs keys, uids or a filter")
        if metadata not in ("json", "parquet"):
            raise ValueError(f"metadata must be 'json' or 'parquet', got {metadata!r}")
        return Selector(
            keys=frozenset(load_keys(keys)) if keys is not None else None,
            uids=frozenset(load_uids(uids)) if uids is not None else None,
            filter=parse_filter(filter) if isinstance(filter, str) else filter,
            metadata=metadata,
        )

    @property
    def needs_metadata(self) -> bool:
        return self.uids is not None or self.filter is not None

    def choose(
        self, ordinals: Sequence[int], keys: Sequence[str], records: Callable[[int, str], Any]
    ) -> tuple[list[int], SubsetReport]:
        """The ordinals kept of one shard: ``ordinals`` are what the index schedules, ``keys`` the
        shard's keys by ordinal, ``records(ordinal, key)`` the metadata of a sample (None: none)."""
        report = SubsetReport(considered=len(ordinals))
        if self.keys is not None:
            report.by_keys = 0
        if self.uids is not None:
            report.by_uids = 0
        if self.filter is not None:
            report.clauses = dict.fromkeys(self.filter.clauses, 0)
        kept = []
        for o in ordinals:
            key = keys[o]
            ok = True
            if self.keys is not None:
                hit = key in self.keys
                report.by_keys += hit
                ok &= hit
            record = records(o, key) if self.needs_metadata else None
            if self.needs_metadata and record is None:
                report.without_metadata += 1
                continue
            if self.uids is not None:
                uid = record.get(self.uid_field) if isinstance(record, dict) else None
                hit = uid is not None and _uid_text(uid) in self.uids
                report.by_uids += hit
                ok &= hit
            if self.filter is not None:
                results = self.filter.clause_results(record)
                for clause, result in zip(self.filter.clauses, results, strict=True):
                    report.clauses[clause] += bool(result)
                try:
                    passed = self.filter.evaluate(record)
                except _Missing as missing:
                    report.lacking[missing.name] += 1
                    passed = False
                ok &= passed
            if ok:
                kept.append(o)
        report.kept = len(kept)
        return kept, report


def shard_selection(
    index: Any, shard: int, url: str, selector: Selector, *, config: dict[str, Any]
) -> tuple[list[int], SubsetReport]:
    """The ordinals ``selector`` keeps of shard ``shard`` of ``index``, opened at ``url``."""
    import json

    from shardstream import _core

    ordinals, keys = index.shard_samples(shard, config)
    records: Callable[[int, str], Any] = lambda o, k: None  # noqa: E731
    if selector.needs_metadata and selector.metadata == "json" or keys is None:
        report = _core.scan_shard(url, decode=False, require_caption=False, config=config, capture="json")
        if report.get("fatal") and report["samples"] <= (max(ordinals) if ordinals else -1):
            raise ShardError(
                report["fatal"]["reason"], url, "", f"cannot read its metadata: {report['fatal']['detail']}"
            )
        keys = keys if keys is not None else report["keys"]
        captured = report.get("captured", [])

        def from_json(o: int, _key: str) -> Any:
            text = captured[o] if o < len(captured) else None
            if text is None:
                return None
            try:
                value = json.loads(text)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None

        records = from_json
    if selector.needs_metadata and selector.metadata == "parquet":
        rows = _parquet_rows(url, selector, config)
        records = lambda o, k: rows.get(k)  # noqa: E731
    return selector.choose(ordinals, keys, records)


def parquet_beside(url: str) -> str:
    """img2dataset's metadata file of a shard: ``.../00012.tar`` -> ``.../00012.parquet``."""
    path, sep, query = url.partition("?")
    for ext in (".tar.gz", ".tgz", ".tar"):
        if path.endswith(ext):
            return path[: -len(ext)] + ".parquet" + sep + query
    raise ValueError(f"{url}: not a .tar shard, so no Parquet beside it is known")


def _parquet_rows(url: str, selector: Selector, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    import io

    from shardstream.index import _read_bytes

    pq = require("pyarrow.parquet", "a subset by img2dataset's Parquet metadata")

    where = parquet_beside(url)
    table = pq.read_table(io.BytesIO(_read_bytes(where, "metadata Parquet", timeout=60.0)))
    columns = [c for c in table.column_names]
    if "key" not in columns:
        raise ValueError(f"{where}: no 'key' column to join the shard's samples by (columns: {columns})")
    wanted = set(selector.filter.fields if selector.filter else ()) | (
        {selector.uid_field} if selector.uids is not None else set()
    )
    names = ["key", *[c for c in columns if c in {f.split(".")[0] for f in wanted}]]
    data = table.select(names).to_pylist()
    return {str(row.pop("key")): row for row in data}


def select(
    index: Any,
    selector: Selector,
    *,
    shards: Iterable[int] | None = None,
    threads: int | None = None,
    config: dict[str, Any] | None = None,
    progress: Any = None,
) -> tuple[dict[int, list[int]], SubsetReport]:
    """The kept ordinals of each shard in ``shards`` (default: all), read on ``threads`` threads;
    each shard read is counted on ``progress`` (a :class:`~shardstream.progress.Progress`)."""
    from shardstream._system import available_cores

    chosen = list(range(len(index))) if shards is None else list(shards)
    config = config or {}
    total = SubsetReport()
    kept: dict[int, list[int]] = {}
    with ThreadPoolExecutor(max(1, threads or min(32, 4 * available_cores()))) as pool:
        results = pool.map(
            lambda i: (i, shard_selection(index, i, index.url(i), selector, config=config)), chosen
        )
        for i, (ordinals, report) in results:
            kept[i] = ordinals
            total.merge(report)
            if progress is not None:
                progress.advance(1, samples=len(ordinals))
    total.uids_given = len(selector.uids) if selector.uids is not None else 0
    return kept, total


def check_selected(selector: Selector, report: SubsetReport) -> None:
    """The errors a user must hear of: nothing matched, or a field no sample has."""
    if selector.uids is not None and report.by_uids == 0:
        raise ValueError(
            f"none of the {len(selector.uids):,} uids matches a sample of the index (uids are read "
            f"from the {selector.metadata} metadata's {selector.uid_field!r} field of "
            f"{report.considered:,} samples)"
        )
    if selector.keys is not None and report.by_keys == 0:
        raise ValueError(f"none of the {len(selector.keys):,} keys matches a sample of the index")
    if selector.filter is not None:
        for name in selector.filter.fields:
            if report.lacking[name] and report.lacking[name] >= report.considered - report.without_metadata:
                raise ValueError(
                    f"filter {selector.filter.text!r} names field {name!r}, which is absent from all "
                    f"{report.lacking[name]:,} samples' {selector.metadata} metadata"
                )
    if report.kept == 0:
        raise ValueError(f"the subset keeps no sample of {report.considered:,}: " + "; ".join(report.lines()))


def subset_index(
    index: Any,
    *,
    keys: Any = None,
    uids: Any = None,
    filter: str | None = None,
    metadata: str = "json",
    threads: int | None = None,
    **source_options: Any,
) -> tuple[Any, SubsetReport]:
    """The subset of ``index`` (a DatasetIndex or where one is) that keeps the samples matching
    all of ``keys``, ``uids`` and ``filter``, and what it kept."""
    from shardstream.index import load_index
    from shardstream.urls import index_source_config

    loaded = load_index(index, **source_options)
    selector = Selector.make(keys=keys, uids=uids, filter=filter, metadata=metadata)
    config = index_source_config(None, source_options, schemes=loaded.schemes())
    kept, report = select(loaded, selector, threads=threads, config=config)
    check_selected(selector, report)
    return loaded.with_selections([kept[i] for i in range(len(loaded))], config), report
