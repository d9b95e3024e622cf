"""The admin verbs: ``status``, ``shutdown``, ``wait``, ``provider add|remove|list|lookup``, ``library load``, through
each server's admin provider (``svcframe.admin``). Every verb prints JSON keyed by address.

The verbs whose last argument is not an address (``provider add DESCRIPTION``, ``library load MODULE``...)
take ``[ADDRESS...] LAST``: the addresses, if any, come first.
"""

from __future__ import annotations

import os

import click

from ..config import ADMIN_PROVIDER_ID
from ..errors import SvcframeError
from ..group import GROUP_ENV
from .common import (
    addresses_then,
    echo_json,
    fail,
    group_option,
    json_argument,
    read_secret,
    resolve_targets,
    run_admin,
    target_options,
)


@click.command()
@target_options
def status(address: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Show each server's address, pid and providers."""
    echo_json(run_admin(resolve_targets(address, group, ranks), "status"))


@click.command()
@target_options
def shutdown(address: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Ask servers to drain and exit."""
    echo_json(run_admin(resolve_targets(address, group, ranks), "shutdown"))


@click.command()
@group_option
@click.option("--timeout-seconds", type=float, default=120.0, show_default=True,
              help="How long to wait for the group file and for every member to answer.")  # fmt: skip
def wait(group: str | None, timeout_seconds: float) -> None:
    """Wait until the group file exists and every member answers as its own (pid), then print their status:
    in a batch script, between starting servers in the background and calling them.

    A file left by an earlier run (its servers gone) is not taken for the group: the wait goes on until the
    new servers publish theirs, or the timeout names the members that do not answer."""
    from ..admin import wait_for_group
    from ..engine import Engine
    from ..loops import run

    path = group or os.environ.get(GROUP_ENV)
    if not path:
        fail(f"give -g/--group FILE (or set {GROUP_ENV})", 2)

    async def go() -> dict[str, object]:
        async with Engine(None, secret=read_secret()) as engine:
            return (await wait_for_group(engine, path, timeout_seconds=timeout_seconds))[1]

    try:
        echo_json(run(go()))
    except SvcframeError as exc:
        fail(str(exc))


@click.group()
def provider() -> None:
    """Add, remove, list and look up providers of running servers (through their admin provider)."""


@provider.command("add")
@addresses_then("DESCRIPTION")
@click.option("--timeout-seconds", type=float, default=60.0, show_default=True,
              help="Deadline of the call; bounds the wait for remote dependencies too.")  # fmt: skip
def provider_add(args: tuple[str, ...], group: str | None, ranks: list[int] | None, timeout_seconds: float) -> None:
    """Start a provider from a DESCRIPTION (JSON text or @FILE, a providers[] entry); print the provider id
    each server assigned.

    Example: svcframe provider add ADDRESS '{"name": "cache", "type": "kv", "config": {"path": ":memory:"}}'
    """
    *addresses, text = args
    description = json_argument(text, "the provider description")
    if not isinstance(description, dict):
        fail("the provider description must be a JSON object (a providers[] entry)")
    targets = resolve_targets(tuple(addresses), group, ranks)
    echo_json(run_admin(targets, "add_provider", description, timeout=timeout_seconds))


@provider.command("remove")
@addresses_then("NAME")
@click.option("--timeout-seconds", type=float, default=60.0, show_default=True)
def provider_remove(args: tuple[str, ...], group: str | None, ranks: list[int] | None, timeout_seconds: float) -> None:
    """Remove the provider NAME: new calls are refused at once, in-flight calls complete, then its resources
    are released. Refused while other providers depend on it."""
    *addresses, name = args
    echo_json(
        run_admin(resolve_targets(tuple(addresses), group, ranks), "remove_provider", name, timeout=timeout_seconds)
    )


@provider.command("list")
@target_options
@click.option("--rpcs", is_flag=True, help="Include each provider's registered RPCs.")
def provider_list(address: tuple[str, ...], group: str | None, ranks: list[int] | None, rpcs: bool) -> None:
    """Print each server's providers (name, type, provider id), keyed by address."""
    targets = resolve_targets(address, group, ranks)
    statuses = run_admin(targets, "status")
    out = {a: s["providers"] for a, s in statuses.items()}
    if rpcs:
        tables = run_admin(targets, "list_rpcs")
        for a, providers in out.items():
            admin_id = dict(targets).get(a, ADMIN_PROVIDER_ID)
            providers.insert(0, {"name": "admin", "type": "admin", "provider_id": admin_id})
            for p in providers:
                p["rpcs"] = [r["name"] for r in tables[a] if r["provider_id"] == p["provider_id"]]
    echo_json(out)


@provider.command("lookup")
@addresses_then("SPEC")
def provider_lookup(args: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Look up SPEC (NAME or TYPE:ID) on each server: {name, type, provider_id} or null."""
    *addresses, spec = args
    echo_json(run_admin(resolve_targets(tuple(addresses), group, ranks), "lookup_provider", spec))


@click.group()
def library() -> None:
    """Load provider libraries into running servers."""


@library.command("load")
@addresses_then("MODULE")
def library_load(args: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Import the Python MODULE (e.g. providers.kv) on each server; print the provider types it defines. It is
    added to the live config's libraries."""
    *addresses, module = args
    echo_json(run_admin(resolve_targets(tuple(addresses), group, ranks), "load_library", module))
