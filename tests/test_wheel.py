"""The wheel users get from ``pip install shardstream``, checked the way they would use it.

The wheel is installed into a fresh virtual environment holding nothing but numpy, with no Rust
toolchain reachable (``~/.cargo/bin`` off PATH, no CARGO*/RUSTUP* variables, binary-only pip),
and a smoke job runs there on real shards cut from scikit-image/scikit-learn photos:
``read_samples``, ``ShardLoader`` (numpy batches, since torch is absent; streaming and with an
index), and the ``shardstream`` CLI. The wheel itself is checked for its abi3 tag, typing files,
metadata and (on Linux) the manylinux policy: only glibc-family libraries at run time. The one
abi3 wheel is also smoke-run on the oldest and newest CPython found (3.10, 3.13). Fast checks
of the build inputs sit at the end: one version (Cargo.toml), no CPU-specific code generation,
the release workflow parses, and _core.pyi matches what the extension exports.

Under pytest the wheel comes from target/wheels when one there is newer than every source file,
else ``maturin build --release`` makes one (it shares target/release with ``maturin develop
--release`` from scripts/env.sh, so it is usually a relink; the release workflow builds with
``--profile dist`` and ``--zig``). As a script, the release workflow's smoke jobs run the same
checks on the wheel they downloaded::

    python tests/test_wheel.py --wheel dist/shardstream-0.1.0-cp310-abi3-....whl

Every subprocess here has a timeout.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / "target" / "wheels"
STUB = ROOT / "python" / "shardstream" / "_core.pyi"

BUILD_TIMEOUT = 1800  # a cold release build on 2 busy cores takes minutes
VENV_TIMEOUT = 180
PIP_TIMEOUT = 600  # numpy may have to come from PyPI
SMOKE_TIMEOUT = 300
CLI_TIMEOUT = 120

SHARD_SAMPLES = 12  # three batches of 4
CORRUPT_KEY = "b0005"

# What a manylinux wheel may link against: the policy's whitelist (auditwheel enforces the
# exact one); everything else (libjpeg, libpng, libssl, libstdc++ ...) must be built in.
ALLOWED_ELF_NEEDED = {
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}


class WheelCheckError(AssertionError):
    """A check of the wheel failed; the message says which and shows the command output."""


def _run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> str:
    """Runs ``cmd`` to completion within ``timeout`` seconds; fails with its output otherwise."""
    try:
        proc = subprocess.run(
            [str(c) for c in cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        output = f"{e.stdout or ''}{e.stderr or ''}"
        raise WheelCheckError(
            f"timed out after {timeout:.0f}s: {' '.join(map(str, cmd))}\n{output}"
        ) from None
    if proc.returncode != 0:
        raise WheelCheckError(
            f"exit {proc.returncode}: {' '.join(map(str, cmd))}\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc.stdout


# -- versions and sources --------------------------------------------------------------------------


def cargo_version(root: Path = ROOT) -> str:
    """The one version: ``[package] version`` in Cargo.toml (maturin copies it into the wheel,
    the extension exports it as ``_core.__version__``)."""
    text = (root / "Cargo.toml").read_text(encoding="utf-8")
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', package, re.M)
    if not match:
        raise WheelCheckError("Cargo.toml has no [package] version")
    return match.group(1)


def source_files(root: Path = ROOT) -> list[Path]:
    """Everything that goes into the wheel: the Rust crate and the Python package."""
    files = [root / "Cargo.toml", root / "Cargo.lock", root / "pyproject.toml"]
    files += [p for p in (root / "rust").rglob("*") if p.is_file()]
    package = root / "python" / "shardstream"
    files += [
        p
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".so", ".pyd", ".pyc"))
    ]
    return [p for p in files if p.exists()]


def platform_wheels(directory: Path, version: str) -> list[Path]:
    """Wheels of this version in ``directory`` that install on this machine (OS and CPU)."""
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64" if sys.platform.startswith("linux") else "arm64"}.get(
        machine, machine
    )
    os_tag = {"linux": "linux", "darwin": "macosx", "win32": "win"}.get(sys.platform, sys.platform)
    found = []
    for wheel in directory.glob(f"shardstream-{version}-cp310-abi3-*.whl"):
        platform_tag = wheel.name[:-4].split("-")[-1]
        if os_tag in platform_tag and (arch in platform_tag or "universal2" in platform_tag):
            found.append(wheel)
    return sorted(found, key=lambda p: p.stat().st_mtime)


def reusable_wheel(version: str) -> Path | None:
    """The newest wheel in target/wheels, if it is newer than every source file."""
    wheels = platform_wheels(WHEEL_DIR, version)
    if not wheels:
        return None
    newest_source = max(p.stat().st_mtime for p in source_files())
    return wheels[-1] if wheels[-1].stat().st_mtime > newest_source else None


def build_wheel(attempts: int = 3) -> Path:
    """``maturin build --release`` into target/wheels; returns the wheel it made.

    maturin stages the library in target/maturin/, which a concurrent ``maturin develop`` in
    the same tree may replace under it ("failed to open file .../target/maturin/..."): that
    race, and only that, is retried (cargo's own lock makes the retry a quick relink)."""
    started = time.time()
    for attempt in range(1, attempts + 1):
        try:
            _run(
                [sys.executable, "-m", "maturin", "build", "--release", "--out", WHEEL_DIR],
                timeout=BUILD_TIMEOUT,
                cwd=ROOT,
            )
            break
        except WheelCheckError as e:
            if "target/maturin" not in str(e) or attempt == attempts:
                raise
    wheels = [w for w in platform_wheels(WHEEL_DIR, cargo_version()) if w.stat().st_mtime >= started - 1]
    if not wheels:
        raise WheelCheckError(f"maturin build finished but wrote no wheel for this platform to {WHEEL_DIR}")
    return wheels[-1]


# -- the wheel as a file ----------------------------------------------------------------------------


def wheel_metadata(wheel: Path) -> dict[str, Any]:
    """File names, METADATA fields and WHEEL tags of a wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        wheel_file = zf.read(f"{dist_info}/WHEEL").decode()
    fields: dict[str, list[str]] = {}
    for line in metadata.split("\n\n", 1)[0].splitlines():
        if ": " in line:
            key, value = line.split(": ", 1)
            fields.setdefault(key, []).append(value)
    tags = [line.split(": ", 1)[1] for line in wheel_file.splitlines() if line.startswith("Tag: ")]
    return {"names": names, "fields": fields, "tags": tags, "dist_info": dist_info}


def check_wheel_contents(wheel: Path, version: str) -> dict[str, Any]:
    """abi3 from CPython 3.10, the typing files and the trainer's configs shipped, one copy of the
    extension, the Cargo.toml version, numpy as the only hard dependency, and the optional extras
    declared."""
    info = wheel_metadata(wheel)
    names, fields = info["names"], info["fields"]
    assert wheel.name.startswith(f"shardstream-{version}-cp310-abi3-"), wheel.name
    assert all(t.startswith("cp310-abi3-") for t in info["tags"]), info["tags"]
    assert fields["Version"] == [version], fields.get("Version")
    assert fields.get("Requires-Python") == [">=3.10"], fields.get("Requires-Python")
    shipped = ("shardstream/train/configs/demo_cpu.yaml", "shardstream/train/configs/vit_b32.yaml")
    for required in ("shardstream/__init__.py", "shardstream/py.typed", "shardstream/_core.pyi", *shipped):
        assert required in names, f"{required} missing from {wheel.name}"
    extensions = [n for n in names if re.match(r"shardstream/_core\..*(so|pyd)$", n)]
    assert len(extensions) == 1, f"expected one extension module, found {extensions}"
    assert ".abi3." in extensions[0] or extensions[0].endswith(".pyd"), (
        f"not a stable-ABI module: {extensions[0]}"
    )
    assert all(n.startswith(("shardstream/", info["dist_info"] + "/")) for n in names), (
        f"files outside the package: {[n for n in names if not n.startswith('shardstream')]}"
    )
    hard = [r for r in fields.get("Requires-Dist", []) if "extra ==" not in r]
    assert [re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in hard] == ["numpy"], hard
    extras = set(fields.get("Provides-Extra", []))
    assert {"s3", "hub", "parquet", "torch", "train", "all"} <= extras, extras
    return {"files": len(names), "extension": extensions[0], "tags": info["tags"]}


def elf_needed(wheel: Path, member: str) -> list[str]:
    """DT_NEEDED entries of a shared object inside the wheel (pyelftools, auditwheel's dependency)."""
    import io

    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with zipfile.ZipFile(wheel) as zf:
        elf = ELFFile(io.BytesIO(zf.read(member)))
        needed = []
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                needed += [tag.needed for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
    return needed


def check_manylinux_policy(wheel: Path) -> dict[str, Any]:
    """``auditwheel show`` accepts the wheel for a manylinux tag and the extension needs no
    library outside the glibc family."""
    extension = next(n for n in wheel_metadata(wheel)["names"] if re.match(r"shardstream/_core\..*so$", n))
    needed = elf_needed(wheel, extension)
    extra = sorted(set(needed) - ALLOWED_ELF_NEEDED)
    assert not extra, f"{extension} needs system libraries outside the manylinux policy: {extra}"
    auditwheel = shutil.which("auditwheel") or str(Path(sys.executable).with_name("auditwheel"))
    report = " ".join(_run([auditwheel, "show", wheel], timeout=CLI_TIMEOUT).split())
    match = re.search(r'consistent with the following platform tag: "(manylinux_\d+_\d+_\w+)"', report)
    assert match, f"auditwheel does not accept {wheel.name}:\n{report}"
    assert "external shared libraries" not in report.replace("system-provided shared libraries", ""), report
    return {"auditwheel": match.group(1), "needed": needed}


# -- a fresh environment without Rust ------------------------------------------------------------------


def venv_bin(venv: Path) -> Path:
    return venv / ("Scripts" if sys.platform == "win32" else "bin")


def venv_python(venv: Path) -> Path:
    return venv_bin(venv) / ("python.exe" if sys.platform == "win32" else "python")


def toolchain_free_env(venv: Path) -> dict[str, str]:
    """The environment for everything run in the fresh venv: its bin first, no Rust toolchain,
    no cargo/rustup/maturin variables, and not the environment this test runs in."""
    drop = (
        "CARGO",
        "RUSTUP",
        "RUSTC",
        "RUSTFLAGS",
        "RUSTDOC",
        "MATURIN",
        "PYO3",
        "VIRTUAL_ENV",
        "PYTHON",
        "CONDA",
    )
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")).resolve()
    own_bin = Path(sys.prefix).resolve() / ("Scripts" if sys.platform == "win32" else "bin")

    def keep(entry: str) -> bool:
        p = Path(entry).expanduser().resolve()
        if p in (cargo_home / "bin", own_bin) or ".cargo" in p.parts or ".rustup" in p.parts:
            return False
        return True

    path = [str(venv_bin(venv))] + [e for e in os.environ.get("PATH", "").split(os.pathsep) if e and keep(e)]
    env["PATH"] = os.pathsep.join(path)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    for tool in ("cargo", "rustc", "rustup"):
        found = shutil.which(tool, path=env["PATH"])
        assert found is None, f"{tool} is still reachable at {found}: the smoke test must run without Rust"
    return env


def install_wheel(wheel: Path, venv: Path, python: str | None = None) -> dict[str, float]:
    """A new venv (of ``python``, default this interpreter) with only the wheel and its
    dependency (numpy), installed binary-only."""
    t0 = time.perf_counter()
    _run([python or sys.executable, "-m", "venv", venv], timeout=VENV_TIMEOUT)
    t1 = time.perf_counter()
    env = toolchain_free_env(venv)
    numpy = "numpy"
    if python is None:  # the numpy this interpreter has is in pip's cache: no download
        try:
            from importlib.metadata import version

            numpy = f"numpy=={version('numpy')}"
        except ImportError:
            pass
    # --only-binary: a source build (which would need Rust) is never attempted.
    _run(
        [venv_python(venv), "-m", "pip", "install", "--only-binary=:all:", numpy, wheel],
        timeout=PIP_TIMEOUT,
        env=env,
    )
    return {"venv_s": round(t1 - t0, 1), "pip_s": round(time.perf_counter() - t1, 1)}


# -- shards -----------------------------------------------------------------------------------------


def make_shards(directory: Path) -> dict[str, Any]:
    """good.tar: SHARD_SAMPLES real-photo samples; bad.tar: the same with one undecodable JPEG."""
    from corpus import corrupt_jpeg, good_samples, sample_members, tar_bytes, write_file

    directory.mkdir(parents=True, exist_ok=True)
    good = good_samples(SHARD_SAMPLES, seed=7, prefix="g")
    bad = good_samples(SHARD_SAMPLES, seed=8, prefix="b")
    bad = [(k, dict(s, jpg=corrupt_jpeg(s["jpg"])) if k == CORRUPT_KEY else s) for k, s in bad]
    paths = {}
    for name, samples in (("good", good), ("bad", bad)):
        members = [m for key, s in samples for m in sample_members(key, s)]
        paths[name] = write_file(str(directory / f"{name}.tar"), tar_bytes(members))
    return {"good": paths["good"], "bad": paths["bad"], "good_keys": [k for k, _ in good]}


# The smoke job, run by the fresh venv's interpreter in isolated mode (-I: no user site, no
# PYTHON* variables, not the current directory on sys.path). It prints one JSON line.
SMOKE_SCRIPT = r"""
import importlib.util, json, os, sys, time

good, bad, version, expected_keys = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
corrupt_key = sys.argv[5]

t0 = time.perf_counter()
import shardstream
import_s = time.perf_counter() - t0
eager = sorted(m for m in ("torch", "boto3", "botocore", "PIL", "yaml", "open_clip") if m in sys.modules)
assert not eager, f"import shardstream imported optional dependencies: {eager}"

import numpy as np
from shardstream import _core

here = os.path.dirname(os.path.abspath(shardstream.__file__))
assert here.startswith(os.path.abspath(sys.prefix)), f"shardstream imported from {here}, not the venv"
assert importlib.util.find_spec("torch") is None, "torch is installed in the fresh venv"
import shutil
reachable = [t for t in ("cargo", "rustc", "rustup") if shutil.which(t)]
assert not reachable, f"a Rust toolchain is reachable from the smoke job: {reachable}"
versions = (shardstream.__version__, _core.__version__, version)
assert len(set(versions)) == 1, versions
for name in ("py.typed", "_core.pyi"):
    assert os.path.exists(os.path.join(here, name)), f"{name} not installed"

# Raw samples, grouped as webdataset groups them.
samples = list(shardstream.read_samples(good))
assert [s["__key__"] for s in samples] == expected_keys, [s["__key__"] for s in samples]
for s in samples:
    assert {"__key__", "__url__", "jpg", "txt", "json"} <= set(s), sorted(s)
    assert isinstance(s["jpg"], bytes) and s["jpg"][:2] == b"\xff\xd8"
fmt, width, height = _core.probe_image(samples[0]["jpg"])
assert fmt == "jpeg" and width > 0 and height > 0, (fmt, width, height)

# Decoded batches: numpy without torch, every sample once, real pixels.
loader = shardstream.ShardLoader(good, batch_size=4, image_size=64, seed=0)
t0 = time.perf_counter()
batches = list(loader)
load_s = time.perf_counter() - t0
keys = [k for b in batches for k in b.keys]
assert sorted(keys) == sorted(expected_keys), keys
for b in batches:
    assert isinstance(b.images, np.ndarray), type(b.images)
    assert b.images.dtype == np.uint8 and b.images.shape == (4, 3, 64, 64), (b.images.dtype, b.images.shape)
    assert b.images.std() > 5, "blank images"
    assert all(isinstance(t, str) and t for t in b.texts)
by_key = {s["__key__"]: s["jpg"] for s in samples}
first = batches[0]
same = np.frombuffer(_core.decode_image(by_key[first.keys[0]], 64), dtype=np.uint8).reshape(3, 64, 64)
assert np.array_equal(same, first.images[0]), "decode_image differs from the loader's decode"

# Exact epochs with an index.
from shardstream.index import build_index
index = build_index(good)
exact = shardstream.ShardLoader(good, index=index, batch_size=4, image_size=64, seed=1)
assert len(exact) == len(expected_keys) // 4, len(exact)
exact_keys = [k for b in exact for k in b.keys]
assert sorted(exact_keys) == sorted(expected_keys), exact_keys

# A corrupt image is skipped with its reason, not fatal.
skipping = shardstream.ShardLoader(bad, batch_size=4, image_size=64, seed=0, drop_last=False)
bad_keys = [k for b in skipping for k in b.keys]
assert corrupt_key not in bad_keys and len(bad_keys) == len(expected_keys) - 1, bad_keys
stats = skipping.stats
assert stats.get("skipped_total") == 1, stats

print(json.dumps({
    "import_s": round(import_s, 4), "load_s": round(load_s, 3), "batches": len(batches),
    "package_dir": here, "numpy": np.__version__, "skipped": stats.get("skipped"),
}))
"""


def run_smoke(venv: Path, shards: dict[str, Any], version: str, workdir: Path) -> dict[str, Any]:
    script = workdir / "smoke_job.py"
    script.write_text(SMOKE_SCRIPT, encoding="utf-8")
    args = [shards["good"], shards["bad"], version, json.dumps(shards["good_keys"]), CORRUPT_KEY]
    out = _run(
        [venv_python(venv), "-I", script, *args],
        timeout=SMOKE_TIMEOUT,
        env=toolchain_free_env(venv),
        cwd=workdir,
    )
    return json.loads(out.strip().splitlines()[-1])


def cli_available(venv: Path, workdir: Path) -> str | None:
    """None when ``python -m shardstream validate --help`` works in the venv, else why not."""
    try:
        _run(
            [venv_python(venv), "-I", "-m", "shardstream", "validate", "--help"],
            timeout=CLI_TIMEOUT,
            env=toolchain_free_env(venv),
            cwd=workdir,
        )
    except WheelCheckError as e:
        return f"`python -m shardstream validate --help` does not work yet (the CLI is another task): {e}"
    return None


def run_cli(venv: Path, shards: dict[str, Any], version: str, workdir: Path) -> dict[str, Any]:
    """The console script: --version, and validate (exit 0 on a clean shard, 1 naming the
    corrupt sample on the other)."""
    env = toolchain_free_env(venv)
    exe = venv_bin(venv) / ("shardstream.exe" if sys.platform == "win32" else "shardstream")
    assert exe.exists(), f"console script {exe} not installed"
    shown = _run([exe, "--version"], timeout=CLI_TIMEOUT, env=env, cwd=workdir).strip()
    assert shown == f"shardstream {version}", shown
    _run([exe, "validate", shards["good"]], timeout=CLI_TIMEOUT, env=env, cwd=workdir)
    report_path = workdir / "bad-report.json"
    proc = subprocess.run(
        [str(exe), "validate", shards["bad"], "--json", str(report_path)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env,
        cwd=workdir,
        check=False,
    )
    assert proc.returncode == 1, (
        f"validate on a shard with a corrupt image exited {proc.returncode}:\n{proc.stderr}"
    )
    report = report_path.read_text(encoding="utf-8")
    assert CORRUPT_KEY in report, report[:2000]
    return {"version": shown, "validate_bad_exit": proc.returncode}


# -- the same checks as a script (release workflow smoke jobs) ---------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", required=True, help="the wheel to check (a glob is expanded)")
    parser.add_argument("--keep", help="work in this directory and keep it (default: a temporary one)")
    parser.add_argument("--python", help="interpreter of the fresh venv (default: this one)")
    args = parser.parse_args(argv)
    matches = sorted(Path().glob(args.wheel)) if any(c in args.wheel for c in "*?[") else [Path(args.wheel)]
    if len(matches) != 1 or not matches[0].exists():
        parser.error(f"--wheel must name exactly one existing wheel, got {matches}")
    wheel = matches[0].resolve()
    version = wheel.name.split("-")[1]  # the smoke jobs check out tests/ only: no Cargo.toml
    work = Path(args.keep or tempfile.mkdtemp(prefix="shardstream-wheel-"))
    summary: dict[str, Any] = {"wheel": wheel.name, "size_bytes": wheel.stat().st_size}
    summary["contents"] = check_wheel_contents(wheel, version)
    if sys.platform.startswith("linux"):
        summary["policy"] = check_manylinux_policy(wheel)
    shards = make_shards(work / "shards")
    summary["install"] = install_wheel(wheel, work / "venv", args.python)
    summary["smoke"] = run_smoke(work / "venv", shards, version, work)
    why_not = cli_available(work / "venv", work)
    summary["cli"] = {"skipped": why_not} if why_not else run_cli(work / "venv", shards, version, work)
    print(json.dumps(summary, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- pytest ----------------------------------------------------------------------------------------------

import pytest  # noqa: E402  (only the script mode above runs without pytest)


@pytest.fixture(scope="module")
def wheel() -> Path:
    version = cargo_version()
    path = reusable_wheel(version)
    return path if path is not None else build_wheel()


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_shards(tmp_path_factory.mktemp("wheel-shards"))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    install_wheel(wheel, venv)
    return venv


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + 60)
def test_wheel_is_abi3_with_typing_files_and_one_version(wheel: Path) -> None:
    check_wheel_contents(wheel, cargo_version())


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + 60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the manylinux policy is Linux's")
def test_wheel_needs_no_system_library_beyond_manylinux_policy(wheel: Path) -> None:
    result = check_manylinux_policy(wheel)
    assert result["auditwheel"].startswith("manylinux_2_")


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + PIP_TIMEOUT + SMOKE_TIMEOUT)
def test_bare_install_reads_and_loads_real_shards(
    installed: Path, shards: dict[str, Any], tmp_path: Path
) -> None:
    result = run_smoke(installed, shards, cargo_version(), tmp_path)
    assert result["batches"] == SHARD_SAMPLES // 4


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + PIP_TIMEOUT + 4 * CLI_TIMEOUT)
def test_bare_install_cli(installed: Path, shards: dict[str, Any], tmp_path: Path) -> None:
    why_not = cli_available(installed, tmp_path)
    if why_not:
        pytest.skip(why_not)
    run_cli(installed, shards, cargo_version(), tmp_path)


def find_interpreter(version: str) -> str | None:
    """A working CPython ``version`` (e.g. "3.10") on PATH or under pyenv, if there is one."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return exe
    return None


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + PIP_TIMEOUT + SMOKE_TIMEOUT)
@pytest.mark.parametrize("version", ["3.10", "3.13"])
def test_abi3_wheel_runs_on_oldest_and_newest_cpython(
    version: str, wheel: Path, shards: dict[str, Any], tmp_path: Path
) -> None:
    """One wheel for every CPython from 3.10: install and smoke-run it on 3.10 and 3.13."""
    if version == "{}.{}".format(*sys.version_info[:2]):
        pytest.skip(f"{version} is this interpreter: covered by the other smoke tests")
    exe = find_interpreter(version)
    if exe is None:
        pytest.skip(f"no CPython {version} on PATH or under ~/.pyenv")
    install_wheel(wheel, tmp_path / "venv", exe)
    result = run_smoke(tmp_path / "venv", shards, cargo_version(), tmp_path)
    assert result["batches"] == SHARD_SAMPLES // 4


# -- fast checks of what the wheel is built from -----------------------------------------------------------


def test_version_is_single_sourced_from_cargo_toml() -> None:
    import shardstream
    from shardstream import _core

    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^dynamic\s*=\s*\[[^\]]*"version"', project, re.M), (
        "pyproject must take the version from Cargo.toml"
    )
    assert not re.search(r"^version\s*=", project, re.M), "a second version in pyproject.toml"
    assert shardstream.__version__ == _core.__version__ == cargo_version()


def test_no_cpu_specific_code_generation() -> None:
    """SIMD is chosen at run time (libjpeg-turbo, fast_image_resize): a wheel built with
    target-cpu=native would crash with SIGILL on older CPUs than the build machine's."""
    configs = [
        ROOT / ".cargo" / "config.toml",
        ROOT / ".cargo" / "config",
        ROOT / "Cargo.toml",
        ROOT / "pyproject.toml",
    ]
    configs += list((ROOT / ".github" / "workflows").glob("*.y*ml"))
    for path in configs:
        if path.exists():
            # Comments may explain the rule; only settings count.
            text = "\n".join(line.split("#", 1)[0] for line in path.read_text(encoding="utf-8").splitlines())
            for flag in ("target-cpu", "target-feature", "target_feature"):
                assert flag not in text, f"{path.relative_to(ROOT)} sets {flag}"
    assert "target-cpu" not in os.environ.get("RUSTFLAGS", ""), "RUSTFLAGS sets target-cpu"


def test_release_workflow_is_valid_yaml() -> None:
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text(encoding="utf-8"))
    jobs = workflow["jobs"]
    assert {"linux", "macos", "windows", "sdist", "smoke"} <= set(jobs)
    builds = [
        step
        for job in ("linux", "macos", "windows")
        for step in jobs[job]["steps"]
        if "maturin-action" in step.get("uses", "")
    ]
    assert len(builds) == 3 and all("--profile dist" in step["with"]["args"] for step in builds)


# -- the stubs describe the extension exactly --------------------------------------------------------------


def _stub_tree() -> tuple[dict[str, ast.AST], set[str]]:
    """Top-level stub definitions, and the names that are typing helpers only (aliases, TypedDicts)."""
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    defs: dict[str, ast.AST] = {}
    helpers: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            defs[node.name] = node
            if any(isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases):
                helpers.add(node.name)
        elif isinstance(node, ast.FunctionDef):
            defs[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defs[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defs[target.id] = node
                    helpers.add(target.id)
    return defs, helpers


_NO_DEFAULT = object()


def _stub_params(fn: ast.FunctionDef) -> list[tuple[str, str, Any]]:
    """(name, positional|keyword, default) of a stub function, without self/cls."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [_NO_DEFAULT] * (len(positional) - len(args.defaults)) + [
        ast.literal_eval(d) for d in args.defaults
    ]
    params = [(a.arg, "positional", d) for a, d in zip(positional, defaults, strict=True)]
    params += [
        (a.arg, "keyword", _NO_DEFAULT if d is None else ast.literal_eval(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return [p for p in params if p[0] not in ("self", "cls")]


def _runtime_params(obj: Any) -> list[tuple[str, str, Any]] | None:
    """The same from PyO3's text signature; a default PyO3 cannot spell (an expression such as
    ``256 << 20``) shows as ``...`` and is not compared."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    kinds = {inspect.Parameter.KEYWORD_ONLY: "keyword"}
    return [
        (
            p.name,
            kinds.get(p.kind, "positional"),
            _NO_DEFAULT if p.default is inspect.Parameter.empty else p.default,
        )
        for p in sig.parameters.values()
        if p.name not in ("self", "cls")
    ]


def _same_params(stub: list[tuple[str, str, Any]], runtime: list[tuple[str, str, Any]] | None) -> bool:
    """Same names, kinds and (where PyO3 can spell them) defaults."""
    if runtime is None or len(stub) != len(runtime):
        return False
    for (name, kind, default), (rt_name, rt_kind, rt_default) in zip(stub, runtime, strict=True):
        if (name, kind) != (rt_name, rt_kind):
            return False
        if rt_default is not Ellipsis and (default is _NO_DEFAULT) != (rt_default is _NO_DEFAULT):
            return False
        if rt_default is not Ellipsis and rt_default is not _NO_DEFAULT and default != rt_default:
            return False
    return True


def _class_members(cls: type) -> set[str]:
    dunders = {"__new__", "__iter__", "__next__", "__len__"}
    return {n for n in vars(cls) if not n.startswith("_") or (n in dunders and n in vars(cls))}


def test_stubs_match_extension() -> None:
    from shardstream import _core

    defs, helpers = _stub_tree()
    runtime = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    assert runtime <= set(defs), (
        f"exported by _core but missing from _core.pyi: {sorted(runtime - set(defs))}"
    )
    stub_only = set(defs) - runtime - helpers
    assert not stub_only, f"in _core.pyi but not exported by _core: {sorted(stub_only)}"
    for name in sorted(runtime - {"__version__"}):
        obj, node = getattr(_core, name), defs[name]
        if isinstance(node, ast.FunctionDef):
            assert _same_params(_stub_params(node), _runtime_params(obj)), (
                f"signature of {name}: stub {_stub_params(node)} vs runtime {_runtime_params(obj)}"
            )
        elif isinstance(obj, type) and not issubclass(obj, BaseException):
            assert isinstance(node, ast.ClassDef), name
            members = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
            expected = _class_members(obj)
            # PyO3 classes without #[new] still have a (raising) __new__ from their base.
            if "__new__" not in members:
                expected.discard("__new__")
            assert expected == set(members), f"{name}: runtime {sorted(expected)} vs stub {sorted(members)}"
            for member, fn in members.items():
                attr = inspect.getattr_static(obj, member)
                target = obj if member == "__new__" else attr
                if isinstance(attr, (staticmethod, classmethod)):
                    target = attr.__func__
                if isinstance(attr, property) or type(attr).__name__ == "getset_descriptor":
                    continue
                runtime_params = _runtime_params(target)
                if runtime_params is not None and member not in ("__iter__", "__next__", "__len__"):
                    assert _same_params(_stub_params(fn), runtime_params), (
                        f"signature of {name}.{member}: stub {_stub_params(fn)} vs runtime {runtime_params}"
                    )
