"""One rank of a distributed count (``count_tokens`` or ``count_patches`` with
``distributed=True``) under torchrun, for tests/test_counting_ranks.py.

Every rank counts its share of the files; each writes ``DIR/rank-<r>.json`` with the counts it
returned, and rank 0 also the counts file (``DIR/counts.json``). With ``--init-group`` the script
first initialises torch.distributed itself, as a training script does before counting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from shardstream import NaFlex, count_patches, count_tokens

# The token-budget settings of the patch counts (tests/test_naflex_budget.py's).
SPEC = NaFlex(patch_size=16, max_num_patches=256)
BUDGET = 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=("tokens", "patches"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--init-group", action="store_true")
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if args.init_group:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    output = args.out / "counts.json"
    if args.kind == "tokens":
        counts: object = count_tokens(
            args.urls, tokenizer=args.tokenizer, threads=1, output=output, distributed=True
        )
    else:
        counts = count_patches(
            args.urls, naflex=SPEC, max_patches_per_batch=BUDGET, threads=1, output=output, distributed=True
        )
    # Every rank returns only once rank 0 has written the file.
    assert output.exists()
    record = dataclasses.asdict(counts)  # type: ignore[call-overload]
    (args.out / f"rank-{rank}.json").write_text(json.dumps(record))
    if args.init_group:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
