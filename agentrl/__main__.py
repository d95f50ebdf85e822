"""``python -m agentrl ...``: the same as the ``agentrl`` command (torchrun launches this)."""

import sys

from agentrl.cli import main

sys.exit(main())
