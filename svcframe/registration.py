"""The registration table: which handler serves RPC ``name`` of provider ``provider_id``.

The table is the truth (grpclib's ``__mapping__``): one row per ``(provider_id, rpc_id)``, where ``rpc_id`` is
the CRC-32 of the name that travels in every request header (``svcframe.wire.rpc_id``). Providers fill it
with the ``@rpc`` decorator or ``Engine.register``; the admin provider lists it (``list_rpcs``). A provider
being removed is *refused*: its new calls are answered at once while the ones in flight complete.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .errors import ConfigError
from .wire import rpc_id

#: ``handler(request, arg) -> result``, sync or async (the request is a ``svcframe.request.Request``).
Handler = Callable[[Any, Any], Any]

#: Provider ids are 16-bit on the wire; 65535 is reserved (Bedrock: "choose one"; the wire: "no parent").
MAX_PROVIDER_ID = 0xFFFE


class Registration:
    """One row of the registration table: the handler of RPC ``name`` (wire id ``rpc_id``) of ``provider_id``,
    whether it is an ``async def`` (``is_coroutine``), the provider object that registered it (``owner``), and
    when its last failure was logged (``last_logged``, monotonic seconds: one traceback a second). Compared by
    identity (a statistics cache key)."""

    def __init__(
        self,
        provider_id: int,
        name: str,
        rpc_id: int,
        handler: Handler,
        is_coroutine: bool,
        owner: object = None,
        last_logged: float = -1e9,
    ) -> None:
        self.provider_id = provider_id
        self.name = name
        self.rpc_id = rpc_id
        self.handler = handler
        self.is_coroutine = is_coroutine
        self.owner = owner
        self.last_logged = last_logged

    def __repr__(self) -> str:
        return f"Registration({self.name!r}, provider_id={self.provider_id}, rpc_id={self.rpc_id:#010x})"


def row_key(provider_id: int, rpc_id: int) -> int:
    """The key of the row of RPC ``rpc_id`` (32 bits) of ``provider_id`` (16 bits) in ``RegistrationTable.rows``:
    one int, hashed without a tuple."""
    return (provider_id << 32) | rpc_id


class RegistrationTable:
    """The rows, by ``(provider_id, rpc_id)``, and which providers are refused.

    Args:
        names: where the name of every RPC id seen is recorded (the statistics print names, not ids).

    Attributes:
        rows: ``row_key(provider_id, rpc_id) -> Registration``; the request path reads it directly.
        refused: provider ids being removed -> the reason new calls get.
    """

    def __init__(self, names: dict[int, str] | None = None) -> None:
        self.rows: dict[int, Registration] = {}
        self.providers: dict[int, set[str]] = {}
        self.refused: dict[int, str] = {}
        self.names = names if names is not None else {}
        self.ids: dict[str, int] = {}  # RPC name -> wire id (a cache)

    def rpc_id(self, name: str) -> int:
        """The wire id of ``name`` (cached; recorded in ``names``)."""
        rid = self.ids.get(name)
        if rid is None:
            rid = self.ids[name] = rpc_id(name)
            self.names[rid] = name
        return rid

    def register(self, provider_id: int, name: str, handler: Handler, *, owner: object = None) -> Registration:
        """Add ``handler(request, arg) -> result`` (sync or async) as RPC ``name`` of ``provider_id``.

        Raises:
            ConfigError: provider id out of 0..65534, name already registered for that provider, or a
                CRC-32 collision between two names of the same provider.
        """
        if not 0 <= provider_id <= MAX_PROVIDER_ID:
            raise ConfigError(f"provider_id {provider_id} is outside 0..{MAX_PROVIDER_ID} (65535 is reserved)")
        rid = self.rpc_id(name)
        existing = self.rows.get(row_key(provider_id, rid))
        if existing is not None:
            what = "already registered" if existing.name == name else f"collides with {existing.name!r}"
            raise ConfigError(f"RPC {name!r} of provider {provider_id} {what}")
        reg = Registration(provider_id, name, rid, handler, inspect.iscoroutinefunction(handler), owner)
        self.rows[row_key(provider_id, rid)] = reg
        self.providers.setdefault(provider_id, set()).add(name)
        self.refused.pop(provider_id, None)
        return reg

    def deregister_provider(self, provider_id: int) -> None:
        """Remove every RPC of ``provider_id``; new calls to it get NoSuchProvider."""
        for name in self.providers.pop(provider_id, set()):
            self.rows.pop(row_key(provider_id, self.rpc_id(name)), None)
        self.refused.pop(provider_id, None)

    def refuse_provider(self, provider_id: int, reason: str) -> None:
        """Answer new calls to ``provider_id`` with ProviderUnavailable(reason); in-flight ones complete."""
        self.refused[provider_id] = reason

    def registrations(self) -> list[Registration]:
        """Every row, sorted by provider id and name."""
        return sorted(self.rows.values(), key=lambda r: (r.provider_id, r.name))
