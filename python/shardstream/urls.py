"""URL specs -> concrete shard URLs.

A spec is a string or a list of strings. Each string may hold several parts separated by ``::``,
and each part may use brace expansion: ``{000..099}`` (zero padding kept), ``{0..10..2}``,
``{a,b,c}``, several and nested braces. Each expanded part is then resolved by its scheme:

- a local path or ``file://``: a file, a directory (its ``.tar``, ``.tar.gz``, ``.tgz`` and
  ``.parquet`` files; for a text corpus also its JSONL files, :data:`TEXT_SUFFIXES`) or a glob
  (``/data/*.tar``: every file it matches, whatever its name);
- ``http://`` / ``https://``: used as given;
- ``s3://bucket/key``, ``s3://bucket/prefix/`` (listing) or ``s3://bucket/prefix/*.tar`` (glob;
  ``*`` stays within one path segment, ``**`` crosses them): listed with boto3; each shard keeps
  its ``s3://`` URL and an :class:`S3Signer` that presigns it whenever the Rust reader opens it
  (credentials never leave this process, and no signature outlives a long run);
- ``hf://datasets/{org}/{name}[@{revision}]/{path}``: a dataset repository on the Hugging Face
  Hub (files, folders and globs as for S3), each folder listed once; see :mod:`shardstream.hub`;
- ``pipe:`` (runs a shell command) and any other scheme are refused with :class:`BadUrlError`.

The result is a list of :class:`Shard`: plain ``str`` values (the concrete URL, which may carry
credentials a user wrote into an http(s) URL) with a printable ``display`` (redacted). Print
``display``, never the shard itself.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from shardstream._deps import require
from shardstream.errors import BadUrlError, CredentialsError, NotFoundError, SourceError

#: The files a directory, S3 prefix or ``hf://`` folder listing takes as shards.
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".parquet")
#: JSONL files (FineWeb, DCLM, The Stack v2; C4 and Dolma name theirs ``.json.gz``): the packed
#: text kind reads them, image loaders do not, so only a text corpus's listings take them.
JSONL_SUFFIXES = (
    ".jsonl",
    ".jsonl.gz",
    ".jsonl.zst",
    ".ndjson",
    ".ndjson.gz",
    ".ndjson.zst",
    ".json.gz",
    ".json.zst",
)
#: What a text corpus's listings take (``suffixes=`` of :func:`expand_urls`).
TEXT_SUFFIXES = SHARD_SUFFIXES + JSONL_SUFFIXES
REMOTE_SCHEMES = ("http", "https")
KNOWN_SCHEMES = ("file", "http", "https", "s3", "hf")
_GLOB_CHARS = re.compile(r"[*?\[]")
# How long a presigned GET stays valid. Shards are signed each time they are opened, so this
# only has to cover one read of one shard, retries and resumes included (a URL made from
# temporary credentials dies with them earlier, whatever this says).
DEFAULT_EXPIRES_IN = 3600
# A presigned URL is reused for this share of its lifetime, at most PRESIGN_REUSE_MAX_S: each
# presign is Python (boto3) on a reader thread, and a Parquet row group is one or two requests,
# so signing each one cost the loader 5-10 % of a core in allocations and garbage collection.
PRESIGN_REUSE_SHARE = 0.1
PRESIGN_REUSE_MAX_S = 60.0
PRESIGN_CACHE_ENTRIES = 4096
# Options of the Rust reader: callers may pass one set of keywords to both; they are not ours.
# (``ca_bundle`` is also an S3 option: boto3 trusts the same roots for its own requests.)
READER_OPTIONS = frozenset(
    {
        "connect_timeout",
        "read_timeout",
        "max_retries",
        "backoff_initial",
        "backoff_max",
        "retry_after_max",
        "cache_dir",
        "cache_max_bytes",
        "ca_bundle",
    }
)


class Shard(str):
    """A concrete shard URL. The ``str`` value is what the reader opens; ``display`` is what
    messages show (``repr`` shows only that). An ``s3://`` shard carries the :class:`S3Signer`
    that presigns it each time it is opened, an ``hf://`` one the :class:`~shardstream.hub.HfSigner`."""

    display: str
    signer: Any
    listed: tuple[int, str] | None  # (size, ETag) from an S3 listing, (size, blob id) from the Hub's

    def __new__(
        cls,
        url: str,
        display: str | None = None,
        signer: Any = None,
        listed: tuple[int, str] | None = None,
    ) -> Shard:
        shard = super().__new__(cls, url)
        shard.display = display if display is not None else redact(url)
        shard.signer = signer
        shard.listed = listed
        return shard

    @property
    def url(self) -> str:
        return str.__str__(self)

    def open_url(self) -> str:
        """The URL to fetch now: presigned for S3 (valid for ``expires_in`` from this call), the
        resolve URL for the Hub (see :meth:`open_request` for its headers)."""
        return self.open_request()[0]

    def open_request(self) -> tuple[str, dict[str, str]]:
        """The URL to fetch now and the headers to send with it (a Hub token: never print them)."""
        if self.signer is None:
            return self.url, {}
        answer = self.signer(self.url)
        return (answer, {}) if isinstance(answer, str) else (answer[0], dict(answer[1]))

    def __repr__(self) -> str:
        return f"Shard({self.display!r})"


