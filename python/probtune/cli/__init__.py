"""The ``probtune`` command (``python -m probtune.cli``): its commands, one module per group."""

from probtune.cli.commands import main

__all__ = ["main"]
