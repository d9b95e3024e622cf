"""The ``svcframe`` command line (click): the framework's verbs, one module per group, and the verbs that
other packages register as plugins.

    svcframe serve CONFIG | launch CONFIG --procs N [--group-file F]          serve.py
    svcframe status | shutdown | wait | provider add|remove|list|lookup | library  admin.py
    svcframe config check | schema | get | query | patch                       config.py
    svcframe call [ADDRESS] RPC_NAME [ARG]                                     call.py
    svcframe group view | watch | join | leave                                 group.py
    svcframe monitor | stats dump|diagnose | trace on|off|dump                 observe.py
    svcframe topology                                                          topology.py

Conventions (``common.py``): every verb that acts on servers takes ADDRESS arguments and/or ``-g/--group FILE``
(a group file to read; ``$SVCFRAME_GROUP`` when neither is given) and ``--ranks 0-3,5``; it prints JSON keyed
by address. A user error is one line on stderr and a non-zero exit, click's usage errors included.

Plugins. A distribution adds commands by declaring entry points in the ``svcframe.cli`` group; the name is
the command's, the object a click command or group (bedrockctl's ``add_typer``; uvicorn's registries)::

    [project.entry-points."svcframe.cli"]
    roofline = "svcframe_selftest.cli.roofline:roofline"

A plugin is imported only when it is invoked or listed (``svcframe --help``), so the framework's own verbs
never import it. One that cannot be loaded is one warning line naming it in ``--help`` (the other commands
are listed as usual) and one error line when it is invoked. A built-in command's name cannot be taken.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Sequence
from functools import cached_property
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

from ..packages import import_module
from . import admin, call, config, group, observe, serve, topology
from .common import fail

#: The entry-point group plugins register their commands in.
PLUGIN_GROUP = "svcframe.cli"
#: What click >= 8.2 raises for a group given no command (click 8.1 prints the help and exits instead).
_NO_ARGS_IS_HELP: type[click.UsageError] | None = getattr(click.exceptions, "NoArgsIsHelpError", None)


class RootGroup(click.Group):
    """The root group: the built-in commands, then the plugins' (loaded when first needed); click's usage
    errors become one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plugins: dict[str, click.Command | None] = {}  # name -> command, None when it cannot be loaded
        self._warnings: dict[str, str] = {}  # name -> why a plugin is ignored or cannot be loaded

    @cached_property
    def _entry_points(self) -> dict[str, EntryPoint]:
        """The plugins by command name (the first of two with one name; none with a built-in's name)."""
        found: dict[str, EntryPoint] = {}
        for ep in entry_points(group=PLUGIN_GROUP):
            taken = "svcframe" if ep.name in self.commands else found[ep.name].value if ep.name in found else None
            if taken is None:
                found[ep.name] = ep
            elif taken != ep.value:
                self._warnings[ep.name] = f"plugin {ep.name!r} ({ep.value}) ignored: {taken} has that command name"
        return found

    def _load(self, name: str) -> click.Command | None:
        if name not in self._plugins:
            ep = self._entry_points[name]
            try:  # ep.load(), with the module's repository or installed name (svcframe.packages)
                command = functools.reduce(getattr, filter(None, (ep.attr or "").split(".")), import_module(ep.module))
            except Exception as exc:  # any failure of a plugin's import: it must not break the other commands
                command, why = None, f"cannot be loaded: {type(exc).__name__}: {exc}"
            else:
                why = f"is a {type(command).__name__}, not a click command"
            if not isinstance(command, click.Command):
                command = None
                self._warnings[name] = f"plugin {name!r} ({ep.value}) {why}"
            self._plugins[name] = command
        return self._plugins[name]

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self._entry_points})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        return self._load(cmd_name) if cmd_name in self._entry_points else None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else None
        if name in self._entry_points and name not in self.commands and self._load(name) is None:
            raise click.ClickException(self._warnings[name])
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_commands(ctx, formatter)  # loads every plugin
        for problem in self._warnings.values():
            click.echo(f"svcframe: warning: {problem}", err=True)

    def main(
        self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
        standalone_mode: bool = True, **extra: Any,
    ) -> Any:  # fmt: skip
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            if _NO_ARGS_IS_HELP is not None and isinstance(exc, _NO_ARGS_IS_HELP):
                exc.show()  # a group given no command: its help, as click shows it
                sys.exit(exc.exit_code)
            hint = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            fail(" ".join(exc.format_message().split()) + hint, exc.exit_code)
        except click.ClickException as exc:
            fail(" ".join(exc.format_message().split()), exc.exit_code)
        except click.Abort:
            fail("aborted")
        sys.exit(code if isinstance(code, int) else 0)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``svcframe --version``: "svcframe 0.1.0 (compiled, Python 3.11.7)", or pure (svcframe.compiled)."""
    if not value or ctx.resilient_parsing:
        return
    import importlib.metadata
    import platform

    from .. import compiled

    build = compiled.build() + (f", {compiled.PURE_ENV}=1" if compiled.pure_requested() else "")
    click.echo(f"svcframe {importlib.metadata.version('svcframe')} ({build}, Python {platform.python_version()})")
    ctx.exit()


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version, whether the hot paths run compiled or pure, and exit.")  # fmt: skip
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """svcframe: an asyncio runtime for HPC data services, with a self-test and the data-service roofline."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)


for _command in (
    serve.serve, serve.launch,
    admin.status, admin.shutdown, admin.wait, admin.provider, admin.library,
    config.config,
    call.call,
    group.group,
    observe.monitor, observe.stats, observe.trace,
    topology.topology,
):  # fmt: skip
    main.add_command(_command)