@dataclass(frozen=True)
class S3Options:
    """How to reach S3. Unset values come from boto3's usual sources: environment
    (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
    ``AWS_PROFILE``, keys), config/credentials files, instance role."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    expires_in: int = DEFAULT_EXPIRES_IN
    addressing_style: str | None = None  # "path" | "virtual" | "auto"; path for custom endpoints
    ca_bundle: str | None = None  # PEM roots for an endpoint behind a private CA (else AWS_CA_BUNDLE)

    @classmethod
    def from_any(cls, value: S3Options | dict[str, Any] | None, extra: dict[str, Any]) -> S3Options:
        base = value if isinstance(value, S3Options) else cls(**_normalise(dict(value or {})))
        return replace(base, **_normalise(extra)) if extra else base


def _normalise(options: dict[str, Any]) -> dict[str, Any]:
    if "region_name" in options:
        options["region"] = options.pop("region_name")
    allowed = {f.name for f in fields(S3Options)}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"unknown source option(s) {unknown}; S3 options are {sorted(allowed)}")
    return options


# Options of the URL expansion itself (what it verifies before training), not of any source.
EXPANSION_OPTIONS = frozenset({"check"})
S3_OPTIONS = frozenset(f.name for f in fields(S3Options)) | {"region_name"}


@dataclass(frozen=True)
class OptionParts:
    """Resolved source options (:meth:`SourceOptions.keywords`, or an older caller's keyword
    dict) split by who takes them: the S3 client and signer, the Rust reader, the URL
    expansion. The one conversion from the first to each of the others (:func:`split_options`)."""

    s3: S3Options
    reader: dict[str, Any]
    check: str


def split_options(options: dict[str, Any]) -> OptionParts:
    """``options`` split into the parts each consumer takes; a key none of them takes is
    refused by name (a :class:`TypeError`), never passed on to one that does not know it.

    ``s3_options`` (an :class:`S3Options` or a dict of its fields) is the base the S3 keys
    override; ``ca_bundle`` goes to the reader and, unless the S3 part names its own, to S3.
    """
    known = S3_OPTIONS | READER_OPTIONS | EXPANSION_OPTIONS | {"s3_options"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown source option(s) {unknown}; known options are {sorted(known)}")
    s3_keys = {k: v for k, v in options.items() if k in S3_OPTIONS and k not in READER_OPTIONS}
    s3 = S3Options.from_any(options.get("s3_options"), s3_keys)
    if options.get("ca_bundle") and s3.ca_bundle is None:
        s3 = replace(s3, ca_bundle=os.fspath(options["ca_bundle"]))
    reader = {k: v for k, v in options.items() if k in READER_OPTIONS and v is not None}
    return OptionParts(s3=s3, reader=reader, check=options.get("check", "first"))


# -- redaction -------------------------------------------------------------------------------------


def redact(url: str) -> str:
    """Removes what must never be printed: the query string (presigned signatures live there)
    and ``user:password@`` in the authority. Mirrors ``source::redact_url`` in Rust."""
    cut = [i for i in (url.find("?"), url.find("#")) if i >= 0]
    head, had_query = (url[: min(cut)], True) if cut else (url, False)
    scheme_end = head.find("://")
    if scheme_end >= 0:
        rest = head[scheme_end + 3 :]
        slash = rest.find("/")
        authority = rest if slash < 0 else rest[:slash]
        at = authority.rfind("@")
        if at >= 0:
            head = f"{head[:scheme_end]}://***@{rest[at + 1 :]}"
    return head + ("?<redacted>" if had_query else "")


# -- brace expansion and '::' lists ---------------------------------------------------------------


def split_parts(spec: str) -> list[str]:
    """Splits on ``::`` outside ``[...]`` (an IPv6 host such as ``[::1]`` stays whole)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(spec):
        c = spec[i]
        if c == "[":
            depth += 1
        elif c == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and spec.startswith("::", i):
            parts.append(spec[start:i])
            start = i = i + 2
            continue
        i += 1
    parts.append(spec[start:])
    return [p.strip() for p in parts if p.strip()]


