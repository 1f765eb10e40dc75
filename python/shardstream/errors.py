"""The exceptions shardstream raises: one small hierarchy rooted at :class:`ShardError`.

Every exception carries ``reason`` (a stable name, e.g. ``"unreadable"``, ``"truncated_tar"``),
``url`` (always redacted: presigned signatures never appear) and ``key`` (empty for shard-level
faults), and says all three in its message.

::

    ShardError
    ├── SourceError            the bytes could not be fetched
    │   ├── CredentialsError   missing, wrong or expired credentials (401/403)
    │   └── NotFoundError      no such file, bucket or object
    ├── BadUrlError            (also a ValueError) a URL we refuse: pipe:, unknown scheme
    └── SampleError            one sample is invalid (corrupt image, missing caption, ...)

    OptionError                (a ValueError, not a ShardError) an option value we refuse;
                               ``option`` names it
    MissingDependencyError     (an ImportError) an optional package is not installed; the
                               one-line message names the pip extra that installs it

    UnreadableUnitsWarning     (a UserWarning) count_tokens or count_patches could not read some
                               units: they are left out of every epoch
"""

from __future__ import annotations

from typing import Any


class ShardError(Exception):
    """A shard or sample could not be read; the root of shardstream's data errors. Catch a
    subclass to handle one kind; the message says reason, URL and key.

    Args:
        reason: A stable name of what went wrong (``"unreadable"``, ``"truncated_tar"``,
            ``"corrupt_image"``, ...): match on this or on the class, never on the message.
        url: The shard's URL, redacted (no query string, no password).
        key: The sample's key; empty for a shard-level fault.
        detail: Human-readable detail.
    """

    def __init__(self, reason: str, url: str = "", key: str = "", detail: str = "") -> None:
        self.reason = reason
        self.url = url
        self.key = key
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        where = f" in {self.url}" if self.url else ""
        key = f" (key {self.key!r})" if self.key else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.reason}{where}{key}{detail}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keeps the attributes when the error crosses a DataLoader worker process boundary.
        return (type(self), (self.reason, self.url, self.key, self.detail))


class SourceError(ShardError):
    """The shard's bytes could not be fetched (after the retry budget, where retrying helps)."""


class CredentialsError(SourceError):
    """Missing, wrong or expired credentials, or access denied."""


class NotFoundError(SourceError):
    """No such file, bucket or object."""


class BadUrlError(ShardError, ValueError):
    """A URL that shardstream refuses to open (``pipe:``, an unknown scheme, a malformed spec)."""


class SampleError(ShardError):
    """One sample is invalid; ``key`` names it."""


class OptionError(ValueError):
    """An option given a value shardstream refuses (:class:`shardstream.SourceOptions`,
    :class:`shardstream.LoaderConfig`). A ``ValueError``, so code written against the older
    plain ``ValueError`` still catches it.

    Attributes:
        option: The name of the option, as the caller spelled it (e.g. ``"backoff_max"``).

    Args:
        option: Sets ``option``.
        message: What is wrong with the value; the message is ``"{option}: {message}"``.
    """

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.option, str(self).removeprefix(f"{self.option}: ")))


class MissingDependencyError(ImportError):
    """An optional package that a feature needs is not installed (boto3 for ``s3://``,
    huggingface_hub for ``hf://``, torch for DataLoader workers, pyarrow for Parquet tables...).
    Its message is one line that names the pip extra to install, e.g.
    ``reading s3:// URLs needs boto3: pip install 'shardstream[s3]'``.

    Attributes:
        module: The module that could not be imported (e.g. ``"boto3"``).
        extra: The ``shardstream`` extra that installs it (e.g. ``"s3"``).

    Args:
        module: Sets ``module``.
        extra: Sets ``extra``.
        needed_for: What needs it, for the message (e.g. ``"reading s3:// URLs"``).
        cause: The original ImportError's message, shown when it is not plain "no module".
    """

    def __init__(self, module: str, extra: str, needed_for: str, cause: str = "") -> None:
        self.module = module
        self.extra = extra
        self.needed_for = needed_for
        self.cause = cause
        why = f" ({cause})" if cause and module not in cause else ""
        super().__init__(f"{needed_for} needs {module}{why}: pip install 'shardstream[{extra}]'", name=module)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.module, self.extra, self.needed_for, self.cause))


class UnreadableUnitsWarning(UserWarning):
    """:func:`~shardstream.count_tokens` or :func:`~shardstream.count_patches` could not read some
    units (a file unreadable, a corrupt Parquet footer or stream, a missing column): the counts
    leave them out, so no epoch reads their documents or samples. The message names each unit
    (URL redacted) with its reason, after a one-line summary; ``on_error="raise"`` raises a
    :class:`ShardError` instead. Turn it into an error with
    ``warnings.simplefilter("error", shardstream.UnreadableUnitsWarning)``.

    Attributes:
        failed: The units that failed, as the counts' ``failed`` list holds them (``url``,
            ``display``, ``error``).

    Args:
        message: The warning's text.
        failed: Sets ``failed``.
    """

    def __init__(self, message: str, failed: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.failed = list(failed or [])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed))


# The one table from the core's kind of source failure (``error::SourceKind``) to the class
# raised; the message's wording never decides.
_SOURCE_CLASSES: dict[str, type[ShardError]] = {
    "not_found": NotFoundError,
    "credentials": CredentialsError,
    "bad_url": BadUrlError,
    "other": SourceError,
}


def source_error_class(kind: str) -> type[ShardError]:
    """The class raised for a shard that could not be read, by the core's kind of source failure
    (an unknown kind is a plain :class:`SourceError`)."""
    return _SOURCE_CLASSES.get(kind, SourceError)


def from_core_fault(fault: BaseException) -> ShardError:
    """Turns the extension's ``CoreFault`` (args: reason, url, key, detail, source kind) into our
    hierarchy."""
    args = tuple(getattr(fault, "args", ())) + ("", "", "", "", "")
    reason, url, key, detail, kind = (str(a) for a in args[:5])
    if reason == "unreadable":
        return source_error_class(kind)(reason, url, key, detail)
    if key:
        return SampleError(reason, url, key, detail)
    return ShardError(reason, url, key, detail)
