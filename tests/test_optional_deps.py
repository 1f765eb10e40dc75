"""A missing optional package is one line naming the pip extra that installs it: real processes in
which an import hook makes the package unimportable, as on a machine without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from corpus import good_shard

ROOT = Path(__file__).resolve().parents[1]

# Installed first in the child: any import of a blocked top-level package (or of its submodules)
# fails as it does when the package is not installed.
BLOCKER = """\
import sys

class _Blocked:
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

for _name in list(sys.modules):
    if _name.split(".")[0] in BLOCKED:
        del sys.modules[_name]
sys.meta_path.insert(0, _Blocked(BLOCKED))
"""


def run_without(blocked: list[str], code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    program = f"BLOCKED = {blocked!r}\n{BLOCKER}\n{textwrap.dedent(code)}"
    path = os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    env.update(HF_ENDPOINT="http://127.0.0.1:9", AWS_EC2_METADATA_DISABLED="true", HF_HUB_OFFLINE="0")
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )


@pytest.mark.parametrize(
    ("module", "argv", "extra", "needed_for"),
    [
        ("boto3", ["inspect", "s3://bucket/shard-000000.tar"], "s3", "reading s3:// URLs"),
        ("huggingface_hub", ["inspect", "hf://datasets/org/name/train/0.tar"], "hub", "reading hf:// URLs"),
        ("pyarrow", ["write", "table.parquet", "-o", "out/%06d.tar"], "parquet", "reading a Parquet table"),
    ],
)
def test_the_cli_says_which_extra_in_one_line(module, argv, extra, needed_for, tmp_path):
    (tmp_path / "table.parquet").write_bytes(b"PAR1")
    run = run_without(
        [module], f"from shardstream.cli import main\nraise SystemExit(main({argv!r}))", tmp_path
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr == (
        f"shardstream {argv[0]}: error: {needed_for} needs {module}: pip install 'shardstream[{extra}]'\n"
    )


def test_the_library_raises_a_missing_dependency_error_naming_the_extra(tmp_path):
    code = """
        import shardstream
        try:
            shardstream.read_samples("s3://bucket/shard-000000.tar")
        except shardstream.MissingDependencyError as e:
            assert isinstance(e, ImportError)
            print(e.module, e.extra, str(e), sep="|")
    """
    run = run_without(["boto3", "botocore"], code, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "boto3|s3|reading s3:// URLs needs boto3: pip install 'shardstream[s3]'\n"


def test_dataloader_workers_without_torch_name_the_torch_extra(tmp_path):
    """Without torch the loader still yields numpy batches; worker processes need torch."""
    shard = good_shard(str(tmp_path / "shard.tar"), count=4)
    code = f"""
        import shardstream
        loader = shardstream.ShardLoader({shard!r}, batch_size=2, image_size=16, threads=1)
        print(type(next(iter(loader)).images).__module__)
        try:
            loader.dataloader(2)
        except shardstream.MissingDependencyError as e:
            print(e)
    """
    run = run_without(["torch"], code, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == (
        "numpy\nDataLoader worker processes needs torch: pip install 'shardstream[torch]'\n"
    )


def test_every_extra_named_exists_in_pyproject():
    import tomllib
    from shardstream._deps import EXTRAS

    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert set(EXTRAS.values()) <= set(extras), set(EXTRAS.values()) - set(extras)
    everything = set(extras["all"])
    for name, requirements in extras.items():
        assert set(requirements) <= everything, f"the 'all' extra lacks some of '{name}'"
