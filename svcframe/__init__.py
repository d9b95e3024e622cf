"""svcframe: an asyncio runtime for HPC-style data services (Mochi's Margo + Bedrock + Quintain, in Python).

Layers, top to bottom (imports only go down; tests/test_layers.py checks): cli / launch -> server, config,
admin, group -> providers -> engine (engine, bulk, progress, plumber, monitoring) -> transport -> wire. The
application (``providers``, ``selftest``) imports svcframe, never the reverse: the self-test's commands join the
CLI as plugins (``svcframe.cli``).
"""

from importlib import metadata as _metadata

from .admin import ServiceGroupHandle, ServiceHandle
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
    ResultTooLarge,
    RPCError,
    ShuttingDown,
    SvcframeError,
    TimeoutError_,
    Unauthenticated,
    UsageError,
)
from .group import Group, Member, read_group_file
from .provider import (
    ConfigContext,
    Dependency,
    Provider,
    ProviderConfig,
    ProviderHandle,
    load_library,
    register_provider_type,
    rpc,
)

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
    "ConfigContext",
    "ConfigError",
    "ConnectionLost",
    "DeadlineExceeded",
    "Dependency",
    "Dropped",
    "Engine",
    "Group",
    "GroupError",
    "LaunchError",
    "Member",
    "MutationsDisabled",
    "NoSuchProvider",
    "NoSuchRPC",
    "NotPermitted",
    "Overloaded",
    "ProtocolError",
    "Provider",
    "ProviderConfig",
    "ProviderHandle",
    "ProviderUnavailable",
    "RPCError",
    "Refused",
    "RemoteError",
    "Request",
    "ResultTooLarge",
    "ServiceGroupHandle",
    "ServiceHandle",
    "ShuttingDown",
    "SvcframeError",
    "TimeoutError_",
    "Unauthenticated",
    "UsageError",
    "__version__",
    "load_library",
    "read_group_file",
    "register_provider_type",
    "rpc",
]
