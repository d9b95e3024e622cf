"""Attach the self-test provider to a live service that did not start with it, and detach it afterwards.

Quintain needs its provider in the service's Bedrock config; here the self-test reaches any running
svcframe service through its admin provider::

    attachment = await attach(engine, [(address, 0), ...])          # load_library + add_provider if missing
    try:
        ...run the self-test against attachment.provider_id...
    finally:
        await detach(engine, attachment)                              # remove only what attach added

The provider id: when the caller names one, every server must have a self-test provider there or a free
slot (it is added there). Otherwise an id at which every server already hosts a self-test provider is
used, else the lowest id that is free (or already a self-test provider) on every server.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from svcframe.admin import ServiceHandle
from svcframe.engine import Engine
from svcframe.errors import Refused, RemoteError, RPCError

from .driver import SelftestError

SELFTEST_LIBRARY = "selftest.provider"
SELFTEST_TYPE = "selftest"


@dataclass
class Attachment:
    """Where the self-test provider is: its id on every server, and where ``attach`` added it.

    Attributes:
        provider_id: the self-test provider's id on every server.
        added: ``(address, admin provider id, provider name)`` of the servers it was added to (``detach``
            removes those; it may run on another engine than ``attach``).
    """

    provider_id: int
    added: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def added_addresses(self) -> list[str]:
        return [a for a, _, _ in self.added]


def _short(exc: BaseException) -> str:
    return exc.remote_message if isinstance(exc, RemoteError) else str(exc)


def choose_provider_id(providers: list[dict[int, dict[str, Any]]], admin_ids: list[int], wanted: int | None) -> int:
    """The provider id to run the self-test at, given each server's providers by id (see module docstring).

    Raises:
        SelftestError: ``wanted`` is taken by another provider (or the admin) on some server.
    """
    if wanted is not None:
        for provs, admin_id in zip(providers, admin_ids, strict=True):
            other = provs.get(wanted)
            if wanted == admin_id or (other is not None and other["type"] != SELFTEST_TYPE):
                owner = "the admin provider" if other is None else f"{other['name']!r} (type {other['type']!r})"
                raise SelftestError(
                    f"provider id {wanted} is used by {owner} on a server; give another --provider-id or none"
                )
        return wanted
    hosted = [{pid for pid, p in provs.items() if p["type"] == SELFTEST_TYPE} for provs in providers]
    everywhere = set.intersection(*hosted) if hosted else set()
    if everywhere:
        return min(everywhere)
    for pid in range(1, 65536):
        if pid not in admin_ids and all(
            provs.get(pid) is None or provs[pid]["type"] == SELFTEST_TYPE for provs in providers
        ):
            return pid
    raise SelftestError("no provider id is free on every server")  # pragma: no cover


async def attach(
    engine: Engine, targets: list[tuple[str, int]], provider_id: int | None = None, *, timeout_seconds: float = 30.0
) -> Attachment:
    """Make sure every server in ``targets`` (``(address, admin provider id)``) hosts a self-test provider
    at one common id, adding it (library ``selftest.provider``, type ``selftest``) where it is missing.

    Raises:
        SelftestError: a server is unreachable, the id is taken, or a server refuses to add the provider
            (``admin.allow_mutations`` false); providers added before the failure are removed again.
    """
    handles = [ServiceHandle(engine, a, p, timeout_seconds=timeout_seconds) for a, p in targets]
    try:
        statuses = await asyncio.gather(*(h.status() for h in handles))
    except RPCError as exc:
        raise SelftestError(f"cannot reach a server's admin provider: {_short(exc)}") from exc
    providers = [{int(p["provider_id"]): p for p in st["providers"]} for st in statuses]
    chosen = choose_provider_id(providers, [p for _, p in targets], provider_id)
    missing = [(h, provs) for h, provs in zip(handles, providers, strict=True) if chosen not in provs]

    async def add(handle: ServiceHandle, provs: dict[int, dict[str, Any]]) -> tuple[str, int, str]:
        names = {p["name"] for p in provs.values()}
        name = SELFTEST_TYPE if SELFTEST_TYPE not in names else f"{SELFTEST_TYPE}_{chosen}"
        await handle.load_library(SELFTEST_LIBRARY)
        await handle.add_provider({"name": name, "type": SELFTEST_TYPE, "provider_id": chosen})
        return handle.address, handle.provider_id, name

    outs = await asyncio.gather(*(add(h, provs) for h, provs in missing), return_exceptions=True)
    attachment = Attachment(chosen, [o for o in outs if isinstance(o, tuple)])
    failures = [(h, o) for (h, _), o in zip(missing, outs, strict=True) if isinstance(o, BaseException)]
    if failures:
        await detach(engine, attachment)
        handle, error = failures[0]
        if isinstance(error, Refused):
            raise SelftestError(
                f"{handle.address} has no self-test provider and refuses to add one: {_short(error)}; "
                f"or host it in the server's config (library {SELFTEST_LIBRARY!r}, type {SELFTEST_TYPE!r})"
            ) from error
        if isinstance(error, RPCError):
            raise SelftestError(f"cannot add the self-test provider at {handle.address}: {_short(error)}") from error
        raise error
    return attachment


async def detach(engine: Engine, attachment: Attachment, *, timeout_seconds: float = 30.0) -> list[str]:
    """Remove the providers ``attach`` added. Returns one message per server where that failed."""
    outs = await asyncio.gather(
        *(
            ServiceHandle(engine, address, admin_id, timeout_seconds=timeout_seconds).remove_provider(name)
            for address, admin_id, name in attachment.added
        ),
        return_exceptions=True,
    )
    problems = [
        f"{address}: cannot remove {name!r}: {_short(o)}"
        for (address, _, name), o in zip(attachment.added, outs, strict=True)
        if isinstance(o, BaseException)
    ]
    attachment.added = []
    return problems
