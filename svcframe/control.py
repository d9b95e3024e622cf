"""What the admin provider may ask of the server that hosts it: a small interface, so that the admin
provider (``svcframe.admin``) does not import the server (``svcframe.server``), which creates it.

``svcframe.server.Server`` implements :class:`ServerControl` (structurally: it does not import this module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .config import ProviderSpec, ServiceConfig
    from .provider import Provider


class ServerControl(Protocol):
    """The server's side of the admin RPCs (see ``svcframe.admin`` for what each RPC returns)."""

    #: The live configuration (read: ``admin`` settings; ``live_config()`` is the document to return).
    config: ServiceConfig

    def live_config(self) -> dict[str, Any]:
        """The bootstrap document with every default filled in and every change since start."""
        ...

    def status(self) -> dict[str, Any]:
        """Bound address, pid, providers, closing, plumber choice."""
        ...

    def lookup_provider(self, spec: str) -> Provider | None:
        """The running provider ``NAME`` or ``TYPE:ID`` names, or None. Raises ConfigError (malformed spec)."""
        ...

    def patch_config(self, patch: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply a JSON Patch to the live settings; the new document. Raises ConfigError."""
        ...

    async def add_provider(self, spec: ProviderSpec | dict[str, Any], *, timeout_seconds: float | None = None) -> int:
        """Start a provider from a ``providers[]`` entry; its provider id. Raises ConfigError."""
        ...

    async def remove_provider(self, name: str) -> None:
        """Refuse new calls, drain, deregister and close a provider. Raises ConfigError."""
        ...

    def load_library(self, module: str) -> list[str]:
        """Import a provider library and record it in the live config; the provider types it defines."""
        ...

    def request_shutdown(self) -> None:
        """Drain and exit soon (the caller's reply leaves first)."""
        ...
