"""``--version`` of both CLIs: the installed distribution's version, then exit 0."""

from __future__ import annotations

from importlib import metadata

import typer

DISTRIBUTION = "pinlog-ai"  # one distribution ships both commands (pyproject.toml)


def add_version_option(app: typer.Typer, program: str, *, help_text: str) -> None:
    """Give ``app`` a ``--version`` option that prints ``{program} {version}``; ``help_text``
    becomes the command's own description."""

    def show(value: bool) -> None:
        if value:
            typer.echo(f"{program} {metadata.version(DISTRIBUTION)}")
            raise typer.Exit()

    def main(
        version: bool = typer.Option(
            False, "--version", callback=show, is_eager=True, help="Print the version and exit"
        ),
    ) -> None:
        pass

    main.__doc__ = help_text
    app.callback()(main)
