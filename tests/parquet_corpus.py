"""Parquet image-text files for tests, and the same samples as tars.

Three layouts users have: Hugging Face ``datasets`` (an ``image`` column of the ``Image``
feature, struct<bytes, path>, written by ``Dataset.to_parquet``), img2dataset's
``output_format=parquet`` (``key``, ``caption`` and a binary ``jpg`` column, written by pyarrow),
and plain pyarrow files without a key column. Each file holds several row groups.
"""

from __future__ import annotations

import os

from corpus import good_samples, sample_members, tar_bytes, write_file


def samples_for(i: int, n: int, seed: int, prefix: str = "p") -> list[tuple[str, dict[str, bytes | str]]]:
    return good_samples(n, seed=seed + i, prefix=f"{prefix}{i}_")


def write_hf(path: str, samples: list, rows_per_group: int) -> str:
    """``datasets``' layout: the ``Image`` feature (struct<bytes, path>), ``text`` and ``key``."""
    import datasets

    features = datasets.Features(
        {"key": datasets.Value("string"), "image": datasets.Image(), "text": datasets.Value("string")}
    )
    ds = datasets.Dataset.from_dict(
        {
            "key": [k for k, _ in samples],
            "image": [{"bytes": s["jpg"], "path": None} for _, s in samples],
            "text": [s["txt"] for _, s in samples],
        },
        features=features,
    )
    ds.to_parquet(path, batch_size=rows_per_group)
    return path


def write_img2dataset(path: str, samples: list, rows_per_group: int, *, compression: str = "snappy") -> str:
    """img2dataset's layout: ``key``, ``caption`` and the image bytes in a binary ``jpg`` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "key": pa.array([k for k, _ in samples], pa.string()),
            "caption": pa.array([s["txt"] for _, s in samples], pa.string()),
            "jpg": pa.array([s["jpg"] for _, s in samples], pa.binary()),
            "width": pa.array([0 for _ in samples], pa.int32()),
        }
    )
    pq.write_table(table, path, row_group_size=rows_per_group, compression=compression)
    return path


def write_pairs(
    directory: str,
    counts: list[int],
    *,
    seed: int,
    layout: str = "hf",
    rows_per_group: int = 4,
    prefix: str = "p",
) -> tuple[list[str], list[str], list[str]]:
    """File ``i`` as ``part-i.parquet`` and ``part-i.tar`` (the same samples, keys
    ``{prefix}{i}_NNNN``).
    Returns (parquet paths, tar paths, keys)."""
    os.makedirs(directory, exist_ok=True)
    parquets, tars, keys = [], [], []
    for i, n in enumerate(counts):
        samples = samples_for(i, n, seed, prefix)
        path = os.path.join(directory, f"part-{i:02d}.parquet")
        (write_hf if layout == "hf" else write_img2dataset)(path, samples, rows_per_group)
        parquets.append(path)
        members = [m for k, s in samples for m in sample_members(k, {"jpg": s["jpg"], "txt": s["txt"]})]
        tars.append(write_file(os.path.join(directory, f"part-{i:02d}.tar"), tar_bytes(members)))
        keys += [k for k, _ in samples]
    return parquets, tars, keys


def row_groups(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_row_groups
