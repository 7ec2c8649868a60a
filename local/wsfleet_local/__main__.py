"""``python -m wsfleet_local``: the ``wsfleet`` command without the console script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
