"""open_clip_train's own ``main``, with shardstream's loader in place of its webdataset pipeline.

    torchrun --nproc-per-node 8 -m shardstream.integrations.open_clip \\
        --train-data 'shards/{00000..00999}.tar' --train-index idx/ --model ViT-B-32 ...

Every open_clip_train flag keeps its meaning (``open_clip_data`` says how the data flags map);
the adapter adds its own, removed before open_clip_train parses the rest:

* ``--train-index``, ``--val-index``: the indexes (``shardstream index``) that make epochs exact;
  one per ``::`` part of ``--train-data`` for a mixture;
* ``--save-every-n-steps N``: a mid-epoch checkpoint every N steps, which open_clip_train's
  ``--resume`` (path or ``latest``) continues at the exact next batch (``open_clip_checkpoint``);
* ``--sample-keys-log DIR``: each rank appends ``{"epoch", "batch", "keys"}`` per batch to
  ``DIR/rank-R.jsonl`` (to audit what was trained on, and what the tests compare);
* ``--shuffle-buffer N``: the loader's shuffle block (default: shardstream's).

It patches three names in ``open_clip_train.main`` (``get_data``, ``train_one_epoch``,
``pt_load``) and the DDP wrap: open_clip_train passes ``device_ids=[device]``, which
DistributedDataParallel refuses for a CPU device (``--device cpu --dist-backend gloo``); on the
CPU the adapter wraps without ``device_ids``, as DDP requires there. Nothing else is changed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from typing import Any

from shardstream._stderr import say
from shardstream.integrations.open_clip_data import AdapterOptions, OpenClipUsageError

PROG = "shardstream.integrations.open_clip"

__all__ = ["install", "main"]


def adapter_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, add_help=False)
    group = parser.add_argument_group("shardstream (the other flags are open_clip_train's)")
    group.add_argument(
        "--train-index", default=None, help="index of --train-data ('::'-separated: one per source)"
    )
    group.add_argument("--val-index", default=None, help="index of --val-data")
    group.add_argument(
        "--save-every-n-steps",
        type=int,
        default=0,
        help="mid-epoch checkpoint every N steps (0: epoch ends only)",
    )
    group.add_argument(
        "--sample-keys-log", default=None, help="folder: each rank logs its batches' keys (JSONL)"
    )
    group.add_argument("--shuffle-buffer", type=int, default=None, help="the loader's shuffle block size")
    return parser


def split_argv(argv: list[str]) -> tuple[AdapterOptions, list[str]]:
    """The adapter's options, and the rest for open_clip_train's parser. A ``--`` is dropped:
    torchrun passes one on when it is not right after the module, and open_clip_train has no
    positional arguments for it to separate."""
    ours, rest = adapter_parser().parse_known_args([a for a in argv if a != "--"])
    if ours.save_every_n_steps < 0:
        raise OpenClipUsageError(f"--save-every-n-steps must be >= 0, got {ours.save_every_n_steps}")
    return AdapterOptions(
        train_index=ours.train_index,
        val_index=ours.val_index,
        save_every_n_steps=ours.save_every_n_steps,
        sample_keys_log=ours.sample_keys_log,
        shuffle_buffer=ours.shuffle_buffer,
    ), rest


class _Overlay(types.ModuleType):
    """A module whose attributes are ``base``'s except the ones given: patches one name as seen
    from one module (open_clip_train.main), not for the whole process."""

    def __init__(self, base: types.ModuleType, **overrides: Any) -> None:
        super().__init__(base.__name__)
        self._base = base
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def cpu_aware_ddp(ddp_class: type) -> Any:
    def wrap(module: Any, device_ids: Any = None, **kwargs: Any) -> Any:
        import torch

        if device_ids and all(torch.device(d).type == "cpu" for d in device_ids):
            device_ids = None  # DDP takes no device_ids for CPU modules
        return ddp_class(module, device_ids=device_ids, **kwargs)

    return wrap


def install(options: AdapterOptions) -> None:
    """Points ``open_clip_train.main`` at shardstream's data, checkpoints and CPU DDP wrap (its
    ``get_data``, ``train_one_epoch``, ``pt_load`` and DDP class, as seen from that module).

    Args:
        options: The adapter's own flags (:func:`split_argv`).
    """
    import torch
    from open_clip_train import main as oc_main

    from shardstream.integrations import open_clip_checkpoint as ckpt
    from shardstream.integrations import open_clip_data

    capture = ckpt.ResumeCapture()
    oc_main.pt_load = capture.wrap_pt_load(oc_main.pt_load)

    def get_data(args: Any, preprocess_fns: Any, epoch: int = 0, tokenizer: Any = None) -> dict[str, Any]:
        resume = capture.entry if args.train_data else None
        return open_clip_data.get_data(args, preprocess_fns, epoch, tokenizer, options, resume)

    oc_main.get_data = get_data
    oc_main.train_one_epoch = ckpt.wrap_train_one_epoch(oc_main.train_one_epoch, options.save_every_n_steps)
    parallel = _Overlay(
        torch.nn.parallel, DistributedDataParallel=cpu_aware_ddp(torch.nn.parallel.DistributedDataParallel)
    )
    oc_main.torch = _Overlay(torch, nn=_Overlay(torch.nn, parallel=parallel))


def main(argv: list[str] | None = None) -> int:
    """Runs open_clip_train's ``main`` on shardstream's data (``torchrun -m
    shardstream.integrations.open_clip FLAGS``).

    Args:
        argv: open_clip_train's flags plus the adapter's (``--train-index`` ...; the module
            docstring lists them). None (default): ``sys.argv[1:]``.

    Returns:
        The exit status: 0 done, 2 a flag the adapter refuses or a missing package (one line on
        stderr naming ``shardstream[train]``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        adapter_parser().print_help()
        print()
    if importlib.util.find_spec("open_clip_train") is None:
        say(f"{PROG}: needs open_clip_train: pip install 'shardstream[train]'")
        return 2
    try:
        options, rest = split_argv(argv)
        if "-h" not in rest and "--help" not in rest:
            # Refused before torch and the model load, with one line.
            from open_clip_train.params import parse_args

            from shardstream.integrations.open_clip_data import check_flags

            check_flags(parse_args(list(rest)), options)
        try:
            from open_clip_train.main import main as open_clip_main
        except ImportError as e:  # open_clip_train.data imports pandas, which open_clip_torch lacks
            say(f"{PROG}: open_clip_train cannot start ({e}): pip install 'shardstream[train]'")
            return 2
        from shardstream.train.model import register_model_configs

        register_model_configs()  # shardstream-tiny and the other small configs, for --model
        install(options)
        result = open_clip_main(rest)
    except OpenClipUsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