def _matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise BadUrlError("bad_url", redact(text), "", "unbalanced '{' in URL spec")


def _split_top_level_commas(body: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, c in enumerate(body):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    items.append(body[start:])
    return items


_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")
_ALPHA_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])$")


# The most names one spec may expand to: far above any real dataset (a million shards), far
# below what would exhaust memory (a mistyped ``{0..99999999999}`` is refused, not materialised).
MAX_EXPANSION = 10_000_000


def _too_many(count: int, what: str) -> BadUrlError:
    return BadUrlError("bad_url", "", "", f"{what} expands to {count} names, more than {MAX_EXPANSION}")


def _range_items(body: str) -> list[str] | None:
    m = _RANGE.match(body)
    if m:
        a_text, b_text, step_text = m.groups()
        a, b, step = int(a_text), int(b_text), int(step_text or 1)
        if step <= 0:
            raise BadUrlError("bad_url", "", "", f"brace range step must be positive: {{{body}}}")
        count = abs(b - a) // step + 1
        if count > MAX_EXPANSION:
            raise _too_many(count, f"brace range {{{body}}}")
        padded = any(t.lstrip("-").startswith("0") and len(t.lstrip("-")) > 1 for t in (a_text, b_text))
        width = max(len(a_text), len(b_text)) if padded else 0
        values = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [f"{v:0{width}d}" if width else str(v) for v in values]
    m = _ALPHA_RANGE.match(body)
    if m:
        a, b = ord(m.group(1)), ord(m.group(2))
        codes = range(a, b + 1) if a <= b else range(a, b - 1, -1)
        return [chr(c) for c in codes]
    return None


def brace_expand(pattern: str) -> list[str]:
    """Bash-style brace expansion (ranges with zero padding and steps, comma lists, nesting).
    A ``{...}`` with neither a range nor a comma is left as it is."""
    start = pattern.find("{")
    while start >= 0:
        end = _matching_brace(pattern, start)
        body = pattern[start + 1 : end]
        items = _range_items(body)
        if items is None:
            alternatives = _split_top_level_commas(body)
            if len(alternatives) > 1:
                items = [x for alt in alternatives for x in brace_expand(alt)]
        if items is not None:
            prefix, suffixes = pattern[:start], brace_expand(pattern[end + 1 :])
            if len(items) * len(suffixes) > MAX_EXPANSION:
                raise _too_many(len(items) * len(suffixes), "brace pattern")
            return [prefix + item + suffix for item in items for suffix in suffixes]
        start = pattern.find("{", end + 1)
    return [pattern]


# -- scheme dispatch -------------------------------------------------------------------------------


