"""``python -m conductor.testing.emulator``: serve the provider emulator (see the package docstring)."""

from conductor.testing.emulator import main

main()
