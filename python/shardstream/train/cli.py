"""``shardstream train`` / ``torchrun -m shardstream.train`` / ``train_clip.py``: parse the command
line and train, or with ``export`` first, write a checkpoint's weights for open_clip
(``shardstream.train.export``); with ``plot`` first, draw a run's training curves from its
log.jsonl (``shardstream.train.plot``). ``--config`` takes a file or the name of a config shipped
in the package (``vit_b32``); without it, the shipped ``demo_cpu``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from shardstream._stderr import say
from shardstream.train.config import (
    SHIPPED_CONFIGS,
    ConfigError,
    config_to_yaml,
    describe_config,
    load_config,
    placeholders,
    shipped_configs,
)

MISSING_GRACE_S = 3.0  # under torchrun, how long a rank lacking a package waits before it exits

_EPILOG = """\
Any config field can be overridden as --section.field VALUE (or --section.field=VALUE), e.g.
  --train.batch_size 64 --optim.base_lr 1e-3 --model.precision fp32 --train.epochs 3
--help-config lists every field with its type, default and meaning.

--config takes a YAML file or the name of a shipped config: {shipped}.

examples:
  shardstream train                                               # CPU demo (generates data/demo)
  torchrun --nproc_per_node=2 -m shardstream.train                # the same on 2 processes
  torchrun --nproc_per_node=8 -m shardstream.train --config vit_b32 --data.train URLS --data.train_index IDX
  torchrun --nproc_per_node=2 -m shardstream.train --resume latest  # continue where it stopped
  python -m shardstream.train export runs/demo/checkpoints/step-00000500.pt -o model.pt
                                                                  # weights open_clip loads
  python -m shardstream.train plot runs/demo -o curves.png        # loss, lr, input_frac per step
(train_clip.py at the repository root is the same command.)
"""


def build_parser(default_config: Path | None, prog: str = "train_clip.py") -> argparse.ArgumentParser:
    shipped = ", ".join(shipped_configs())
    shipped_default = default_config is not None and Path(default_config).parent == SHIPPED_CONFIGS
    default_name = Path(default_config).stem if shipped_default else None
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a CLIP model (open_clip) on WebDataset shards streamed by shardstream.",
        epilog=_EPILOG.format(shipped=shipped),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        default=default_config,
        metavar="NAME|PATH",
        help=f"YAML config file, or a shipped config by name ({shipped}); "
        f"default: {default_name or default_config or 'the built-in defaults (demo_cpu)'}",
    )
    parser.add_argument("--resume", metavar="latest|PATH", help="same as --train.resume")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--help-config", action="store_true", help="describe every config field and exit")
    return parser


def main(
    argv: Sequence[str] | None = None, *, default_config: Path | None = None, prog: str = "train_clip.py"
) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status (0 done,
    1 a failure torchrun may restart, 2 a config or usage error). ``default_config``: the config
    used without ``--config`` (None: the built-in defaults, which are the demo's); ``prog``: the
    command's name in help and error lines."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if default_config is None:
        default_config = shipped_configs().get("demo_cpu")
    if argv[:1] == ["export"]:
        from shardstream.train.export import main as export_main

        return export_main(argv[1:])
    if argv[:1] == ["plot"]:
        from shardstream.train.plot import main as plot_main

        return plot_main(argv[1:])
    parser = build_parser(default_config, prog)
    args, rest = parser.parse_known_args(argv)
    if args.help_config:
        print(describe_config())
        return 0
    overrides = list(rest)
    if args.resume:
        overrides += ["--train.resume", args.resume]
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        parser.exit(2, f"{prog}: config error: {e}\n")
    if args.print_config:
        print(config_to_yaml(cfg), end="")
        return 0
    unset = placeholders(cfg)
    if unset:
        for line in unset:
            say(f"{prog}: config error: {line}")
        return 2
    from shardstream.train.slurm import SlurmLaunchError, torch_environment

    try:
        os.environ.update(torch_environment(os.environ))
    except SlurmLaunchError as e:
        say(f"{prog}: error: {e}")
        return 2
    # Every rank, before any process group, model or data: one line per missing package.
    from shardstream.train.deps import problems

    missing = problems(cfg)
    if missing:
        for line in missing:
            say(f"{prog}: error: {line}")
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            # torchrun stops every worker as soon as one exits: wait a moment, so that the
            # ranks still starting up reach this check and say it too
            time.sleep(MISSING_GRACE_S)
        return 2
    from shardstream.train.checkpoint import ResumeError
    from shardstream.train.checkpoint_async import CheckpointWriteError
    from shardstream.train.dist import DistJoinError, exit_process
    from shardstream.train.loop import train

    try:
        train(cfg)
        code = 0
    except ConfigError as e:
        say(f"{prog}: config error: {e}")
        code = 2
    # one line, and exit 1: torchrun restarts the workers if it may
    except (DistJoinError, ResumeError, CheckpointWriteError) as e:
        say(f"{prog}: error: {e}")
        code = 1
    if "RANK" in os.environ:
        exit_process(code)  # no interpreter finalization beside the process group's threads
    return code
