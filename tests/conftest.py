"""Fixtures that several test modules share. Plain helpers live in support modules beside it,
named without ``test_`` so that pytest never collects them and no test module imports another:
corpus.py (shards), servers.py (HTTP and S3 servers), source_checks.py, pillow_reference.py,
epoch_runs.py, cli_runs.py, train_support.py, torchrun_jobs.py, accum_gradients.py."""

from __future__ import annotations

import pytest
from torchrun_jobs import Jobs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Memoised torchrun jobs for one test module (see torchrun_jobs.Jobs)."""
    return Jobs(tmp_path_factory.mktemp("jobs"))
