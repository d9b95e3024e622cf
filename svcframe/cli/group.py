"""``svcframe group view | watch | join | leave``: a group's view, through its members' group providers
(``svcframe.group_provider``).

Which group: ADDRESS arguments (members to ask) and/or ``-g/--group FILE`` (its members; ``$SVCFRAME_GROUP``
when neither is given). Which provider: ``--provider-id``, else the group file's ``group_provider_id``, else
the first provider of type ``group`` (or ``flock``) each server's admin provider lists.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import SvcframeError
from ..group import GROUP_ENV, GROUP_PROVIDER_TYPES
from ..registration import MAX_PROVIDER_ID
from .common import describe, echo_json, fail, group_option, json_option, print_lines, print_table, read_secret


def _provider_id_option(fn: Any) -> Any:
    return click.option(
        "--provider-id", "-p", type=click.IntRange(0, MAX_PROVIDER_ID), default=None,
        help="The group provider's id (default: the group file's, else the provider of type group each server runs).",
    )(fn)  # fmt: skip


def _addresses(addresses: tuple[str, ...], group: str | None) -> tuple[list[str], dict[str, int]]:
    """The addresses to ask, and the group provider ids a group file gives for some of them."""
    path = group or (os.environ.get(GROUP_ENV) if not addresses else None)
    if not addresses and not path:
        fail(f"give at least one ADDRESS or -g/--group FILE (or set {GROUP_ENV})", 2)
    out, ids = list(addresses), {}
    if path:
        try:
            doc = json.loads(Path(path).read_text())
        except OSError as exc:
            fail(f"group file {path}: cannot read: {exc.strerror}", 2)
        except ValueError as exc:
            fail(f"group file {path}: not JSON ({exc})", 2)
        members = doc.get("members") if isinstance(doc, dict) else None
        if not isinstance(members, list) or not members:
            fail(f'group file {path}: not a group file (expected {{"members": [...]}})', 2)
        meta = doc.get("metadata", {}).get("group", {}) if isinstance(doc.get("metadata"), dict) else {}
        default = meta.get("provider_id") if isinstance(meta, dict) else None
        for m in members:
            if isinstance(m, dict) and isinstance(m.get("address"), str):
                out.append(m["address"])
                gid = m.get("group_provider_id", default)
                if type(gid) is int:
                    ids[m["address"]] = gid
    return list(dict.fromkeys(out)), ids


async def _group_id(engine: Any, address: str, given: int | None, ids: dict[str, int]) -> int:
    """The group provider's id at ``address``: given, from the group file, else looked up by type."""
    if given is not None:
        return given
    if address in ids:
        return ids[address]
    status = await engine.call(address, "status", None, provider_id=0, timeout_seconds=5.0)
    for p in status.get("providers", []) if isinstance(status, dict) else []:
        if p.get("type") in GROUP_PROVIDER_TYPES:
            return int(p["provider_id"])
    raise SvcframeError(f"{address} runs no group provider (no provider of type group); give --provider-id")


async def _first_answer(
    engine: Any, addresses: list[str], provider_id: int | None, ids: dict[str, int], rpc: str, arg: Any,
    timeout_seconds: float,
) -> tuple[str, int, Any]:  # fmt: skip
    """(address, group provider id, result) of the first address that answers ``rpc`` with a group."""
    problems = []
    for address in addresses:
        try:
            gid = await _group_id(engine, address, provider_id, ids)
            result = await engine.call(address, rpc, arg, provider_id=gid, timeout_seconds=timeout_seconds)
        except SvcframeError as exc:
            problems.append(f"{address}: {describe(exc)}")
            continue
        if rpc != "view" or (isinstance(result, dict) and result.get("members")):
            return address, gid, result
        problems.append(f"{address}: not in a group (it left)")
    raise SvcframeError("no member answered: " + "; ".join(problems[:3]))


def _run(coro: Any) -> Any:
    from ..engine import Engine
    from ..loops import run

    async def go() -> Any:
        async with Engine(None, secret=read_secret()) as engine:
            return await coro(engine)

    try:
        return run(go())
    except SvcframeError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        sys.exit(130)


def _print_view(view: dict[str, Any], source: str) -> None:
    members = view.get("members", [])
    print_table(
        ["rank", "address", "host", "pid", "member id"],
        [[m.get("rank"), m.get("address"), m.get("host"), m.get("pid"), m.get("member_id")] for m in members],
        title=f"group: version {view.get('version')}, {len(members)} member(s), digest {view.get('digest')} "
        f"(as {source} sees it)",
        numeric=("rank", "pid"),
    )


@click.group()
def group() -> None:
    """Read and change a group's view (version, members): the group providers that know who is alive."""


@group.command("view")
@click.argument("address", nargs=-1)
@group_option
@_provider_id_option
@json_option
@click.option("--timeout-seconds", type=float, default=5.0, show_default=True)
def view_command(
    address: tuple[str, ...], group: str | None, provider_id: int | None, as_json: bool, timeout_seconds: float
) -> None:
    """Print the group's view, as the first member that answers sees it."""
    addresses, ids = _addresses(address, group)

    async def go(engine: Any) -> tuple[str, Any]:
        where, _, view = await _first_answer(engine, addresses, provider_id, ids, "view", None, timeout_seconds)
        return where, view

    where, view = _run(go)
    if as_json:
        echo_json({**view, "source": where})
    else:
        _print_view(view, where)


