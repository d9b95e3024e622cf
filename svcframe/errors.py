"""Every error svcframe raises, grouped by what the caller can do about it, and the one table between
the wire's status codes and those errors.

::

    SvcframeError
    ├── ConfigError                 the bootstrap config or a runtime change is invalid: fix the input
    ├── UsageError                  a local call was given impossible arguments (also a ValueError): fix the call
    │   └── BulkUsageError          a bulk buffer, range or access mode that cannot work (checked locally)
    ├── LaunchError                 a server process failed to start (svcframe.launch)
    ├── GroupError                  a group of servers could not be formed, or its group file read
    ├── RPCError                    a call did not produce a result
    │   ├── DeadlineExceeded        the deadline passed; the outcome is unknown (the handler may have run):
    │   │   │                       retry only what is safe to retry. NOT an OSError / builtin TimeoutError
    │   │   └── Dropped             the server dropped the request before its handler started: safe to retry
    │   ├── ConnectionLost          the peer went away or could not be reached: check the server, reconnect
    │   │   └── AuthenticationFailed    the handshake was refused: check the shared secret
    │   ├── NoSuchProvider          nothing at that provider id: check the address and provider id
    │   ├── NoSuchRPC               the provider has no RPC of that name: check the name
    │   ├── AppError                the handler failed on purpose (code, message, details): see .code
    │   ├── RemoteError             the remote handler raised unexpectedly: see .remote_type, .remote_traceback
    │   ├── ResultTooLarge          the result is over the caller's max_body_bytes: raise it, or use bulk
    │   ├── Refused                 the server will not take the call
    │   │   ├── ShuttingDown        the server is draining: retry elsewhere or later (idempotent calls are)
    │   │   ├── ProviderUnavailable the provider is being removed: look it up again
    │   │   ├── Overloaded          a connection or in-flight cap was reached: back off
    │   │   └── NotPermitted        not allowed on this server or connection
    │   │       ├── MutationsDisabled   admin.allow_mutations is false
    │   │       └── Unauthenticated     needs a connection authenticated with the shared secret
    │   ├── Cancelled               the call was cancelled before it produced a result
    │   └── BulkError               the peer refused a bulk transfer (unknown or revoked handle, bad range)
    └── ProtocolError               bytes on the wire broke the protocol
        ├── LocalProtocolError      we were asked to send something invalid (our bug or bad arguments)
        └── RemoteProtocolError     the peer sent something invalid; its connection is dropped
            └── FrameTooLarge       a frame announced a body larger than the configured maximum

``DeadlineExceeded`` deliberately does not derive from the builtin ``TimeoutError`` (an ``OSError``): an
``except OSError`` around a socket or a system call must never swallow a deadline (a cross-memory
attach push past its deadline would be reported as "CMA refused"). ``TimeoutError_`` is kept as an alias.

Lower layers raise these; the engine translates socket and codec exceptions at its boundary and keeps
the original as ``__cause__``. A server answers a failed call with a ``Status`` and a msgpack body; the
caller turns that into an exception with ``error_from_status``, and a handler's exception becomes a status
with ``status_for`` (the same table, both ways). No code decides by reading an error's message text.
"""

from __future__ import annotations

import enum
from typing import Any


class Status(enum.IntEnum):
    """Status of a RESPONSE (and of a GOODBYE) on the wire. Values are part of the wire format: never
    renumber; new ones are appended (a peer that does not know one reports a plain ``RPCError``)."""

    OK = 0
    HANDLER_ERROR = 1  # body [type, message, traceback] (traceback empty unless the caller is trusted)
    NO_SUCH_PROVIDER = 2
    NO_SUCH_RPC = 3
    DEADLINE_EXCEEDED = 4  # the handler started: its outcome is unknown
    CANCELLED = 5
    REFUSED = 6  # provider being removed (kept for older peers)
    BAD_REQUEST = 7
    UNAUTHENTICATED = 8
    BULK_ERROR = 9
    SHUTTING_DOWN = 10
    DROPPED = 11  # the deadline passed before the handler started: it never ran
    APP_ERROR = 12  # body [code, message, details]
    NOT_PERMITTED = 13
    OVERLOADED = 14
    MUTATIONS_DISABLED = 15
    RESULT_TOO_LARGE = 16  # the result is over the caller's frame limit (announced in its HELLO)
    #: not an error: the result of a read into the caller's buffer, lent by address for the caller to copy
    #: (body [size, address, bulk id]; only to requests flagged INTO and CMA: svcframe.bulk_serving._lend)
    LENT = 17


