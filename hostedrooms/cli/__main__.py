"""``python -m hostedrooms.cli``: the console script."""

from . import main

if __name__ == "__main__":  # imported (a walk over the package's modules, say), it runs nothing
    raise SystemExit(main())
