"""Argument generators for ``svcframe selftest run --rpc``: the worked examples of the kv and blob providers.

A generator is ``function(ctx, call) -> argument`` (``selftest/rpc_workload.py``): ``ctx.client`` is the client
process's index, ``call`` the call's index in that process, ``ctx.options`` the ``--arg-option KEY=VALUE``
given. Keys and names are unique per ``(client, call)``, so a write never overwrites another of the same run;
values are made once per client process (``ctx.payload``), so the generator costs little in the timed loop::

    svcframe selftest run -g group.json --rpc store:put --arg-generator selftest.generators:kv_put \\
        --arg-option value_bytes=1024
    svcframe selftest run -g group.json --rpc blobs:put --arg-generator selftest.generators:blob_put \\
        --arg-option size_bytes=1048576

Options common to all: ``prefix`` (default ``"selftest"``), the start of every key or name.
"""

from __future__ import annotations

from typing import Any

from .rpc_workload import ArgContext


def _name(ctx: ArgContext, call: int) -> str:
    return f"{ctx.options.get('prefix', 'selftest')}-{ctx.client}-{call}"


def kv_put(ctx: ArgContext, call: int) -> dict[str, Any]:
    """The kv provider's ``put``: key ``PREFIX-CLIENT-CALL``, a value of ``value_bytes`` (default 1024) bytes.

    Keep ``value_bytes`` at most the provider's ``inline_max_bytes`` (64 KiB by default; larger values are
    refused with ``ValueTooLarge``: measure ``put_bulk`` with :func:`kv_put_bulk`).
    """
    return {"key": _name(ctx, call), "value": ctx.payload(int(ctx.options.get("value_bytes", 1024)))}


def kv_put_bulk(ctx: ArgContext, call: int) -> dict[str, Any]:
    """The kv provider's ``put_bulk``: key ``PREFIX-CLIENT-CALL``; the server pulls ``value_bytes`` (default
    1 MiB) from a buffer the client exposed once."""
    size = int(ctx.options.get("value_bytes", 1 << 20))
    return {"key": _name(ctx, call), "bulk": ctx.expose(size, "r"), "size": size}


def kv_get(ctx: ArgContext, call: int) -> dict[str, Any]:
    """The kv provider's ``get`` of the keys a :func:`kv_put` run with as many clients wrote: key
    ``PREFIX-CLIENT-(CALL mod keys)``, ``keys`` (default 1000) being how many each client wrote (its warm-up
    and timed calls)."""
    return {"key": f"{ctx.options.get('prefix', 'selftest')}-{ctx.client}-{call % int(ctx.options.get('keys', 1000))}"}


def blob_put(ctx: ArgContext, call: int) -> dict[str, Any]:
    """The blob provider's ``put``: blob ``PREFIX-CLIENT-CALL`` of ``size_bytes`` (default 1 MiB), which the
    server pulls from a buffer the client exposed once."""
    size = int(ctx.options.get("size_bytes", 1 << 20))
    return {"name": _name(ctx, call), "bulk": ctx.expose(size, "r"), "size": size}
