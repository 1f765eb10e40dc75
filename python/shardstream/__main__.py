"""``python -m shardstream``: the same command as the ``shardstream`` console script."""

import sys

from .cli import main

sys.exit(main())
