"""What every command of the ``svcframe`` command line shares, the framework's and the plugins' alike:
the one-line user error, JSON output, the shared secret, the servers a verb targets, and output that reads
well in a terminal, in a pipe and in a log file.

Targets. A verb that acts on servers takes ADDRESS arguments and/or ``-g/--group FILE`` (a group file to
READ, ``svcframe.group``: svcframe's or Flock's); with neither, the group file named by ``$SVCFRAME_GROUP``.
``--ranks 0-3,5`` selects members of the group. ``-g`` given twice is an error (never silently the last).

Output. Figures print in one notation (:func:`quantity`, :func:`quantity_range`, from ``svcframe.units``,
where modules below the CLI find them too: three significant digits, an SI prefix, binary ones for bytes,
and the unit: ``8.63 k ops/s``, ``8.63-17.1 k ops/s``, ``3.60 GiB/s``, ``24.3 µs``). Tables
(:func:`print_table`) never cut a value: on a terminal they fit its width (or ``$COLUMNS``), a value too long
for its column folds onto more lines; in a pipe or a file (an sbatch log) they are plain columns, one line per
row, no wider than ``$COLUMNS`` when it is set. Every command that prints a table also takes ``--json``
(:func:`json_option`). Long commands report progress (:class:`StepProgress`) on stderr: a rich progress bar on
a terminal, one plain line per step elsewhere, so a log shows it as it happens. Paths a command writes are
checked before it runs (:func:`output_path`), and written whole; what cannot be written after all is kept in a
temporary file, named in one line (:func:`write_output`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ..config import ADMIN_PROVIDER_ID
from ..errors import ConfigError, GroupError, RemoteError
from ..group import GROUP_ENV, Member, read_group_file
from ..units import percent, quantity, quantity_range
from ..wire import check_secret

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

F = TypeVar("F", bound=Callable[..., Any])
__all__ = ["percent", "quantity", "quantity_range"]  # re-exported: every command's one notation for figures


def fail(message: str, code: int = 1) -> NoReturn:
    """A user error: one line on stderr (one per problem when ``message`` has several lines), then exit with
    ``code`` (never a traceback)."""
    for line in message.splitlines() or [""]:
        click.echo(f"svcframe: error: {line}", err=True)
    sys.exit(code)


def import_from_cwd() -> None:
    """Import provider libraries as ``python -m`` would: the current directory first."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def json_argument(text: str, what: str) -> Any:
    """JSON text, or ``@FILE`` for the contents of FILE (a user error when neither reads: it names the file
    whole, or the start of the text)."""
    try:
        return json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as exc:
        fail(f"cannot read {what} ({text[1:] if text.startswith('@') else repr(text[:60])}): {exc}")


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


def int_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """A click callback: ``1,2,4`` -> [1, 2, 4] (integers >= 0; a usage error naming the option otherwise)."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() for p in parts):
        raise click.BadParameter(f"{value!r}: expected integers separated by commas, such as 1,2,4", ctx, param)
    return [int(p) for p in parts]


def writable(path: str | os.PathLike[str], *, directory: bool = False) -> str | None:
    """Why the command cannot write ``path`` (a file, or a directory it writes files in), or None when it can.

    The directory is created when missing; then a file is really created in it and removed (permission bits
    alone do not tell: root passes them on ``/proc``, a read-only mount or an immutable directory), and a file
    that exists already is opened for writing (without a change)."""
    target = Path(path)
    folder = target if directory else target.parent
    if not directory and target.is_dir():
        return f"{path} is a directory; give a file name"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{path}: cannot create the directory {folder}: {exc.strerror}"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".svcframe-probe-")
        os.close(fd)
        os.unlink(probe)
        if not directory and target.exists():
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        return f"{path}: cannot write in {folder}: {exc.strerror or exc}"
    return None


def output_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback for a path the command writes (a file, or a directory when the parameter's type is
    ``click.Path(file_okay=False)``): checked before anything runs (:func:`writable`), so a long run never ends
    unable to write its results; a usage error naming the path when it cannot be written."""
    if value is None:
        return None
    problem = writable(value, directory=isinstance(param.type, click.Path) and not param.type.file_okay)
    if problem is not None:
        raise click.BadParameter(problem, ctx, param)
    return value


