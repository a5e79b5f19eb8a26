"""``python -m conductor.cli``: the same CLI as the ``conductor`` script."""

from conductor.cli import main

main()