def scheme_of(url: str) -> str:
    """``"local"`` for paths, else the lower-cased scheme; refuses ``pipe:`` and unknown schemes."""
    if url.startswith("pipe:"):
        raise BadUrlError("bad_url", redact(url), "", "pipe: URLs run shell commands and are refused")
    sep = url.find("://")
    if sep < 0:
        return "local"
    scheme = url[:sep].lower()
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme):
        return "local"
    if scheme not in KNOWN_SCHEMES:
        raise BadUrlError(
            "bad_url",
            redact(url),
            "",
            f"unknown scheme {scheme!r} (supported: local paths, file://, http://, https://, s3://, hf://)",
        )
    return scheme


def _is_shard_file(name: str, suffixes: tuple[str, ...] = SHARD_SUFFIXES) -> bool:
    return name.endswith(suffixes)


def _expand_local(part: str, suffixes: tuple[str, ...] = SHARD_SUFFIXES) -> tuple[list[Shard], bool]:
    path = os.path.expanduser(part[len("file://") :] if part.startswith("file://") else part)
    if _GLOB_CHARS.search(path):
        matches = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not matches:
            raise NotFoundError("unreadable", part, "", "no file matches this pattern")
        return [Shard(p, p) for p in matches], True
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if _is_shard_file(n, suffixes))
        if not files:
            raise NotFoundError("unreadable", part, "", f"no {'/'.join(suffixes)} files in this directory")
        return [Shard(p, p) for p in files], True
    return [Shard(path, path)], False


def _check_local(shard: Shard) -> None:
    if not os.path.exists(shard.url):
        raise NotFoundError("unreadable", shard.display, "", "not found: no such file")


def expand_urls(
    spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    s3_options: S3Options | dict[str, Any] | None = None,
    check: str = "first",
    suffixes: tuple[str, ...] = SHARD_SUFFIXES,
    **options: Any,
) -> list[Shard]:
    """Concrete shard URLs for ``spec`` (see the module docstring), in spec order.

    ``check``: ``"first"`` (default) verifies that the first shard of every part exists and is
    readable with the credentials at hand (a local ``stat``, an S3 ``HeadObject``), so a wrong
    bucket or secret fails here with a clear error instead of deep in a training run;
    ``"all"`` checks every shard, ``"none"`` none (missing shards are then reported when read,
    and handled by the ``on_error`` policy). S3 options may be given as ``s3_options`` or as
    keywords (``endpoint_url=``, ``region=``, ``profile=``, ``expires_in=``, ``addressing_style=``);
    reader options (:data:`READER_OPTIONS`) are accepted and ignored here. ``suffixes``: the
    file name endings a directory, prefix or folder listing takes (default
    :data:`SHARD_SUFFIXES`; a text corpus passes :data:`TEXT_SUFFIXES`); explicit names and
    globs are taken whatever they end with.
    """
    if check not in ("first", "all", "none"):
        raise ValueError(f"check must be 'first', 'all' or 'none', not {check!r}")
    resolver = _Resolver(split_options({**options, "s3_options": s3_options}).s3, tuple(suffixes))
    checked_locations: set[str] = set()
    specs: Iterable[Any] = [spec] if isinstance(spec, (str, os.PathLike)) else spec
    out: list[Shard] = []
    for item in specs:
        if isinstance(item, Shard):  # already concrete (re-expanding would lose its display)
            out.append(item)
            continue
        for part in split_parts(os.fspath(item)):
            part_shards: list[Shard] = []
            unproven: list[Shard] = []  # shards named explicitly, not found by a listing or glob
            for concrete in brace_expand(part):
                shards, listed = resolver.resolve(concrete)
                part_shards.extend(shards)
                if not listed:
                    unproven.extend(shards)
            if check == "all":
                for shard in unproven:
                    resolver.check(shard)
            elif check == "first" and unproven:
                # One check per folder or bucket prefix, not per part: a list of a million
                # explicit URLs must not become a million HeadObject requests.
                location = unproven[0].display.rsplit("/", 1)[0]
                if location not in checked_locations:
                    checked_locations.add(location)
                    resolver.check(unproven[0])
            out.extend(part_shards)
    return out


