"""Error lines to stderr, one ``write`` each.

``print(line, file=sys.stderr)`` writes the text and its newline in two calls; with an unbuffered
stderr (``PYTHONUNBUFFERED=1``, as launchers and CI set) that is two syscalls, and the ranks of a
torchrun job sharing one pipe interleave them into run-on lines. One call per line under
``PIPE_BUF`` bytes is atomic on a pipe.
"""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """Write ``line`` and its newline to stderr in one call, then flush."""
    stream = sys.stderr
    stream.write(line.rstrip("\n") + "\n")
    stream.flush()


__all__ = ["say"]
