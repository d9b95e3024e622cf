"""svcframe: an asyncio runtime for HPC-style data services (Mochi's Margo + Bedrock + Quintain, in Python).

Layers, top to bottom (imports only go down): cli / launch -> server, config, admin -> providers ->
engine (engine, bulk, progress, monitoring) -> transport -> wire.
"""

from .bulk import BulkHandle
from .engine import Engine, Request
from .errors import (
    AuthenticationFailed,
    BulkError,
    Cancelled,
    ConfigError,
    ConnectionLost,
    NoSuchProvider,
    NoSuchRPC,
    ProtocolError,
    Refused,
    RemoteError,
    RPCError,
    SvcframeError,
    TimeoutError_,
)
from .provider import Provider, ProviderHandle, load_library, register_provider_type, rpc

__version__ = "0.1.0"

__all__ = [
    "AuthenticationFailed",
    "BulkError",
    "BulkHandle",
    "Cancelled",
    "ConfigError",
    "ConnectionLost",
    "Engine",
    "NoSuchProvider",
    "NoSuchRPC",
    "ProtocolError",
    "Provider",
    "ProviderHandle",
    "RPCError",
    "Refused",
    "RemoteError",
    "Request",
    "SvcframeError",
    "TimeoutError_",
    "__version__",
    "load_library",
    "register_provider_type",
    "rpc",
]
