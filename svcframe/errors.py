"""Every error svcframe raises, grouped by what the caller can do about it.

::

    SvcframeError
    ├── ConfigError                 the bootstrap config or a runtime change is invalid: fix the input
    ├── RPCError                    a call did not produce a result
    │   ├── TimeoutError_           the deadline passed (also an asyncio.TimeoutError): retry later, raise it
    │   ├── ConnectionLost          the peer went away or could not be reached: check the server, reconnect
    │   │   └── AuthenticationFailed    the handshake was refused: check the shared secret
    │   ├── NoSuchProvider          nothing at that provider id: check the address and provider id
    │   ├── NoSuchRPC               the provider has no RPC of that name: check the name
    │   ├── RemoteError             the remote handler raised: see .remote_type and .remote_traceback
    │   ├── Refused                 the server will not take the call (shutting down, provider removed,
    │   │                           overloaded, mutations disabled): go elsewhere or later
    │   ├── Cancelled               the call was cancelled before it produced a result
    │   └── BulkError               a bulk handle was unknown, expired, or the range was out of bounds
    └── ProtocolError               bytes on the wire broke the protocol
        ├── LocalProtocolError      we were asked to send something invalid (our bug or bad arguments)
        └── RemoteProtocolError     the peer sent something invalid; its connection is dropped
            └── FrameTooLarge       a frame announced a body larger than the configured maximum

Lower layers raise these; the engine translates socket and codec exceptions at its boundary and keeps
the original as ``__cause__``.
"""

from __future__ import annotations

import asyncio


class SvcframeError(Exception):
    """Base of every svcframe error."""


class ConfigError(SvcframeError, ValueError):
    """A configuration document or a runtime change to it is invalid."""


class RPCError(SvcframeError):
    """A remote call did not produce a result."""


class TimeoutError_(RPCError, asyncio.TimeoutError):
    """The call's deadline passed before a result arrived."""


class ConnectionLost(RPCError):
    """The connection to the peer was lost or could not be set up."""


class AuthenticationFailed(ConnectionLost):
    """The peer refused the connection handshake (missing or wrong shared secret)."""


class NoSuchProvider(RPCError):
    """No provider is registered at the requested provider id."""


class NoSuchRPC(RPCError):
    """The provider exists but has no RPC of the requested name."""


class RemoteError(RPCError):
    """The remote handler raised an exception.

    Attributes:
        remote_type: qualified name of the remote exception class, e.g. ``"KeyError"``.
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the formatted remote traceback (text).
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str) -> None:
        super().__init__(f"remote handler raised {remote_type}: {remote_message}")
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return f"{self.args[0]}\n--- remote traceback ---\n{self.remote_traceback}"


class Refused(RPCError):
    """The server refused the call (shutting down, provider removed, overloaded, not allowed)."""


class Cancelled(RPCError):
    """The call was cancelled before it produced a result."""


class BulkError(RPCError):
    """A bulk transfer failed: unknown or expired bulk handle, wrong access mode, or range out of bounds."""


class ProtocolError(SvcframeError):
    """Bytes on the wire broke the protocol."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol cannot carry."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol; its connection is dropped."""


class FrameTooLarge(RemoteProtocolError):
    """A frame announced a body larger than the configured maximum; rejected before buffering."""
