"""``hf://`` URLs: WebDataset shards in a dataset repository of the Hugging Face Hub.

Form: ``hf://datasets/{org}/{name}[@{revision}]/{path}``; ``path`` may be a file, a folder
(ending in ``/``: its shard files) or a glob (``*`` within one folder, ``**`` across folders),
after brace expansion as for every URL. The revision (a branch, tag or commit; ``main`` when
omitted) is resolved once to its commit sha, and every shard is named at that commit:
``hf://datasets/{org}/{name}@{sha}/{path}``. An index built from such shards records the sha,
so a loader over that index reads the bytes it was built from even after the branch moved.

Costs: one revision call per repository and revision, and one tree listing (plus one call per
1,000 entries, the Hub's page size) per folder named by the spec, never one call per file.

Reading goes through the Rust HTTP reader: :class:`HfSigner` turns each ``hf://`` shard into the
resolve URL ``{endpoint}/datasets/{repo}/resolve/{sha}/{path}`` plus ``Authorization: Bearer``
when a token is at hand (``HF_TOKEN``, else the file ``huggingface-cli login`` writes, through
``huggingface_hub.get_token``). The reader drops that header on every redirect, so the storage
host a resolve redirects to never sees the token. ``HF_ENDPOINT`` (a mirror, a test server) is
read when a signer or listing is made.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from shardstream._deps import require
from shardstream.errors import BadUrlError, CredentialsError, NotFoundError, SourceError

HF_SCHEME = "hf://"
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
_FORM = "hf://datasets/{org}/{name}[@{revision}]/{path}"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class HfPath:
    """One parsed ``hf://`` URL."""

    repo: str  # "{org}/{name}"
    revision: str | None
    path: str  # inside the repository, no leading "/"

    def url(self, revision: str | None = None) -> str:
        rev = revision or self.revision
        return f"{HF_SCHEME}datasets/{self.repo}{'@' + rev if rev else ''}/{self.path}"


def parse_hf_url(url: str) -> HfPath:
    """The parts of ``hf://datasets/{org}/{name}[@{revision}]/{path}``; BadUrlError otherwise."""

    def bad(why: str) -> BadUrlError:
        return BadUrlError("bad_url", url, "", f"{why}; the form is {_FORM}")

    if not url.startswith(HF_SCHEME):
        raise bad("not an hf:// URL")
    kind, _, rest = url[len(HF_SCHEME) :].partition("/")
    if kind != "datasets":
        raise bad(f"only dataset repositories are supported, not {kind!r}")
    org, _, rest = rest.partition("/")
    name_rev, _, path = rest.partition("/")
    name, at, revision = name_rev.partition("@")
    if not _NAME.fullmatch(org) or not _NAME.fullmatch(name):
        raise bad("it needs an organisation and a dataset name")
    if at and not _REVISION.fullmatch(revision):
        raise bad(f"bad revision {revision!r} (a branch, tag or commit sha without '/')")
    if path.startswith("/") or "/../" in f"/{path}/":
        raise bad("bad path inside the repository")
    return HfPath(f"{org}/{name}", revision if at else None, path)


def endpoint() -> str:
    """The Hub to talk to: ``HF_ENDPOINT`` (a mirror, a test server), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hf_token() -> str | None:
    """``HF_TOKEN``, else the token file of ``huggingface-cli login`` (None: anonymous)."""
    return require("huggingface_hub", "reading hf:// URLs").get_token()


def resolve_url(hub: str, parsed: HfPath) -> str:
    if not parsed.revision:
        raise BadUrlError("bad_url", parsed.url(), "", "an hf:// shard must be pinned to a revision")
    return f"{hub}/datasets/{parsed.repo}/resolve/{quote(parsed.revision, safe='')}/{quote(parsed.path)}"


class HfSigner:
    """What the Rust reader calls when it opens an ``hf://`` shard: the resolve URL, with the
    bearer token as a header (never in the URL, never printed). The token is read on first use
    in each process and never pickled, so a signer travels to DataLoader workers."""

    def __init__(self, hub: str | None = None) -> None:
        self.hub = hub or endpoint()
        self._token: str | None = None
        self._loaded_pid = -1
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"hub": self.hub}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["hub"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HfSigner) and other.hub == self.hub

    def __hash__(self) -> int:
        return hash(self.hub)

    def __repr__(self) -> str:
        return f"HfSigner({self.hub!r})"

    def token(self) -> str | None:
        with self._lock:
            if self._loaded_pid != os.getpid():
                self._token, self._loaded_pid = hf_token(), os.getpid()
            return self._token

    def headers(self) -> dict[str, str]:
        token = self.token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def __call__(self, url: str) -> str | tuple[str, list[tuple[str, str]]]:
        target = resolve_url(self.hub, parse_hf_url(url))
        headers = self.headers()
        return (target, list(headers.items())) if headers else target


def _translate(error: Exception, where: str) -> SourceError:
    """huggingface_hub's errors -> ours, naming the hf:// URL (never a token)."""
    response = getattr(error, "response", None)
    status = int(getattr(response, "status_code", 0) or 0)
    name = type(error).__name__
    if status in (401, 403) or name == "GatedRepoError":
        return CredentialsError(
            "unreadable",
            where,
            "",
            f"access denied (HTTP {status or 401}): the repository is gated or private; set HF_TOKEN "
            "or run `hf auth login` with an account that has access",
        )
    if status == 404 or name in ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError"):
        return NotFoundError("unreadable", where, "", f"not found on the Hub (HTTP {status or 404}, {name})")
    if status:
        return SourceError("unreadable", where, "", f"Hub error (HTTP {status}, {name})")
    return SourceError("unreadable", where, "", f"cannot reach the Hub at {endpoint()} ({name})")