def check_first_shard(url: str, **options: Any) -> None:
    """Checks that one shard exists and is readable with the credentials at hand (a local
    ``stat``, an S3 ``HeadObject``): the bounded start-up check for an index's shards."""
    # Always "first": a SourceOptions(check=...) among the options is about URL lists, not this.
    expand_urls(url, **{**options, "check": "first"})


def index_source_config(
    shards: Sequence[Shard] | None, options: dict[str, Any], *, schemes: Iterable[str] = ()
) -> dict[str, Any]:
    """:func:`source_config` for the shards of an index: the given shards', or, when the index
    names them itself, one signer for all of its ``s3://`` shards (made without listing them)."""
    if shards is not None:
        return source_config(shards, options)
    by_scheme: dict[str, Any] = {}
    if "s3" in set(schemes):
        by_scheme["s3"] = S3Signer(split_options(options).s3)
    if "hf" in set(schemes):
        from shardstream.hub import HfSigner

        by_scheme["hf"] = HfSigner()
    if len(by_scheme) > 1:
        return {**source_config([], options), "signer": _SchemeSigners(by_scheme)}
    return source_config([Shard(f"{k}://", f"{k}://", signer=v) for k, v in by_scheme.items()], options)


def presign_reuse_s(expires_in: float) -> float:
    """How long a URL presigned for ``expires_in`` seconds is handed out again."""
    return min(PRESIGN_REUSE_MAX_S, PRESIGN_REUSE_SHARE * expires_in)


class S3Signer:
    """Presigns GETs of ``s3://`` URLs with boto3's credential chain when a shard is opened, not
    when the URL list is made: a signature made from temporary credentials (instance role, SSO)
    dies with them after hours, and an epoch can take days. boto3 refreshes such credentials
    before they expire, so a signature made at open time is always good for the read.

    One client per process, made on first use (again after a fork) and never pickled, so a
    signer travels to DataLoader workers. Called from the Rust reader threads.

    A URL presigned for an object is handed out again for a tenth of ``expires_in``, at most a
    minute: boto3 refreshes temporary credentials 10-15 minutes before they expire, so a URL
    that young is still good for the read."""

    def __init__(self, s3: S3Options) -> None:
        self.s3 = s3
        self._client: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"s3": self.s3}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["s3"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Signer) and other.s3 == self.s3

    def __hash__(self) -> int:
        return hash(self.s3)

    def _own_after_fork(self) -> None:
        if self._pid != os.getpid():
            # A forked child: the parent's client (and its lock, perhaps held) are not ours.
            self._lock, self._client, self._pid = threading.Lock(), None, os.getpid()
            self._recent = OrderedDict()

    def client(self, where: str) -> Any:
        self._own_after_fork()
        with self._lock:
            if self._client is None:
                self._client = _make_client(self.s3, where)
            return self._client

    def __call__(self, url: str) -> str:
        self._own_after_fork()
        now = time.monotonic()
        with self._lock:
            made = self._recent.get(url)
        if made is not None and now - made[0] < presign_reuse_s(self.s3.expires_in):
            return made[1]
        bucket, key = parse_s3_url(url)
        signed = _s3_call(
            url,
            self.client(url).generate_presigned_url,
            "get_object",
            Params={"Bucket": bucket, "Key": key},
            ExpiresIn=self.s3.expires_in,
        )
        with self._lock:
            self._recent[url] = (now, signed)
            self._recent.move_to_end(url)
            while len(self._recent) > PRESIGN_CACHE_ENTRIES:
                self._recent.popitem(last=False)
        return signed


class _SignerTable:
    """Signs each URL with its own shard's signer (shards from several ``expand_urls`` calls)."""

    def __init__(self, signers: dict[str, S3Signer]) -> None:
        self.signers = signers

    def __call__(self, url: str) -> str:
        return self.signers[url](url)


