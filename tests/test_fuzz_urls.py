"""Fuzzing the URL spec parsing (issue 15): seeded random mutations of real specs through
brace_expand, split_parts, scheme_of, redact and expand_urls. hypothesis is not in the dev
environment, so this is a plain seeded loop; SHARDSTREAM_FUZZ_CASES sets the cases (default
10000, the CI budget), SHARDSTREAM_FUZZ_SEED the seed.

Properties: every input ends in a list of strings or a ShardError (BadUrlError, ...), never
another exception; brace expansion is deterministic, and the expansion of a spec with no
braces is the spec itself.
"""

from __future__ import annotations

import os
import random
import re
import time

from shardstream.errors import BadUrlError, ShardError
from shardstream.urls import brace_expand, expand_urls, redact, scheme_of, split_parts

CASES = int(os.environ.get("SHARDSTREAM_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("SHARDSTREAM_FUZZ_SEED", "15"))

SEEDS = [
    "shards/train-{000000..000099}.tar",
    "s3://bucket/data/{train,val}/part-{00..15}.tar.gz",
    "https://host.example/ds/{a..f}{0..3..2}.tar?X-Amz-Signature=secret&X-Amz-Credential=k",
    "/data/a/{0..3}.tar::/data/b/{x,y{1..2}}.tar",
    "s-{8..11}.tar::s-{3..1}.tar::x{}y{z}.tar",
    "{a,b{1..2}}.tar",
    "pipe:curl -s https://host/{0..9}.tar",
    "file:///data/{000..010}.tar",
    "http://user:pass@host:8080/p/{-3..3}.tar",
]
ALPHABET = "{}.,:/?&=-_09az*[]\\%~ \t\n\x00é"


def mutate(rng: random.Random, spec: str) -> str:
    s = list(spec)
    for _ in range(rng.randint(1, 5)):
        op = rng.randrange(6)
        pos = rng.randint(0, len(s))
        if op == 0 and s:  # replace a character
            s[min(pos, len(s) - 1)] = rng.choice(ALPHABET)
        elif op == 1:  # insert
            s.insert(pos, rng.choice(ALPHABET))
        elif op == 2 and s:  # delete a run
            del s[pos : pos + rng.randint(1, 4)]
        elif op == 3:  # truncate
            s = s[:pos]
        elif op == 4 and s:  # splice a piece of itself or another seed
            other = rng.choice(SEEDS) if rng.random() < 0.5 else "".join(s)
            a = rng.randrange(len(other))
            s[pos:pos] = list(other[a : a + rng.randint(1, 12)])
        elif op == 5:  # a nested or hostile brace
            s[pos:pos] = list(rng.choice(["{", "}", "{,}", "{0..2}", "{9..0..3}", "{a..", "..", "{{{"]))
    return "".join(s)


_RANGES = re.compile(r"\{(-?\d+)\.\.(-?\d+)")


def expansion_bound(spec: str) -> int:
    """An upper bound of how many names ranges can produce: brace_expand materialises the
    whole product (up to MAX_EXPANSION), so the loop keeps to specs that name at most 10^5
    shards to stay fast."""
    bound = 1
    for a, b in _RANGES.findall(spec):
        bound *= abs(int(b) - int(a)) + 1
    return bound * max(1, spec.count(",") + 1)


def check_one(spec: str) -> None:
    try:
        parts = split_parts(spec)
    except ShardError:
        return
    assert isinstance(parts, list) and all(isinstance(p, str) for p in parts)
    for part in parts:
        assert isinstance(redact(part), str)
        try:
            scheme_of(part)
        except ShardError:
            pass
        try:
            names = brace_expand(part)
        except ShardError:
            continue
        assert isinstance(names, list) and names and all(isinstance(n, str) for n in names)
        assert brace_expand(part) == names
        if "{" not in part:
            assert names == [part]
    # The whole resolver on remote specs only (no file system walk, no network with check=none;
    # glob characters in a remote spec would list the bucket, so they are left out).
    if spec.startswith(("http://", "https://")) and not re.search(r"[*?\[]", spec.split("?")[0]):
        try:
            shards = expand_urls(spec, check="none")
        except (ShardError, ValueError, TypeError):
            return
        assert all(isinstance(s.url, str) for s in shards)


def test_fuzz_url_specs_never_raise_anything_but_shard_errors():
    rng = random.Random(SEED)
    start = time.perf_counter()
    done = skipped = 0
    for i in range(CASES):
        spec = mutate(rng, rng.choice(SEEDS))
        if expansion_bound(spec) > 100_000:
            skipped += 1
            continue
        try:
            check_one(spec)
        except Exception as e:  # the property: name the input that broke it
            raise AssertionError(f"case {i} (seed {SEED}): {spec!r} raised {type(e).__name__}: {e}") from e
        done += 1
    took = time.perf_counter() - start
    rate = done / max(took, 1e-9)
    print(f"fuzz urls: {done} cases in {took:.2f} s, {rate:.0f} cases/s, {skipped} over the bound skipped")
    assert done > CASES // 2


def test_huge_brace_ranges_are_refused_not_materialised():
    # Found by the loop's length mutations: a range of 10^11 names was built in memory.
    for spec in ["s-{0..99999999999}.tar", "{0..99999}{0..99999}.tar", "{0..9999999999..1}"]:
        start = time.perf_counter()
        try:
            brace_expand(spec)
        except BadUrlError as e:
            assert "more than" in str(e)
        else:
            raise AssertionError(f"{spec!r} expanded")
        assert time.perf_counter() - start < 5


def test_regressions():
    # Inputs the loop found or that sit on an edge; each must end in a list or a ShardError.
    for spec in [
        "{",
        "}",
        "{{}",
        "{,}",
        "{..}",
        "{0..}",
        "{-0..-0}",
        "{a..é}",
        "{0..2..0}",
        "::",
        "{::}",
        "s3://",
    ]:
        check_one(spec)
