"""svcframe: an asyncio runtime for HPC-style data services (Mochi's Margo + Bedrock + Quintain, in Python).

Layers, top to bottom (imports only go down; tests/test_layers.py checks): cli / launch -> server, config,
admin, group -> providers -> engine (engine, bulk, progress, plumber, monitoring) -> transport -> wire. The
application (``providers``, ``selftest``) imports svcframe, never the reverse: the self-test's commands join the
CLI as plugins (``svcframe.cli``).

The names below are imported when first used (PEP 562): ``import svcframe.wire`` or ``svcframe.loops`` loads
that module and what it needs, not the whole framework (a raw peer of ``svcframe bench`` or a client process
loads no engine it does not run).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import compiled as _compiled  # noqa: F401  (first: SVCFRAME_PURE applies to every module imported after it)

if TYPE_CHECKING:
    from .admin import ServiceGroupHandle, ServiceHandle
    from .bulk_handles import BulkHandle
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

#: Each public name, by the module that defines it.
_EXPORTS = {
    "ServiceGroupHandle": "admin",
    "ServiceHandle": "admin",
    "BulkHandle": "bulk_handles",
    "Engine": "engine",
    "Request": "engine",
    "AppError": "errors",
    "AuthenticationFailed": "errors",
    "BulkError": "errors",
    "BulkUsageError": "errors",
    "Cancelled": "errors",
    "ConfigError": "errors",
    "ConnectionLost": "errors",
    "DeadlineExceeded": "errors",
    "Dropped": "errors",
    "GroupError": "errors",
    "LaunchError": "errors",
    "MutationsDisabled": "errors",
    "NoSuchProvider": "errors",
    "NoSuchRPC": "errors",
    "NotPermitted": "errors",
    "Overloaded": "errors",
    "ProtocolError": "errors",
    "ProviderUnavailable": "errors",
    "Refused": "errors",
    "RemoteError": "errors",
    "ResultTooLarge": "errors",
    "RPCError": "errors",
    "ShuttingDown": "errors",
    "SvcframeError": "errors",
    "TimeoutError_": "errors",
    "Unauthenticated": "errors",
    "UsageError": "errors",
    "Group": "group",
    "Member": "group",
    "read_group_file": "group",
    "ConfigContext": "provider",
    "Dependency": "provider",
    "Provider": "provider",
    "ProviderConfig": "provider",
    "ProviderHandle": "provider",
    "load_library": "provider",
    "register_provider_type": "provider",
    "rpc": "provider",
}

if TYPE_CHECKING:
    __version__: str


def _version() -> str:
    """One source: the version in pyproject.toml, as installed."""
    from importlib import metadata  # (here: reading the installed metadata is too slow for import time)

    try:
        return metadata.version("svcframe")
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if name == "__version__":
        value: Any = _version()
    elif module is None:
        raise AttributeError(f"module 'svcframe' has no attribute {name!r}")
    else:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once: later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "__version__"})


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
assert {*_EXPORTS, "__version__"} == {*__all__}, "svcframe/__init__.py: __all__ and _EXPORTS name the same names"
