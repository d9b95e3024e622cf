"""What every command of the ``svcframe`` command line shares, the framework's and the plugins' alike:
the one-line user error, JSON output, the shared secret, and the servers a verb targets.

Targets. A verb that acts on servers takes ADDRESS arguments and/or ``-g/--group FILE`` (a group file to
READ, ``svcframe.group``: svcframe's or Flock's); with neither, the group file named by ``$SVCFRAME_GROUP``.
``--ranks 0-3,5`` selects members of the group. ``-g`` given twice is an error (never silently the last).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from ..config import ADMIN_PROVIDER_ID
from ..errors import ConfigError, GroupError, RemoteError
from ..group import GROUP_ENV, Member, read_group_file
from ..wire import check_secret

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> NoReturn:
    """A user error: one line on stderr (one per problem when ``message`` has several lines), then exit with
    ``code`` (never a traceback)."""
    for line in message.splitlines() or [""]:
        click.echo(f"svcframe: error: {line}", err=True)
    sys.exit(code)


def import_from_cwd() -> None:
    """Import provider libraries as ``python -m`` would: the current directory first (issue 15)."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def json_argument(text: str, what: str) -> Any:
    """JSON text, or ``@FILE`` for the contents of FILE (a user error when neither reads)."""
    try:
        return json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as exc:
        fail(f"cannot read {what} ({text[:60]!r}): {exc}")


def read_secret(secret_file: str | None = None) -> bytes | None:
    """The shared secret of ``--secret-file``, else ``$SVCFRAME_SECRET``, else None (a user error when bad)."""
    if secret_file is not None:
        from ..server import read_secret_file

        try:
            return read_secret_file(secret_file)
        except ConfigError as exc:
            fail(str(exc), 2)
    env = os.environ.get("SVCFRAME_SECRET")
    if env is None:
        return None
    try:
        return check_secret(env.encode(), "the SVCFRAME_SECRET variable")
    except ConfigError as exc:
        fail(str(exc), 2)


def describe(exc: BaseException) -> str:
    """One line for an error; a remote handler's traceback only with -vv."""
    if isinstance(exc, RemoteError):
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            return str(exc)
        return f"{exc.remote_type}: {exc.remote_message}"
    return f"{type(exc).__name__}: {exc}"


# -- targets ------------------------------------------------------------------------------------------------------
def _one_group(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
    if len(value) > 1:
        raise click.BadParameter(f"given {len(value)} times ({', '.join(value)}); give one group file", ctx, param)
    return value[0] if value else None


def _rank_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """``0-3,5`` -> [0, 1, 2, 3, 5]."""
    if value is None:
        return None
    ranks: list[int] = []
    for part in value.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
            raise click.BadParameter(f"{value!r}: expected ranks and ranges such as 0-3,5", ctx, param)
        ranks += range(int(first), int(last if dash else first) + 1)
    return list(dict.fromkeys(ranks))


def group_option(fn: F) -> F:
    """``-g/--group FILE``: a group file to read (once)."""
    return click.option(
        "--group", "-g", multiple=True, callback=_one_group, type=click.Path(dir_okay=False), metavar="FILE",
        help=f"Group file to read (svcframe's or Flock's); default: ${GROUP_ENV} when no address is given.",
    )(fn)  # fmt: skip


def ranks_option(fn: F) -> F:
    """``--ranks 0-3,5``: which members of the group."""
    return click.option(
        "--ranks", callback=_rank_list, default=None, metavar="LIST", help="Members of the group, e.g. 0-3,5."
    )(fn)


def target_options(fn: F) -> F:
    """ADDRESS... arguments, ``-g/--group`` and ``--ranks``."""
    return click.argument("address", nargs=-1)(group_option(ranks_option(fn)))


def addresses_then(name: str) -> Callable[[F], F]:
    """``[ADDRESS]... NAME`` arguments (addresses, then one more: an expression, a description...), with
    ``-g/--group`` and ``--ranks``."""

    def decorate(fn: F) -> F:
        return click.argument("args", nargs=-1, required=True, metavar=f"[ADDRESS]... {name}")(
            group_option(ranks_option(fn))
        )

    return decorate


def group_members(group: str | None, ranks: list[int] | None) -> list[Member]:
    """The members of ``group`` (else ``$SVCFRAME_GROUP``) that ``ranks`` selects (a user error when there is no
    group file or it cannot be read)."""
    group = group or os.environ.get(GROUP_ENV) or None
    if group is None:
        fail(f"give -g/--group FILE (or set {GROUP_ENV})", 2)
    try:
        return read_group_file(group).select(ranks)
    except GroupError as exc:
        fail(str(exc), 2)


def resolve_targets(addresses: tuple[str, ...], group: str | None, ranks: list[int] | None) -> list[tuple[str, int]]:
    """``(address, admin provider id)`` of every server a verb acts on: the ADDRESS arguments, then the members
    of ``-g`` (or of ``$SVCFRAME_GROUP`` when neither is given) that ``--ranks`` selects."""
    if group is None and addresses:
        if ranks is not None:
            fail("--ranks selects members of a group file: give -g/--group FILE instead of addresses", 2)
        return [(a, ADMIN_PROVIDER_ID) for a in addresses]
    if group is None and not os.environ.get(GROUP_ENV):
        fail(f"give at least one ADDRESS or -g/--group FILE (or set {GROUP_ENV})", 2)
    members = group_members(group, ranks)
    return [(a, ADMIN_PROVIDER_ID) for a in addresses] + [(m.address, m.provider_id) for m in members]


def run_admin(targets: list[tuple[str, int]], method: str, *args: Any, timeout: float = 10.0) -> dict[str, Any]:
    """``ServiceGroupHandle.call(method, *args)`` on every target. A member that fails is one line on stderr
    and an exit code of 1, after the others' results were printed (JSON keyed by address)."""
    from ..admin import ServiceGroupHandle
    from ..engine import Engine
    from ..loops import run

    async def go() -> dict[str, Any]:
        async with Engine(None, secret=read_secret(), default_timeout_seconds=timeout) as engine:
            return await ServiceGroupHandle(engine, targets).call(method, *args)

    results = run(go())
    failed = {a: r for a, r in results.items() if isinstance(r, BaseException)}
    for address, exc in failed.items():
        click.echo(f"svcframe: {address}: {describe(exc)}", err=True)
    if failed:
        echo_json({a: r for a, r in results.items() if a not in failed})
        sys.exit(1)
    return results