def _describe_change(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    def label(m: dict[str, Any]) -> str:
        return f"rank {m['rank']} ({m['address']})" if "rank" in m else str(m.get("address"))

    members = new.get("members", [])
    head = f"version {new.get('version')}: {len(members)} member(s)"
    if old is None:
        return f"{head}: " + ", ".join(label(m) for m in members)
    before = {m.get("member_id"): m for m in old.get("members", [])}
    after = {m.get("member_id"): m for m in members}
    parts = [f"+{label(m)}" for i, m in after.items() if i not in before]
    parts += [f"-{label(m)}" for i, m in before.items() if i not in after]
    return f"{head}: " + (", ".join(parts) if parts else "members changed their description")


@group.command("watch")
@click.argument("address", nargs=-1)
@group_option
@_provider_id_option
@json_option
@click.option("--count", type=click.IntRange(1), default=None, help="Stop after this many views (default: never).")
@click.option("--timeout-seconds", type=float, default=5.0, show_default=True, help="Deadline of each request.")
def watch_command(
    address: tuple[str, ...], group: str | None, provider_id: int | None, as_json: bool, count: int | None,
    timeout_seconds: float,
) -> None:  # fmt: skip
    """Print the view, then one line (--json: one JSON line) at each change, until Ctrl-C or --count views. A
    member that stops answering is replaced by another."""
    addresses, ids = _addresses(address, group)

    async def go(engine: Any) -> None:
        where, gid, view = await _first_answer(engine, addresses, provider_id, ids, "view", None, timeout_seconds)
        old: dict[str, Any] | None = None
        shown = 0
        while True:
            if old is None or view.get("digest") != old.get("digest"):
                if as_json:  # JSON lines: one line each, whatever the terminal's width
                    click.echo(json.dumps({**view, "source": where}))
                else:
                    print_lines(_describe_change(old, view))
                sys.stdout.flush()
                shown += 1
                old = view
                if count is not None and shown >= count:
                    return
            try:
                view = await engine.call(where, "watch", {"version": view["version"], "timeout_seconds": 30.0},
                                         provider_id=gid, timeout_seconds=30.0 + timeout_seconds)  # fmt: skip
                if not view.get("members"):
                    raise SvcframeError(f"{where} left the group")
            except SvcframeError:  # that member is gone: ask the others (the last view's members first)
                known = [m["address"] for m in old.get("members", []) if m.get("address") != where]
                ids.update({m["address"]: m["group_provider_id"] for m in old.get("members", [])})
                where, gid, view = await _first_answer(
                    engine, [*known, *addresses], provider_id, ids, "view", None, timeout_seconds
                )

    _run(go)


@group.command("join")
@click.argument("address")
@group_option
@click.option("--via", "via", multiple=True, metavar="ADDRESS", help="A member of the group to join (repeatable).")
@_provider_id_option
@json_option
@click.option("--timeout-seconds", type=float, default=10.0, show_default=True)
def join_command(
    address: str, group: str | None, via: tuple[str, ...], provider_id: int | None, as_json: bool,
    timeout_seconds: float,
) -> None:  # fmt: skip
    """The group provider at ADDRESS joins the group whose members -g/--group FILE lists (or --via names); prints
    its view once it contacted them. Needs the shared secret (SVCFRAME_SECRET)."""
    named = bool(via or group or os.environ.get(GROUP_ENV))
    members, ids = _addresses(via, group) if named else ([], {})

    async def go(engine: Any) -> Any:
        gid = await _group_id(engine, address, provider_id, {})
        seeds = [[m, ids.get(m, gid)] for m in members if m != address]
        if not seeds:
            raise SvcframeError(f"give -g/--group FILE or --via ADDRESS: the group {address} should join")
        return await engine.call(address, "join", {"members": seeds}, provider_id=gid, timeout_seconds=timeout_seconds)

    view = _run(go)
    if as_json:
        echo_json({**view, "source": address})
    else:
        _print_view(view, address)


@group.command("leave")
@click.argument("address")
@group_option
@_provider_id_option
@json_option
@click.option("--timeout-seconds", type=float, default=10.0, show_default=True)
def leave_command(
    address: str, group: str | None, provider_id: int | None, as_json: bool, timeout_seconds: float
) -> None:
    """The member at ADDRESS leaves the group. If it does not answer, the members of -g/--group FILE (or
    $SVCFRAME_GROUP) remove it from the view. Needs the shared secret (SVCFRAME_SECRET)."""
    others, ids = _addresses((), group) if (group or os.environ.get(GROUP_ENV)) else ([], {})

    async def go(engine: Any) -> dict[str, Any]:
        try:
            gid = await _group_id(engine, address, provider_id, ids)
            await engine.call(address, "leave", None, provider_id=gid, timeout_seconds=timeout_seconds)
            return {"left": address, "by": address}
        except SvcframeError as exc:
            if not others:
                raise SvcframeError(
                    f"{address}: {describe(exc)} (give -g/--group FILE to have the others remove it)"
                ) from None
            first = describe(exc)
        rest = [a for a in others if a != address]
        where, _, _ = await _first_answer(engine, rest, provider_id, ids, "leave", {"address": address},
                                          timeout_seconds)  # fmt: skip
        return {"left": address, "by": where, "why": f"{address} did not answer ({first})"}

    result = _run(go)
    if as_json:
        echo_json(result)
    elif result["by"] == result["left"]:
        print_lines(f"{address} left the group")
    else:
        print_lines(f"{address} removed from the group by {result['by']}: {result['why']}")
