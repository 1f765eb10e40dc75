"""The docs site in a real browser: built with ``mkdocs build --strict``, served on 127.0.0.1 and
opened in headless Chromium (Debian's; scripts/env.sh installs it), driven over the Chrome
DevTools protocol with the small client below. Checked: the navigation renders, the search index
loads and a query lists results, and an API reference page renders the code it documents.

The search runs in a web worker, after the page has loaded, so a one-shot ``--dump-dom`` may read
the page before the results exist; the client polls the live DOM instead, within a time limit."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docs_blocks import docs_hooks

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 300
BROWSER_START_TIMEOUT_S = 30
PAGE_TIMEOUT_S = 30


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no Chromium on PATH: scripts/env.sh installs Debian's chromium package")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "python"), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


class DevTools:
    """A minimal Chrome DevTools protocol client over one WebSocket (RFC 6455: masked text frames
    out, unmasked frames in): enough to navigate and evaluate JavaScript."""

    def __init__(self, ws_url: str) -> None:
        host_port, _, path = ws_url.removeprefix("ws://").partition("/")
        host, _, port = host_port.partition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=PAGE_TIMEOUT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self._sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            response += chunk
        if b" 101 " not in response.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"DevTools refused the WebSocket: {response[:200]!r}")
        self._buffer = response.split(b"\r\n\r\n", 1)[1]
        self._next_id = 0

    def close(self) -> None:
        self._sock.close()

    def _send(self, payload: bytes) -> None:
        header = bytearray([0x81])  # FIN, text frame
        if len(payload) < 126:
            header.append(0x80 | len(payload))
        elif len(payload) < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(payload))
        mask = os.urandom(4)
        self._sock.sendall(bytes(header) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _message(self) -> dict[str, Any]:
        payload = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack(">H", self._read(2))
            elif length == 127:
                (length,) = struct.unpack(">Q", self._read(8))
            payload += self._read(length)
            if first & 0x80:  # FIN: the message is complete
                return json.loads(payload)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        self._send(json.dumps({"id": self._next_id, "method": method, "params": params}).encode())
        while True:  # events arrive in between; the answer carries our id
            message = self._message()
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href === " + json.dumps(url))

    def wait_for(self, expression: str, timeout_s: float = PAGE_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {timeout_s} s: {expression}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",  # the tests may run as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    devtools = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + BROWSER_START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None, f"Chromium exited with status {process.returncode}"
            assert time.monotonic() < deadline, f"Chromium did not start in {BROWSER_START_TIMEOUT_S} s"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [t for t in json.load(answer) if t["type"] == "page"]
        devtools = DevTools(pages[0]["webSocketDebuggerUrl"])
        devtools.call("Page.enable")
        yield devtools
    finally:
        if devtools:
            devtools.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_navigation_renders(browser: DevTools, server: str) -> None:
    browser.open(server + "/")
    titles = browser.evaluate(
        "[...document.querySelectorAll('nav.md-nav--primary .md-nav__link')].map(a => a.textContent.trim())"
    )
    for title in ("Getting started", "Exact epochs", "Resume and elastic resume", "CLI", "Performance"):
        assert title in titles, titles
    # A link in the navigation leads to its page.
    browser.open(server + "/getting-started/")
    assert browser.evaluate("document.querySelector('h1').textContent").startswith("Getting started")
    assert browser.evaluate("document.querySelectorAll('.md-nav__link--active').length") >= 1


def test_search_finds_pages(browser: DevTools, server: str) -> None:
    browser.open(server + "/")
    # The search index is fetched by a web worker; typing before it is ready shows nothing, so
    # type, then wait for results.
    browser.evaluate(
        """(() => {
            const input = document.querySelector('.md-search__input');
            input.focus();
            input.value = 'elastic resume';
            input.dispatchEvent(new Event('input', {bubbles: true}));
            input.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true, key: 'e'}));
            return true;
        })()"""
    )
    count = browser.wait_for(
        "(() => { const input = document.querySelector('.md-search__input');"
        " input.dispatchEvent(new Event('input', {bubbles: true}));"
        " return document.querySelectorAll('.md-search-result__item').length; })()"
    )
    assert count > 0
    links = browser.evaluate(
        "[...document.querySelectorAll('.md-search-result__item a')].map(a => a.getAttribute('href'))"
    )
    assert any("guides/resume" in link for link in links), links


def test_api_reference_renders_code(browser: DevTools, server: str) -> None:
    """The generated reference (plain Markdown, scripts/gen_reference.py) renders as headings and
    highlighted signatures, with no directive left raw."""
    browser.open(server + "/reference/api-loader/")
    headings = browser.evaluate("[...document.querySelectorAll('h2')].map(h => h.textContent.trim())")
    assert any(h.startswith("ShardLoader") for h in headings), headings
    # The signature is rendered as highlighted Python code, with the loader's arguments and
    # their real default values.
    code = browser.evaluate(
        "[...document.querySelectorAll('.highlight code')].map(s => s.textContent).join('\\n')"
    )
    assert "batch_size" in code and "index" in code and "image_size: int = 224" in code, code[:500]
    text = browser.evaluate("document.querySelector('article').textContent")
    assert ":::" not in text and "--8<--" not in text
    # Inherited members are documented on the class that inherits them.
    browser.open(server + "/reference/api-text/")
    headings = browser.evaluate("[...document.querySelectorAll('h3')].map(h => h.textContent.trim())")
    for member in ("set_epoch", "state_dict", "dataloader", "batches_per_epoch"):
        assert any(h.startswith(f"TextLoader.{member}") for h in headings), (member, headings)


def test_getting_started_includes_the_readme_sections(browser: DevTools, server: str) -> None:
    """docs/hooks.py puts the README's install and quickstart into the page (GitHub shows links)."""
    browser.open(server + "/getting-started/")
    text = browser.evaluate("document.querySelector('article').textContent")
    assert "pip install '.[train,s3]'" in text and "shardstream index" in text, text[:1000]
    assert "include:" not in text


def test_generated_references_cover_the_code() -> None:
    """The CLI and configuration pages are generated from the code: every verb and option, and
    every configuration field, is on them."""
    import argparse
    import dataclasses
    import sys

    from shardstream.cli import build_parser
    from shardstream.train.config import SECTIONS

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_reference
    finally:
        sys.path.pop(0)
    cli = "\n".join(gen_reference.render_cli())
    (verbs,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in verbs.choices.items():
        assert f"## `shardstream {name}`" in cli
        for action in parser._actions:
            for flag in action.option_strings:
                assert f"`{flag}`" in cli, (name, flag)
    config = "\n".join(gen_reference.render_config())
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f"| `{section}.{f.name}` |" in config


def test_a_table_naming_a_missing_config_field_is_reported() -> None:
    hooks = docs_hooks()
    assert hooks.unknown_config_fields("| `--batch-size` | `train.batch_size` |\n") == []
    assert hooks.unknown_config_fields("| `--batch-size` | `train.batch_sise` |\n") == [
        "`train.batch_sise` is not a field of the trainer's configuration"
    ]
    # Prose is not checked, only table rows (where the flag table lives).
    assert hooks.unknown_config_fields("see `train.batch_sise`\n") == []
