"""``python -m shardstream.cli``: the same command as ``python -m shardstream``."""

import sys

from . import main

sys.exit(main())
