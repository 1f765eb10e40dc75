"""What a user pays for `pip install shardstream` + `import shardstream`: wheel size and import time.

The wheel (default: the newest in target/wheels; build one with
`maturin build --profile dist --zig --compatibility manylinux2014`) is installed into a fresh
virtual environment with only numpy. Import time is the median over --runs fresh interpreters
(after one warm-up run, so the page cache is warm as on a second `import`), measured two ways:
inside the interpreter (just the import) and from outside (process start to exit).

Two environments:
  bare           the wheel + numpy, nothing else (what `pip install shardstream` gives)
  with torch     the same, plus this interpreter's site-packages (torch and the rest of the dev
                 requirements) appended through a .pth file: `import shardstream` still resolves
                 to the wheel's copy (the venv's own site-packages come first; checked), and torch
                 becomes importable, as in a training environment

For each, the modules that `import shardstream` pulls in eagerly (torch, boto3, PIL, ...) are
listed, and `-X importtime` shows how much of the time is numpy, torch and the extension. The
loader module is imported on first use of `shardstream.ShardLoader` (it brings numpy and, when
installed, torch): that extra time is shown separately.

    python benches/bench_import.py [--wheel PATH] [--runs 15] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "boto3", "botocore", "PIL", "yaml", "open_clip", "pyarrow", "tensorboard")
TIMEOUT = 300

PROBE = f"""
import sys, time
t = time.perf_counter()
import shardstream
import_s = time.perf_counter() - t
eager = sorted(m for m in {HEAVY!r} if m in sys.modules)
t = time.perf_counter()
shardstream.ShardLoader  # the loader module is imported on first use (it brings numpy, torch)
loader_s = time.perf_counter() - t
import json, os
print(json.dumps({{
    "import_s": import_s,
    "loader_s": loader_s,
    "file": os.path.abspath(shardstream.__file__),
    "prefix": os.path.abspath(sys.prefix),
    "eager": eager,
    "with_loader": sorted(m for m in {HEAVY!r} + ("numpy",) if m in sys.modules),
}}))
"""


def run(cmd: list[str], *, timeout: float = TIMEOUT, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def newest_wheel() -> Path:
    wheels = sorted((ROOT / "target" / "wheels").glob("shardstream-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise SystemExit(
            "no wheel in target/wheels: build one with "
            "`maturin build --profile dist --zig --compatibility manylinux2014` or pass --wheel"
        )
    return wheels[-1]


def venv_python(venv: Path) -> str:
    return str(venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python"))


def clean_env() -> dict[str, str]:
    """No PYTHON*/VIRTUAL_ENV leaking in from the calling environment."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


def make_venv(wheel: Path, venv: Path) -> None:
    run([sys.executable, "-m", "venv", str(venv)])
    try:
        from importlib.metadata import version

        numpy = f"numpy=={version('numpy')}"  # in pip's cache already: no download
    except ImportError:
        numpy = "numpy"
    run(
        [
            venv_python(venv),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--only-binary=:all:",
        ]
        + [numpy, str(wheel)],
        timeout=600,
        env=clean_env(),
    )


def site_packages(python: str) -> str:
    return run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()


def measure(python: str, runs: int) -> dict:
    """Median in-process import time and whole-process time over ``runs`` fresh interpreters."""
    env = clean_env()
    run([python, "-I", "-c", PROBE], env=env)  # warm-up: page cache, .pyc files
    inside, loader, outside, last = [], [], [], {}
    for _ in range(runs):
        t0 = time.perf_counter()
        last = json.loads(run([python, "-I", "-c", PROBE], env=env).strip().splitlines()[-1])
        outside.append(time.perf_counter() - t0)
        inside.append(last["import_s"])
        loader.append(last["loader_s"])
    if not last["file"].startswith(last["prefix"]):
        raise SystemExit(f"shardstream came from {last['file']}, not the venv {last['prefix']}")
    baseline = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run([python, "-I", "-c", "pass"], env=env)
        baseline.append(time.perf_counter() - t0)
    return {
        "import_s": statistics.median(inside),
        "loader_s": statistics.median(loader),
        "process_s": statistics.median(outside),
        "bare_interpreter_s": statistics.median(baseline),
        "eager": last["eager"],
        "with_loader": last["with_loader"],
        # A failed optional `import torch` is logged too: keep heavy modules only if loaded.
        "breakdown": {
            m: t for m, t in import_breakdown(python, env).items() if m not in HEAVY or m in last["eager"]
        },
    }


def import_breakdown(python: str, env: dict[str, str]) -> dict[str, float]:
    """Cumulative `-X importtime` (seconds) of shardstream and of what it pulls in that matters."""
    out = run([python, "-I", "-X", "importtime", "-c", "import shardstream"], env=env)
    wanted = ("shardstream", "shardstream._core", "numpy", *HEAVY)
    found: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| *(\S+)$", line)
        if m and m.group(2) in wanted:
            found[m.group(2)] = max(found.get(m.group(2), 0.0), int(m.group(1)) / 1e6)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="default: the newest wheel in target/wheels")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    wheel = (args.wheel or newest_wheel()).resolve()

    with zipfile.ZipFile(wheel) as zf:
        ext = next(i for i in zf.infolist() if re.match(r"shardstream/_core\..*(so|pyd)$", i.filename))
        unpacked = sum(i.file_size for i in zf.infolist())
    results: dict = {
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
        "extension_bytes": ext.file_size,
        "installed_bytes": unpacked,
    }
    print(f"wheel      {wheel.name}")
    print(
        f"size       {wheel.stat().st_size / 1e6:.2f} MB download, {unpacked / 1e6:.2f} MB installed "
        f"(extension {ext.file_size / 1e6:.2f} MB)"
    )

    work = Path(tempfile.mkdtemp(prefix="shardstream-import-"))
    try:
        venv = work / "venv"
        make_venv(wheel, venv)
        python = venv_python(venv)
        results["bare"] = measure(python, args.runs)

        torch_site = sysconfig.get_paths()["purelib"]
        try:
            import torch  # noqa: F401  (only to know whether the torch variant can run)

            has_torch = True
        except ImportError:
            has_torch = False
        if has_torch:
            pth = Path(site_packages(python)) / "zz_dev_site_packages.pth"
            pth.write_text(torch_site + "\n", encoding="utf-8")
            results["with_torch"] = measure(python, args.runs)
            pth.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nmedian of {args.runs} fresh interpreters (warm page cache):")
    print(
        f"{'environment':<12} {'import shardstream':>19} {'process':>9} {'python -c pass':>15} "
        f"{'+ .ShardLoader':>15}  heavy modules after import / after ShardLoader"
    )
    for name in ("bare", "with_torch"):
        r = results.get(name)
        if r is None:
            print(f"{name:<12} (torch not installed in this interpreter: skipped)")
            continue
        eager = ", ".join(r["eager"]) or "none"
        later = ", ".join(r["with_loader"]) or "none"
        print(
            f"{name:<12} {r['import_s'] * 1e3:>17.0f}ms {r['process_s'] * 1e3:>7.0f}ms "
            f"{r['bare_interpreter_s'] * 1e3:>13.0f}ms {r['loader_s'] * 1e3:>13.0f}ms  {eager} / {later}"
        )
        parts = ", ".join(f"{m} {t * 1e3:.0f}ms" for m, t in r["breakdown"].items())
        print(f"{'':<12} -X importtime of `import shardstream` (cumulative): {parts}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
