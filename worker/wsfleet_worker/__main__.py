"""``python -m wsfleet_worker``: run one worker process, configured from the environment."""

from __future__ import annotations

import sys

from .worker import main

if __name__ == "__main__":
    sys.exit(main())
