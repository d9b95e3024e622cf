"""An mkdocs hook (mkdocs.yml ``hooks:``): the command-line reference, generated from the click tree at build
time, so it is always what ``svcframe ... --help`` prints.

docs/reference/cli.md holds the marker line ``<!-- svcframe-cli -->``; this hook replaces it with one section
per command, every group's commands below it, each with its help as an 80-column terminal shows it. The tree is
the one ``svcframe`` runs: the framework's commands and those plugins register through the ``svcframe.cli``
entry points (the self-test's ``selftest``, ``roofline``, ``history``, ``report`` and ``bench``).
"""

from __future__ import annotations

from typing import Any

import click

MARKER = "<!-- svcframe-cli -->"
WIDTH = 80


def _sections(command: click.Command, ctx: click.Context, level: int) -> list[str]:
    """The section of ``command`` (its help) and, for a group, those of its commands."""
    path = ctx.command_path
    out = [f"{'#' * level} `{path}`", "", "```text", command.get_help(ctx).rstrip(), "```", ""]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = click.Context(sub, info_name=name, parent=ctx, terminal_width=WIDTH, max_content_width=WIDTH)
            out += _sections(sub, sub_ctx, min(level + 1, 4))
    return out


def reference() -> str:
    """The whole command line's reference, as Markdown."""
    from svcframe.cli import main

    ctx = click.Context(main, info_name="svcframe", terminal_width=WIDTH, max_content_width=WIDTH)
    return "\n".join(_sections(main, ctx, 2))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, reference())
    return markdown