class _SchemeSigners:
    """Signs each URL with the signer of its scheme (an index naming s3:// and hf:// shards)."""

    def __init__(self, signers: dict[str, Any]) -> None:
        self.signers = signers

    def __call__(self, url: str) -> Any:
        return self.signers[url.partition("://")[0]](url)


def reader_signer(shards: Iterable[Any]) -> Any:
    """What the Rust reader calls to presign the ``s3://`` (and resolve the ``hf://``) shards
    among ``shards`` (None when there are none)."""
    signers = {s.url: s.signer for s in shards if isinstance(s, Shard) and s.signer is not None}
    distinct = set(signers.values())
    if not distinct:
        return None
    return next(iter(distinct)) if len(distinct) == 1 else _SignerTable(signers)


def source_config(shards: Iterable[Any], options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The reader options among ``options``, plus the signer of any S3 shards and, unless
    ``ca_bundle`` is given, the CA bundle boto3 trusts for their endpoint (``ca_bundle`` of the
    S3 options, else ``AWS_CA_BUNDLE``): the Rust reader fetches the presigned URLs there."""
    shards = list(shards)
    config = split_options(options or {}).reader
    signer = reader_signer(shards)
    if signer is not None:
        config["signer"] = signer
        if "ca_bundle" not in config:
            bundles = {
                s.signer.s3.ca_bundle or os.environ.get("AWS_CA_BUNDLE")
                for s in shards
                if isinstance(s, Shard) and isinstance(s.signer, S3Signer)
            } - {None, ""}
            if len(bundles) == 1:
                config["ca_bundle"] = os.fspath(bundles.pop())
    return config


class _Resolver:
    """Resolves concrete (brace-expanded) URLs; one S3 client (the signer's) per ``expand_urls``
    call, so that credentials from the environment are read afresh each time but not once per
    shard."""

    def __init__(self, s3: S3Options, suffixes: tuple[str, ...] = SHARD_SUFFIXES) -> None:
        self.s3 = s3
        self.signer = S3Signer(s3)
        self.suffixes = suffixes
        self._hub: Any = None

    def client(self, where: str) -> Any:
        return self.signer.client(where)

    def resolve(self, url: str) -> tuple[list[Shard], bool]:
        """(shards, whether they were found by listing a directory, glob or prefix)."""
        scheme = scheme_of(url)
        if scheme in ("local", "file"):
            return _expand_local(url, self.suffixes)
        if scheme in REMOTE_SCHEMES:
            return [Shard(url)], False
        if scheme == "hf":
            # Every hf:// name is found in its folder's listing: proven without another call.
            listed = functools.partial(_is_shard_file, suffixes=self.suffixes)
            return self._hub_resolver().resolve(url, listed, glob_to_regex), True
        return self._expand_s3(url)

    def _hub_resolver(self) -> Any:
        if self._hub is None:
            from shardstream.hub import HubResolver

            self._hub = HubResolver()
        return self._hub

    def check(self, shard: Shard) -> None:
        if shard.display.startswith("s3://"):
            bucket, key = parse_s3_url(shard.display)
            _s3_call(shard.display, self.client(shard.display).head_object, Bucket=bucket, Key=key)
        elif scheme_of(shard.url) in ("local", "file"):
            _check_local(shard)

    def _expand_s3(self, url: str) -> tuple[list[Shard], bool]:
        bucket, key = parse_s3_url(url)
        client = self.client(url)
        listed = key == "" or key.endswith("/") or bool(_GLOB_CHARS.search(key))
        objects = _list_s3(client, url, bucket, key, self.suffixes) if listed else [(key, None)]
        shards = [Shard(f"s3://{bucket}/{k}", signer=self.signer, listed=stat) for k, stat in objects]
        return shards, listed


# -- S3 --------------------------------------------------------------------------------------------


def parse_s3_url(url: str) -> tuple[str, str]:
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise BadUrlError("bad_url", url, "", "an s3:// URL needs a bucket: s3://BUCKET/KEY")
    return bucket, key


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """``*`` and ``?`` stay within one ``/`` segment, ``**`` crosses segments, ``[...]`` as fnmatch."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            close = pattern.find("]", i + 1)
            if close < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : close]
                body = "^" + body[1:] if body.startswith("!") else body
                out.append(f"[{body}]")
                i = close
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _new_s3_client(s3: S3Options) -> Any:
    boto3 = require("boto3", "reading s3:// URLs")
    Config = require("botocore.config", "reading s3:// URLs").Config

    session = boto3.Session(profile_name=s3.profile) if s3.profile else boto3.Session()
    endpoint = s3.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = s3.region or session.region_name or "us-east-1"
    style = s3.addressing_style or ("path" if endpoint else "auto")
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": style},
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=10,
        read_timeout=30,
    )
    return session.client("s3", endpoint_url=endpoint, region_name=region, config=config, verify=s3.ca_bundle)


