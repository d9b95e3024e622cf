"""What a handler learns about the call it serves: its ``Request``, and ``current_request`` for code it calls.

A handler's first argument is its ``Request``. Nested calls made while it runs (``engine.call`` from inside
the handler, or from the tasks an async handler spawns) read their parent from ``current_request``: its
callpath, RPC and provider, and its trace context.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from .wire import Frame

if TYPE_CHECKING:
    from .bulk_handles import BulkHandle
    from .registration import Registration
    from .transport import Connection

__all__ = ["EngineAPI", "Request", "current_callpath", "current_request"]


class EngineAPI(Protocol):
    """What a handler reaches through ``request.engine``: the engine's public API for providers (nested
    calls and bulk transfers). ``svcframe.engine.Engine`` implements it; handlers and providers are typed
    against this, so the request path does not import the engine back."""

    engine_id: str

    @property
    def address(self) -> str | None: ...

    def call(
        self,
        address: str,
        name: str,
        arg: Any = None,
        *,
        provider_id: int = 0,
        timeout_seconds: float | None = None,
        idempotent: bool = False,
        max_attempts: int = 5,
    ) -> Coroutine[Any, Any, Any]: ...

    def expose(self, buffer: Any, mode: str = "r", *, peer: str | None = None) -> BulkHandle: ...

    def unexpose(self, handle: BulkHandle) -> None: ...

    async def pull(
        self,
        handle: BulkHandle,
        dest: Any = None,
        *,
        offset: int = 0,
        size: int | None = None,
        dest_offset: int = 0,
        timeout_seconds: float | None = None,
    ) -> Any: ...

    def push(
        self, handle: BulkHandle, src: Any, *, offset: int = 0, timeout_seconds: float | None = None
    ) -> Coroutine[Any, Any, None]: ...


class Request:
    """What a handler learns about the call it serves (its first argument).

    Attributes:
        engine: the engine serving the call (make nested calls and bulk transfers through it).
        conn: the connection the request arrived on.
        reg: its row of the registration table (``svcframe.registration.Registration``).
        frame: the REQUEST frame (``svcframe.wire.Frame``).
        arrival: loop time (seconds) when the request was received.
    """

    engine: EngineAPI
    conn: Connection
    reg: Registration
    frame: Frame
    arrival: float

    def __init__(self, engine: EngineAPI, conn: Connection, reg: Registration, frame: Frame, arrival: float) -> None:
        self.engine = engine
        self.conn = conn
        self.reg = reg
        self.frame = frame
        self.arrival = arrival

    def __repr__(self) -> str:
        return f"Request({self.reg.name!r}, provider_id={self.reg.provider_id}, request_id={self.frame.request_id})"

    @property
    def provider_id(self) -> int:
        return self.reg.provider_id

    @property
    def rpc_name(self) -> str:
        return self.reg.name

    @property
    def request_id(self) -> int:
        return self.frame.request_id

    @property
    def callpath(self) -> int:
        """The 64-bit chained hash of this call's ancestry."""
        return self.frame.callpath

    @property
    def deadline(self) -> float | None:
        """Loop time (seconds) after which the caller no longer waits; None when it set no deadline."""
        usec = self.frame.deadline_usec
        return self.arrival + usec / 1e6 if usec else None

    @property
    def peer_address(self) -> str | None:
        """The caller's listening address (None for a client-only engine)."""
        return self.conn.peer_address

    def remaining_seconds(self) -> float | None:
        """Time left before the caller gives up (None when it set no deadline)."""
        deadline = self.deadline
        return None if deadline is None else deadline - asyncio.get_running_loop().time()


#: The request of the async handler whose task runs in this context, and of the tasks it spawns.
_task_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar("svcframe_request", default=None)


class _SyncRequest(threading.local):
    """The request of the sync handler running on this thread (set and cleared around the call: a sync
    handler runs to completion, and two never nest). A thread-local costs a tenth of a contextvar."""

    request: Request | None = None


_sync = _SyncRequest()


class CurrentRequest:
    """``current_request.get()``: the request whose handler is running here, None outside any handler.
    Nested calls read their parent (callpath, RPC, provider, trace context) from it.

    Inside a sync handler it is that handler's request; inside an async handler's task (and the tasks it
    spawns, which copy its context) it is that handler's. Tasks a *sync* handler spawns run after it has
    returned and start a new callpath (as a ULT spawned from a Margo handler does); spawn them from an
    async handler to keep the parent.
    """

    __slots__ = ()

    def get(self) -> Request | None:
        req = _sync.request
        return req if req is not None else _task_request.get()


current_request = CurrentRequest()


def current_callpath() -> int:
    """The callpath of the handler running in this context (0 outside any handler)."""
    req = current_request.get()
    return req.frame.callpath if req is not None else 0
