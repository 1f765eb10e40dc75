"""Optional third-party packages, imported where a feature needs them: a missing one is one
line naming the pip extra that installs it (:class:`~shardstream.errors.MissingDependencyError`),
never a bare ``ModuleNotFoundError`` from deep inside a call."""

from __future__ import annotations

import importlib
from types import ModuleType

from shardstream.errors import MissingDependencyError

# The extra of pyproject.toml that installs each optional top-level module.
EXTRAS = {
    "boto3": "s3",
    "botocore": "s3",
    "huggingface_hub": "hub",
    "pyarrow": "parquet",
    "torch": "torch",
    "open_clip": "train",
    "pandas": "train",
    "yaml": "train",
    "PIL": "write",
}


def require(module: str, needed_for: str) -> ModuleType:
    """``module`` imported, or one line naming the extra that installs it.

    Args:
        module: A dotted module name (``"botocore.exceptions"``); its top-level package picks the
            extra from :data:`EXTRAS`.
        needed_for: What needs it, for the message (e.g. ``"reading s3:// URLs"``).

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: The module (or something it imports) cannot be imported.
    """
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing = err.name.split(".")[0] if err.name else top
        extra = EXTRAS.get(missing, EXTRAS.get(top, "all"))
        raise MissingDependencyError(missing, extra, needed_for, str(err)) from None
