"""`python -m spinn.cli`: what torchrun starts on every rank (`spinn train` with processes > 1 runs it)."""

from spinn.cli import main

main()