def _make_client(s3: S3Options, where: str) -> Any:
    require("boto3", "reading s3:// URLs")  # named first: boto3 is what users install
    BotoCoreError = require("botocore.exceptions", "reading s3:// URLs").BotoCoreError

    try:
        return _new_s3_client(s3)
    except BotoCoreError as e:
        raise _translate(e, where) from None


def _translate(error: Exception, where: str) -> SourceError:
    """botocore's exceptions -> ours, naming the s3:// URL (no secret is ever in it)."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
    )

    if isinstance(error, (NoCredentialsError, PartialCredentialsError, ProfileNotFound)):
        return CredentialsError(
            "unreadable",
            where,
            "",
            f"access denied: no usable AWS credentials ({type(error).__name__}: {error}); set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or an instance role",
        )
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        code = str(info.get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if status == 404 or code in ("404", "NoSuchBucket", "NoSuchKey", "NotFound"):
            what = "no such bucket" if code == "NoSuchBucket" else "no such bucket or key"
            return NotFoundError("unreadable", where, "", f"not found: {what} (HTTP {status or 404} {code})")
        if status in (401, 403) or code in (
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
            "InvalidToken",
            "403",
        ):
            return CredentialsError(
                "unreadable", where, "", f"access denied (HTTP {status} {code}): check the credentials"
            )
        return SourceError("unreadable", where, "", f"S3 error (HTTP {status} {code})")
    if isinstance(error, (EndpointConnectionError, ConnectTimeoutError)):
        return SourceError("unreadable", where, "", "cannot reach the S3 endpoint")
    return SourceError("unreadable", where, "", f"S3 error: {type(error).__name__}")


def _s3_call(where: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(*args, **kwargs)
    except (BotoCoreError, ClientError) as e:
        raise _translate(e, where) from None


def _list_s3(
    client: Any, url: str, bucket: str, key_pattern: str, suffixes: tuple[str, ...] = SHARD_SUFFIXES
) -> list[tuple[str, tuple[int, str] | None]]:
    """Keys under a prefix (``key_pattern`` ends with ``/``) or matching a glob, sorted, each with
    the (size, ETag) the listing gave (the content identity an index records, at no extra request)."""
    glob_at = _GLOB_CHARS.search(key_pattern)
    if glob_at:
        prefix = key_pattern[: glob_at.start()]
        regex = glob_to_regex(key_pattern)
        recursive = "**" in key_pattern or "/" in key_pattern[glob_at.start() :]
    else:
        prefix, regex, recursive = key_pattern, None, False
    params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    if not recursive:
        params["Delimiter"] = "/"
    keys: list[tuple[str, tuple[int, str] | None]] = []
    paginator = client.get_paginator("list_objects_v2")
    for page in _s3_call(url, lambda: list(paginator.paginate(**params))):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if regex.match(key) if regex else _is_shard_file(key, suffixes):
                etag, size = obj.get("ETag"), obj.get("Size")
                keys.append((key, (int(size), str(etag)) if etag and size is not None else None))
    if not keys:
        raise NotFoundError("unreadable", url, "", "not found: no matching objects under this prefix")
    return sorted(keys, key=lambda entry: entry[0])
