"""The admin provider: present in every server at the reserved provider id (0 by default, as Bedrock's).

RPCs (all take one msgpack argument, shown here as its fields):

=================  ==========================  ==================================================
RPC                argument                    result
=================  ==========================  ==================================================
get_config         -                           the live bootstrap document (re-launchable)
query_config       expression (JMESPath)       the expression evaluated on the live document
patch_config       JSON Patch (RFC 6902)       the new live document; live settings only  (mutation)
status             -                           address, pid, providers, closing
list_rpcs          -                           the registration table: [{provider_id, name, owner}]
statistics         {"reset": bool}             engine statistics (progress loop, per-RPC times)
add_provider       provider description        the provider id assigned             (mutation)
remove_provider    name                        null                                 (mutation)
load_library       module name                 provider types it registered         (mutation)
shutdown           -                           null; the server drains and exits    (mutation)
=================  ==========================  ==================================================

Mutations are refused with ``Refused`` when ``admin.allow_mutations`` is false. Queries run JMESPath on
the server (a query language, never ``eval``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .engine import Engine, Request
from .errors import ConfigError, Refused
from .provider import Provider, load_library, rpc

if TYPE_CHECKING:
    from .server import Server


class AdminProvider(Provider):
    type_name = "admin"

    def __init__(self, engine: Engine, provider_id: int, *, server: Server) -> None:
        super().__init__(engine, provider_id, name="admin")
        self.server = server

    def _mutation(self, what: str) -> None:
        if not self.server.config.admin.allow_mutations:
            raise Refused(f"{what} refused: admin.allow_mutations is false in this server's config")

    @rpc
    def get_config(self, req: Request, _: Any) -> dict[str, Any]:
        return self.server.live_config()

    @rpc
    def query_config(self, req: Request, expression: Any) -> Any:
        import jmespath
        from jmespath.exceptions import JMESPathError

        if not isinstance(expression, str):
            raise ConfigError("query_config takes a JMESPath expression (a string)")
        try:
            return jmespath.search(expression, self.server.live_config())
        except JMESPathError as exc:
            raise ConfigError(f"invalid JMESPath expression {expression!r}: {exc}") from None

    @rpc
    def status(self, req: Request, _: Any) -> dict[str, Any]:
        return self.server.status()

    @rpc
    def list_rpcs(self, req: Request, _: Any) -> list[dict[str, Any]]:
        return [
            {"provider_id": r.provider_id, "name": r.name, "provider": getattr(r.owner, "name", None)}
            for r in self.engine.registrations()
        ]

    @rpc
    def statistics(self, req: Request, arg: Any) -> dict[str, Any]:
        stats = self.engine.statistics()
        if isinstance(arg, dict) and arg.get("reset"):
            self.engine.monitor.reset()
        return stats

    @rpc
    def patch_config(self, req: Request, patch: Any) -> dict[str, Any]:
        self._mutation("patch_config")
        if not isinstance(patch, list):
            raise ConfigError("patch_config takes a JSON Patch: a list of operations")
        return self.server.patch_config(patch)

    @rpc
    async def add_provider(self, req: Request, description: Any) -> int:
        self._mutation("add_provider")
        if not isinstance(description, dict):
            raise ConfigError("add_provider takes a provider description (a JSON object)")
        return await self.server.add_provider(description)

    @rpc
    async def remove_provider(self, req: Request, name: Any) -> None:
        self._mutation("remove_provider")
        await self.server.remove_provider(str(name))

    @rpc
    def load_library(self, req: Request, module: Any) -> list[str]:
        self._mutation("load_library")
        types = load_library(str(module))
        if module not in self.server.config.libraries:
            self.server.config.libraries = [*self.server.config.libraries, str(module)]
        return types

    @rpc
    def shutdown(self, req: Request, _: Any) -> None:
        self._mutation("shutdown")
        # Answer first: the response leaves with this batch, then the server drains and exits.
        asyncio.get_running_loop().call_soon(self.server.request_shutdown)


class ServiceHandle:
    """Client side of one server's admin provider (Bedrock's ``ServiceHandle``)."""

    def __init__(self, engine: Engine, address: str, provider_id: int = 0, *, timeout_seconds: float | None = None):
        self.engine = engine
        self.address = address
        self.provider_id = provider_id
        self.timeout_seconds = timeout_seconds

    async def _call(self, name: str, arg: Any = None) -> Any:
        return await self.engine.call(
            self.address, name, arg, provider_id=self.provider_id, timeout_seconds=self.timeout_seconds
        )

    async def get_config(self) -> dict[str, Any]:
        return await self._call("get_config")  # type: ignore[no-any-return]

    async def query_config(self, expression: str) -> Any:
        return await self._call("query_config", expression)

    async def status(self) -> dict[str, Any]:
        return await self._call("status")  # type: ignore[no-any-return]

    async def list_rpcs(self) -> list[dict[str, Any]]:
        return await self._call("list_rpcs")  # type: ignore[no-any-return]

    async def statistics(self, reset: bool = False) -> dict[str, Any]:
        return await self._call("statistics", {"reset": reset})  # type: ignore[no-any-return]

    async def patch_config(self, patch: list[dict[str, Any]]) -> dict[str, Any]:
        return await self._call("patch_config", patch)  # type: ignore[no-any-return]

    async def set_progress(self, mode: str, spindown_msec: float | None = None) -> dict[str, Any]:
        """Switch the server's progress mode (and optionally its spindown window) live."""
        patch = [{"op": "replace", "path": "/engine/progress_mode", "value": mode}]
        if spindown_msec is not None:
            patch.append({"op": "replace", "path": "/engine/progress_spindown_msec", "value": spindown_msec})
        return await self.patch_config(patch)

    async def add_provider(self, description: dict[str, Any]) -> int:
        return await self._call("add_provider", description)  # type: ignore[no-any-return]

    async def remove_provider(self, name: str) -> None:
        await self._call("remove_provider", name)

    async def load_library(self, module: str) -> list[str]:
        return await self._call("load_library", module)  # type: ignore[no-any-return]

    async def shutdown(self) -> None:
        await self._call("shutdown")


class ServiceGroupHandle:
    """Fan an admin call out to every member of a group; results keyed by address.

    A member that fails contributes its exception object instead of a result.
    """

    def __init__(self, engine: Engine, members: list[tuple[str, int]], *, timeout_seconds: float | None = None):
        self.handles = [ServiceHandle(engine, a, pid, timeout_seconds=timeout_seconds) for a, pid in members]

    async def call(self, method: str, *args: Any) -> dict[str, Any]:
        outs = await asyncio.gather(*(getattr(h, method)(*args) for h in self.handles), return_exceptions=True)
        return {h.address: out for h, out in zip(self.handles, outs, strict=True)}