def write_output(path: str | os.PathLike[str], data: str | bytes, what: str) -> Path:
    """Write a command's results to ``path`` (checked before the command ran, :func:`output_path`), whole or not
    at all (a temporary file beside it, then renamed). When that fails anyway (the disk filled, the directory
    went away), the results are not lost: they go to a file of the temporary directory, and the command ends
    with one line naming both (exit status 1); when even that fails, on stdout.

    Args:
        data: the file's text (UTF-8) or bytes.
        what: what the results are, for that line ("the self-test results").

    Returns:
        ``path``.
    """
    target = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            mask = os.umask(0)
            os.umask(mask)
            os.fchmod(fd, 0o666 & ~mask)  # as open() would have made it (mkstemp makes 0600)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return target
    except OSError as exc:
        reason = exc.strerror or str(exc)
    try:
        fd, kept = tempfile.mkstemp(prefix=f"svcframe-{target.stem}-", suffix=target.suffix)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    except OSError:
        sys.stdout.buffer.write(raw)
        fail(f"cannot write {path} ({reason}), nor a file in {tempfile.gettempdir()}: {what} printed on stdout")
    fail(f"cannot write {path} ({reason}): {what} kept in {kept}")


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
    and an exit code of 1, after the others' results were printed (JSON keyed by address); when every member
    failed, stdout stays empty (a pipe gets no ``{}`` to mistake for a result)."""
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
        if len(failed) < len(results):
            echo_json({a: r for a, r in results.items() if a not in failed})
        sys.exit(1)
    return results


# -- output -------------------------------------------------------------------------------------------------------
#: Width of a console writing to a pipe or a file when ``$COLUMNS`` is not set: no limit, a row stays one line.
UNLIMITED_WIDTH = 100_000


def output_console(*, stderr: bool = False) -> Console:
    """A rich console for a command's output (``stderr``: for progress and notes).

    On a terminal: its width, or ``$COLUMNS`` when set. In a pipe or a file (an sbatch log): ``$COLUMNS`` when
    set, else no width limit, so a table row stays one line; no colour, no cursor codes. No highlighting of
    numbers: output reads the same in both.
    """
    from rich.console import Console

    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else None
    stream = sys.stderr if stderr else sys.stdout
    if width is None and not stream.isatty():
        width = UNLIMITED_WIDTH
    return Console(stderr=stderr, width=width, highlight=False)


def make_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, numeric: Collection[str] = (),
    console: Console | None = None,
) -> Any:  # fmt: skip
    """The rich ``Table`` of :func:`print_table` (for a live display): its layout follows ``console``."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    terminal = (console or output_console()).is_terminal
    table = Table(box=box.SIMPLE_HEAD if terminal else None, padding=(0, 1 if terminal else 2, 0, 0), pad_edge=False,
                  show_edge=False)  # fmt: skip
    for h in headers:
        table.add_column(h, justify="right" if h in numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(c if isinstance(c, Text) else Text("-" if c is None else str(c)) for c in row))
    return table


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None,
    numeric: Collection[str] = (), console: Console | None = None,
) -> None:  # fmt: skip
    """Print rows under headers, never cutting a value.

    On a terminal: a rule under the header, columns fitted to the width; a value longer than its column
    folds onto more lines (at spaces first), never ``…``. In a pipe or a file: plain columns two spaces
    apart, one line per row when ``$COLUMNS`` is not set, no trailing blanks. The title is a line of its own
    above (never squeezed to the table's width). Cells are text (no rich markup is read from them) or rich
    ``Text``; None prints as ``-``.

    Args:
        headers: column names.
        rows: one sequence of cells per row, as many as ``headers``.
        title: a line printed above the table.
        numeric: headers of the columns aligned right.
        console: where to print (default :func:`output_console`).
    """
    from rich.text import Text

    console = console or output_console()
    if title:
        emit(Text(title), console)
    emit(make_table(headers, rows, numeric=numeric, console=console), console)


