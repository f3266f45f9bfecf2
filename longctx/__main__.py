"""``python -m longctx``: the command line."""

from longctx.cli import main

main()
