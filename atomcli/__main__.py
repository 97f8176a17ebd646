"""`python -m atomcli` runs the CLI."""

from atomcli.cli import main

main()
