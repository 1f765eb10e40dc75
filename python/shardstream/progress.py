"""One-line progress (count, rate, ETA) for long CLI runs: drawn only on an interactive terminal,
silent in pipes, log files and CI so that captured output stays clean."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO


def progress_wanted(stream: TextIO) -> bool:
    """A terminal, not CI, not a dumb terminal, and not switched off by SHARDSTREAM_NO_PROGRESS."""
    if os.environ.get("CI") or os.environ.get("SHARDSTREAM_NO_PROGRESS"):
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Progress:
    """Counts units of work (shards, samples) toward an optional total, plus samples and bytes,
    and redraws one status line at most every ``interval`` seconds. Thread-safe: worker
    callbacks may call ``advance`` concurrently."""

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        unit: str = "shards",
        items: str = "samples",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval: float = 0.2,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        # What ``advance(samples=...)`` counts inside the units (samples of shards, row groups of files).
        self.items = items
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_wanted(self.stream) if enabled is None else enabled
        self.interval = interval
        self.done = 0
        self.samples = 0
        self.bytes = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._lock = threading.Lock()
        self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, units: int = 1, *, samples: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.done += units
            self.samples += samples
            self.bytes += nbytes
            if self.enabled:
                now = time.monotonic()
                if now - self._last_draw >= self.interval or (self.total and self.done >= self.total):
                    self._last_draw = now
                    self._draw(now)

    def line(self, now: float | None = None) -> str:
        """The status text (also used by tests, which have no terminal)."""
        elapsed = max(1e-9, (now if now is not None else time.monotonic()) - self._start)
        parts = [self.label]
        parts.append(f"{self.done}/{self.total} {self.unit}" if self.total else f"{self.done} {self.unit}")
        if self.samples:
            parts.append(f"{self.samples:,} {self.items} ({self.samples / elapsed:,.0f}/s)")
        if self.bytes:
            parts.append(f"{human_bytes(self.bytes)} ({human_bytes(self.bytes / elapsed)}/s)")
        if self.total and 0 < self.done < self.total:
            remaining = elapsed * (self.total - self.done) / self.done
            parts.append(f"ETA {human_duration(remaining)}")
        return "  ".join(parts)

    def _draw(self, now: float) -> None:
        # \r returns to the line start and ESC[K clears what a longer previous line left behind.
        self.stream.write("\r" + self.line(now) + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        with self._lock:
            if self.enabled and self._drawn:
                self._draw(time.monotonic())
                self.stream.write("\n")
                self.stream.flush()
                self._drawn = False