def emit(renderable: Any, console: Console, **options: Any) -> None:
    """Print a rich renderable (``options``: those of ``Console.print``); in a pipe or a file without the blanks
    that pad its lines' ends."""
    if console.is_terminal:
        console.print(renderable, **options)
        return
    with console.capture() as captured:
        console.print(renderable, **options)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def print_lines(*lines: str, console: Console | None = None) -> None:
    """Plain text lines (no markup read), wrapped at spaces on a terminal, one line each in a pipe. A word longer
    than the line (a file's path) is never cut: it runs past the edge whole, so that it can be copied."""
    import textwrap

    from rich.text import Text

    console = console or output_console()
    for line in lines:
        for part in line.split("\n"):
            pieces = textwrap.wrap(part, console.width, break_long_words=False, break_on_hyphens=False)
            for piece in pieces or [""]:
                emit(Text(piece), console, overflow="ignore", crop=False)


def json_option(fn: F) -> F:
    """``--json``: print one JSON document (or JSON lines for a stream) instead of the tables."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document instead of tables (machine-readable)."
    )(fn)


def _clock(seconds: float | None) -> str:
    # 62.4 -> "0:01:02"; None -> "-"
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(max(0.0, seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class StepProgress:
    """Progress of a long command through ``total`` steps, on stderr.

    On a terminal: a rich progress bar (stage, bar, k/n, elapsed, ETA). Elsewhere (a pipe, an sbatch log):
    one plain line when each step starts, ``COMMAND: [k/n] DESCRIPTION, elapsed H:MM:SS, ETA H:MM:SS``, and
    one when it ends, so a log shows progress as it happens. The ETA is rich's: the steps done so far over
    the time they took (``-`` before the first ends).

    Use as a context manager; :meth:`step` when a step starts, :meth:`note` for what happens between steps,
    :meth:`finish` when all are done.
    """

    def __init__(self, command: str, total: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.command, self.total = command, total
        self._console = output_console(stderr=True)
        self.interactive = self._console.is_terminal
        self._progress: Progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), console=self._console, disable=not self.interactive,
            speed_estimate_period=7 * 24 * 3600.0,
        )  # fmt: skip
        self._task = self._progress.add_task(command, total=total)

    def __enter__(self) -> StepProgress:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def _line(self, text: str) -> None:
        # one line of a log, never wrapped (even under $COLUMNS): grep finds a step whole
        from rich.text import Text

        self._console.print(Text(text), soft_wrap=True)

    def _times(self) -> str:
        task = self._progress.tasks[0]
        return f"elapsed {_clock(task.elapsed)}, ETA {_clock(task.time_remaining)}"

    def note(self, description: str) -> None:
        """What the command does before or between steps (launching, attaching...): no step is counted."""
        self._progress.update(self._task, description=f"{self.command}: {description}")
        if not self.interactive:
            self._line(f"{self.command}: {description}, {self._times()}")

    def step(self, description: str, done: int) -> None:
        """Step ``done + 1`` of ``total`` starts (``done`` steps are complete); ``description`` names it."""
        self._progress.update(self._task, completed=done, description=f"{self.command}: {description}")
        if not self.interactive:
            self._line(f"{self.command}: [{done + 1}/{self.total}] {description}, {self._times()}")

    def finish(self, description: str = "done") -> None:
        """Every step is complete."""
        self._progress.update(self._task, completed=self.total, description=f"{self.command}: {description}")
        if not self.interactive:
            task = self._progress.tasks[0]
            self._line(f"{self.command}: {description} in {_clock(task.elapsed)}")