def _is_hub_error(error: Exception) -> bool:
    """An HTTP or transport failure of huggingface_hub (its HTTP client's errors included)."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, (HfHubHTTPError, OSError)):
        return True
    return type(error).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests")


class HubResolver:
    """Resolves ``hf://`` URLs for one ``expand_urls`` call: each (repository, revision) once to
    its commit, each folder listed once however many names of it the spec holds."""

    def __init__(self) -> None:
        self.signer = HfSigner()
        self._api: Any = None
        self._commits: dict[tuple[str, str], str] = {}
        self._folders: dict[tuple[str, str, str, bool], dict[str, tuple[int, str]]] = {}

    def api(self) -> Any:
        if self._api is None:
            HfApi = require("huggingface_hub", "reading hf:// URLs").HfApi
            self._api = HfApi(endpoint=self.signer.hub, token=self.signer.token() or False)
        return self._api

    def _call(self, where: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if _is_hub_error(e):
                raise _translate(e, where) from None
            raise

    def commit(self, where: str, repo: str, revision: str) -> str:
        key = (repo, revision)
        if key not in self._commits:
            info = self._call(where, self.api().dataset_info, repo, revision=revision)
            self._commits[key] = str(info.sha)
        return self._commits[key]

    def folder(
        self, where: str, repo: str, sha: str, folder: str, recursive: bool
    ) -> dict[str, tuple[int, str]]:
        """path -> (size, blob id) of the files in ``folder`` at ``sha``."""
        key = (repo, sha, folder, recursive)
        if key not in self._folders:

            def listing() -> dict[str, tuple[int, str]]:
                entries = self.api().list_repo_tree(
                    repo, path_in_repo=folder or None, recursive=recursive, revision=sha, repo_type="dataset"
                )
                out = {}
                for entry in entries:
                    if hasattr(entry, "size"):  # a RepoFile, not a RepoFolder
                        oid = entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
                        out[entry.path] = (int(entry.size), str(oid))
                return out

            self._folders[key] = self._call(where, listing)
        return self._folders[key]

    def resolve(self, url: str, is_shard_file: Any, glob_to_regex: Any) -> list[Any]:
        from shardstream.urls import Shard

        parsed = parse_hf_url(url)
        sha = self.commit(url, parsed.repo, parsed.revision or DEFAULT_REVISION)
        path = parsed.path
        glob_at = _GLOB_CHARS.search(path)
        if glob_at:
            folder = path[: glob_at.start()].rpartition("/")[0]
            regex = glob_to_regex(path)
            recursive = "**" in path or "/" in path[glob_at.start() :]
            files = self.folder(url, parsed.repo, sha, folder, recursive)
            chosen = sorted(p for p in files if regex.match(p))
        elif path == "" or path.endswith("/"):
            files = self.folder(url, parsed.repo, sha, path.rstrip("/"), False)
            chosen = sorted(p for p in files if is_shard_file(p))
        else:
            files = self.folder(url, parsed.repo, sha, path.rpartition("/")[0], False)
            chosen = [path] if path in files else []
        if not chosen:
            raise NotFoundError("unreadable", url, "", f"not found: no matching file at commit {sha}")
        return [Shard(HfPath(parsed.repo, sha, p).url(), signer=self.signer, listed=files[p]) for p in chosen]


def unpinned(name: str) -> str:
    """``name`` without its revision when it is an ``hf://`` URL: how a loader's shards (listed
    at the branch's commit today) are matched with an index's (named at the commit it was built
    from)."""
    if not name.startswith(HF_SCHEME):
        return name
    try:
        parsed = parse_hf_url(name)
        return HfPath(parsed.repo, None, parsed.path).url()
    except BadUrlError:
        return name


def at_index_commit(index_name: str, shard: Any) -> Any:
    """The loader's ``shard`` for the index entry ``index_name``: an ``hf://`` shard is read at
    the index's commit, whatever commit the loader's spec resolves to today."""
    from shardstream.urls import Shard

    if not index_name.startswith(HF_SCHEME) or shard.url == index_name:
        return shard
    return Shard(index_name, signer=shard.signer)


def hf_identity(listed: tuple[int, str] | None) -> tuple[int | None, str | None]:
    """An ``hf://`` shard's (size, identity) from its listing. Named at a commit, its bytes
    cannot change; the blob id (git oid, or the LFS sha256) says which file it is. Not an
    ``etag:`` identity: the storage host a resolve redirects to has ETags of its own."""
    if listed is None:
        return None, None
    size, oid = listed
    return size, f"size:{size},hf-oid:{oid}"
