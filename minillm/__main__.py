"""``python -m minillm ...`` is the ``minillm`` command (lab, generate, chat, serve, grade, bench)."""

from .apps.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
