"""`sqa`: the command line. One module per command group; `common` holds what they share.

It reads the settings once per command and hands jobs a context built by app.bootstrap.
"""

from __future__ import annotations

from app.cli import (  # noqa: F401  (each registers its commands)
    data,
    eval_commands,
    feed_commands,
    live_commands,
    service,
    tower_commands,
    train_commands,
    version_commands,
)
from app.cli.common import cli


def main() -> None:
    cli()


__all__ = ["cli", "main"]