class SvcframeError(Exception):
    """Base of every svcframe error."""


class ConfigError(SvcframeError, ValueError):
    """A configuration document or a runtime change to it is invalid."""


class UsageError(SvcframeError, ValueError):
    """A local call was given arguments it cannot act on; nothing was sent."""


class BulkUsageError(UsageError):
    """A bulk call that cannot work, found before anything is sent: a buffer that is not contiguous or not
    writable, an unknown mode, a range outside the handle, a wrong access mode, a destination too small."""


class LaunchError(SvcframeError):
    """A server process failed to start; the message says which and why."""


class GroupError(SvcframeError):
    """A group of servers could not be formed (a rank missing after the timeout, bad launcher variables),
    or a group file could not be read."""


class RPCError(SvcframeError):
    """A remote call did not produce a result."""


class DeadlineExceeded(RPCError):
    """The call's deadline passed before a result arrived. The handler may have run (a write may have been
    applied): retry only calls that are safe to retry. Not an ``OSError``."""


class Dropped(DeadlineExceeded):
    """The server dropped the request when its deadline passed before the handler started: it never ran,
    so it is safe to send again."""


TimeoutError_ = DeadlineExceeded  # an older name, kept for callers


class ConnectionLost(RPCError):
    """The connection to the peer was lost or could not be set up."""


class AuthenticationFailed(ConnectionLost):
    """The peer refused the connection handshake (missing or wrong shared secret)."""


class NoSuchProvider(RPCError):
    """No provider is registered at the requested provider id."""


class NoSuchRPC(RPCError):
    """The provider exists but has no RPC of the requested name."""


class AppError(RPCError):
    """An expected failure a handler reports on purpose (gRPC's status with details; grpclib ``GRPCError``).

    A handler raises it (or a subclass that sets ``code``); the caller receives an ``AppError`` with the
    same code, message and details. No traceback is sent.

    Attributes:
        code: a short stable identifier, e.g. ``"NotFound"``, ``"ValueTooLarge"`` (str).
        message: text for a person.
        details: msgpack-encodable data for a program (e.g. ``{"limit": 1048576}``), or None.
    """

    code: str = "AppError"

    def __init__(self, message: str = "", *, code: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class RemoteError(RPCError):
    """The remote handler raised an unexpected exception.

    Attributes:
        remote_type: qualified name of the remote exception class, e.g. ``"KeyError"``.
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the formatted remote traceback (text); empty unless the server sends tracebacks
            to this caller (an authenticated connection, or ``engine.send_tracebacks``).
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str) -> None:
        super().__init__(f"remote handler raised {remote_type}: {remote_message}")
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        if not self.remote_traceback:
            return str(self.args[0])
        return f"{self.args[0]}\n--- remote traceback ---\n{self.remote_traceback}"


class ResultTooLarge(RPCError):
    """The handler's result is larger than the caller accepts (its ``max_body_bytes``, announced when it
    connected): raise the caller's limit, or have the handler push the data into a bulk buffer the caller
    exposes. The handler ran."""


class Refused(RPCError):
    """The server refused the call; the subclass says why."""


class ShuttingDown(Refused):
    """The server is shutting down (draining): try another server or later."""


class ProviderUnavailable(Refused):
    """The provider is being removed: new calls are refused while in-flight ones finish."""


class Overloaded(Refused):
    """A connection or in-flight cap of the server was reached: back off and retry."""


class NotPermitted(Refused):
    """The server does not allow this call."""


class MutationsDisabled(NotPermitted):
    """The server's config sets ``admin.allow_mutations`` to false."""


class Unauthenticated(NotPermitted):
    """The call needs a connection authenticated with the shared secret."""


class Cancelled(RPCError):
    """The call was cancelled before it produced a result."""


class BulkError(RPCError):
    """The peer refused or failed a bulk transfer: unknown or revoked bulk handle, wrong access mode, range
    out of bounds on its side."""


