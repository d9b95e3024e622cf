"""svcframe: an asyncio runtime for HPC-style data services (Mochi's Margo + Bedrock + Quintain, in Python).

Layers, top to bottom (imports only go down): cli / launch -> server, config, admin -> providers ->
engine (engine, bulk, progress, monitoring) -> transport -> wire.
"""

from importlib import metadata as _metadata

from .bulk import BulkHandle
from .engine import Engine, Request
from .errors import (
    AppError,
    AuthenticationFailed,
    BulkError,
    BulkUsageError,
    Cancelled,
    ConfigError,
    ConnectionLost,
    DeadlineExceeded,
    Dropped,
    GroupError,
    LaunchError,
    MutationsDisabled,
    NoSuchProvider,
    NoSuchRPC,
    NotPermitted,
    Overloaded,
    ProtocolError,
    ProviderUnavailable,
    Refused,
    RemoteError,
    RPCError,
    ShuttingDown,
    SvcframeError,
    TimeoutError_,
    Unauthenticated,
    UsageError,
)
from .provider import Provider, ProviderHandle, load_library, register_provider_type, rpc

try:  # one source: the version in pyproject.toml, as installed
    __version__ = _metadata.version("svcframe")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AppError",
    "AuthenticationFailed",
    "BulkError",
    "BulkHandle",
    "BulkUsageError",
    "Cancelled",
    "ConfigError",
    "ConnectionLost",
    "DeadlineExceeded",
    "Dropped",
    "Engine",
    "GroupError",
    "LaunchError",
    "MutationsDisabled",
    "NoSuchProvider",
    "NoSuchRPC",
    "NotPermitted",
    "Overloaded",
    "ProtocolError",
    "Provider",
    "ProviderHandle",
    "ProviderUnavailable",
    "RPCError",
    "Refused",
    "RemoteError",
    "Request",
    "ShuttingDown",
    "SvcframeError",
    "TimeoutError_",
    "Unauthenticated",
    "UsageError",
    "__version__",
    "load_library",
    "register_provider_type",
    "rpc",
]
