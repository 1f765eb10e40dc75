"""The exception class comes from the kind the core attaches to a fault, never from its wording."""

from __future__ import annotations

import pytest
import shardstream
from shardstream import _core
from shardstream.errors import (
    BadUrlError,
    CredentialsError,
    NotFoundError,
    SampleError,
    ShardError,
    SourceError,
    from_core_fault,
)


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("not_found", NotFoundError),
        ("credentials", CredentialsError),
        ("bad_url", BadUrlError),
        ("other", SourceError),
    ],
)
def test_the_kind_decides_the_class_whatever_the_message_says(kind, cls):
    # A detail that reads like another kind must not change the class.
    fault = _core.CoreFault("unreadable", "s3://b/0.tar", "", "access denied? not found: No such file", kind)
    error = from_core_fault(fault)
    assert type(error) is cls
    assert (error.reason, error.url, error.detail) == ("unreadable", "s3://b/0.tar", fault.args[3])


def test_sample_faults_and_other_shard_faults():
    assert type(from_core_fault(_core.CoreFault("corrupt_image", "u", "k", "bad", "other"))) is SampleError
    assert type(from_core_fault(_core.CoreFault("truncated_tar", "u", "", "cut", "other"))) is ShardError


def test_a_missing_local_shard_is_not_found_with_its_name(tmp_path):
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(NotFoundError, match="nope.tar"):
        list(shardstream.read_samples(missing))
