"""Fixtures that several test modules share (plain helpers live in corpus.py, servers.py and
torchrun_jobs.py)."""

from __future__ import annotations

import pytest
from torchrun_jobs import Jobs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Memoised torchrun jobs for one test module (see torchrun_jobs.Jobs)."""
    return Jobs(tmp_path_factory.mktemp("jobs"))