class ProtocolError(SvcframeError):
    """Bytes on the wire broke the protocol."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol cannot carry."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol; its connection is dropped."""


class FrameTooLarge(RemoteProtocolError):
    """A frame announced a body larger than the configured maximum; rejected before buffering."""


# -- the status <-> exception table ----------------------------------------------------------------------
#: Exceptions a handler may raise to refuse a call on purpose, and the status each travels as (most
#: specific first: the first isinstance match wins).
_REFUSAL_STATUS: tuple[tuple[type[Refused], Status], ...] = (
    (ShuttingDown, Status.SHUTTING_DOWN),
    (MutationsDisabled, Status.MUTATIONS_DISABLED),
    (Unauthenticated, Status.UNAUTHENTICATED),
    (NotPermitted, Status.NOT_PERMITTED),
    (Overloaded, Status.OVERLOADED),
    (Refused, Status.REFUSED),
)


def status_for(exc: BaseException) -> Status:
    """The wire status that carries ``exc`` raised by a handler: a ``Refused`` subclass as its refusal, an
    ``AppError`` as APP_ERROR, a ``ResultTooLarge`` and a ``BulkError`` as theirs, anything else as
    HANDLER_ERROR."""
    if isinstance(exc, AppError):
        return Status.APP_ERROR
    if isinstance(exc, ResultTooLarge):
        return Status.RESULT_TOO_LARGE
    if isinstance(exc, BulkError):  # the caller's bulk handle failed: the caller gets BulkError
        return Status.BULK_ERROR
    if isinstance(exc, Refused):
        for cls, status in _REFUSAL_STATUS:
            if isinstance(exc, cls):
                return status
    return Status.HANDLER_ERROR


def error_from_status(status: int, info: Any, name: str, provider_id: int, address: str | None) -> RPCError:
    """The exception a caller raises for a non-OK response.

    Args:
        status: the response's status (``Status`` value; unknown values give a plain ``RPCError``).
        info: the decoded response body (a message string, or the list the status defines).
        name: the call's RPC name, named in the message.
        provider_id: the call's provider id, named in the message.
        address: the server's address, named in the message.
    """
    where = f"{name!r} (provider {provider_id}) at {address}"
    if status == Status.HANDLER_ERROR and isinstance(info, list) and len(info) == 3:
        return RemoteError(str(info[0]), str(info[1]), str(info[2]))
    if status == Status.APP_ERROR and isinstance(info, list) and len(info) == 3:
        return AppError(str(info[1]), code=str(info[0]), details=info[2])
    if status == Status.NO_SUCH_PROVIDER:
        return NoSuchProvider(f"no provider with id {provider_id} at {address} (is it registered?)")
    if status == Status.NO_SUCH_RPC:
        return NoSuchRPC(f"provider {provider_id} at {address} has no RPC named {name!r}")
    if status == Status.CANCELLED:
        return Cancelled(f"{where} was cancelled")
    if status == Status.BULK_ERROR:
        return BulkError(f"{where}: {info}")
    if status == Status.DROPPED:
        return Dropped(f"{where}: the server dropped the request before it ran (its deadline had passed)")
    if status == Status.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{where}: the deadline passed while the handler ran; its outcome is unknown")
    if status == Status.SHUTTING_DOWN:
        return ShuttingDown(f"{where} refused: the server is shutting down")
    if status == Status.REFUSED:
        return ProviderUnavailable(f"{where} refused: {info}")
    if status == Status.UNAUTHENTICATED:
        return Unauthenticated(f"{where} refused: {info}")
    if status == Status.MUTATIONS_DISABLED:
        return MutationsDisabled(f"{where} refused: {info}")
    if status == Status.NOT_PERMITTED:
        return NotPermitted(f"{where} refused: {info}")
    if status == Status.OVERLOADED:
        return Overloaded(f"{where} refused: {info}")
    if status == Status.BAD_REQUEST:
        return RemoteError("BadRequest", str(info), "")
    if status == Status.RESULT_TOO_LARGE:
        return ResultTooLarge(f"{where}: {info}")
    return RPCError(f"{where} failed with status {status}: {info}")
