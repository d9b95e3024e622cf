"""Any RPC of any provider as a self-test workload: ``svcframe selftest run --rpc``.

The driver (``selftest/driver.py``) runs it as it runs ``noop``: client processes, ``depth`` calls in flight
each, warm-up, barrier, timed loop, one results document. What this module adds:

* **the target**: ``PROVIDER_ID:NAME`` (``1:put``) or ``PROVIDER_NAME:NAME`` (``store:put``), resolved
  before any client starts through every server's admin provider (``lookup_provider`` for a name, ``status``
  and ``list_rpcs`` to check that the provider and the RPC exist): :func:`resolve_rpc`;
* **the argument of each call**: one JSON value for every call (``--arg JSON`` or ``--arg @file.json``), or a
  generator (``--arg-generator module:function``) called for every call::

      def generator(ctx: ArgContext, call: int) -> Any

  ``ctx.client`` is the client process's index (0 .. ``ctx.clients`` - 1), ``call`` the index of the call in
  that process (0 for the first warm-up call, counting on through the timed loop and shared by its ``depth``
  workers, so ``(ctx.client, call)`` never repeats within a run); ``ctx.options`` the generator's options
  (``--arg-option KEY=VALUE``); ``ctx.payload(n)`` is ``n`` random bytes made once per client process and
  ``ctx.expose(n, mode)`` the wire form of a bulk handle over an ``n``-byte buffer exposed once per client
  process (``"r"``: the server pulls from it, ``"w"``: it pushes into it). The generator runs inside the
  timed loop: keep it cheap (``payload`` and ``expose`` cache). ``module`` is a module name (the current
  directory is searched first, as ``python -m`` does) or a ``path/to/file.py``. ``selftest/generators.py``
  ships the worked examples (kv ``put``/``get``, blob ``put``);
* **bytes per call**: each client process reads its own engine's statistics after the loop (the origin side
  of the RPC: msgpack request and response bodies, sampled as the engine samples them; plus every bulk byte
  the servers moved to or from its buffers, counted exactly): :func:`call_sizes`, merged over the clients by
  :func:`merge_call_sizes`, so the result converts to a roofline workload with its own bytes per call
  (:meth:`selftest.roofline.placement.Workload.from_selftest_results`). The 80-byte frame headers are not
  counted (the platform's bandwidth metric counts bulk payload alone).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from svcframe.packages import import_module


@dataclass(frozen=True)
class RpcTarget:
    """The RPC a workload calls, as resolved on the servers.

    Attributes:
        provider_id: the provider's id (the same on every server).
        name: the RPC's name.
        provider: the provider's name (``"store"``), as the servers report it.
        type: the provider's type (``"kv"``).
    """

    provider_id: int
    name: str
    provider: str
    type: str

    @property
    def spec(self) -> str:
        """``PROVIDER_ID:NAME``, the form the client processes call."""
        return f"{self.provider_id}:{self.name}"


def parse_rpc_spec(spec: str) -> tuple[int | str, str]:
    """``"1:put"`` -> ``(1, "put")``; ``"store:put"`` -> ``("store", "put")``.

    Raises:
        ValueError: not ``PROVIDER:NAME`` with both parts non-empty (the message shows the forms).
    """
    provider, sep, name = spec.rpartition(":")
    if not sep or not provider or not name:
        raise ValueError(f"--rpc {spec!r}: expected PROVIDER_ID:NAME (1:put) or PROVIDER_NAME:NAME (store:put)")
    return (int(provider), name) if provider.isdigit() else (provider, name)


async def resolve_rpc(engine: Any, targets: Sequence[tuple[str, int]], spec: str) -> RpcTarget:
    """Resolve ``spec`` on every server of ``targets`` (``(address, admin provider id)``) through its admin
    provider, and check that the RPC is registered there.

    Raises:
        ValueError: a malformed spec, or a server has no such provider or RPC, or hosts the named provider at
            different ids (the message names the server and what it has).
        SvcframeError: a server's admin provider cannot be reached (the engine's errors).
    """
    from svcframe.admin import ServiceHandle

    provider, name = parse_rpc_spec(spec)
    handles = [ServiceHandle(engine, address, admin_id) for address, admin_id in targets]
    found = await asyncio.gather(*(asyncio.gather(h.status(), h.list_rpcs()) for h in handles))
    resolved: RpcTarget | None = None
    for handle, (status, rpcs) in zip(handles, found, strict=True):
        by_id = {int(p["provider_id"]): p for p in status["providers"]}
        if isinstance(provider, int):
            info = by_id.get(provider)
        else:
            info = await handle.lookup_provider(provider)
        if info is None:
            hosted = ", ".join(f"{p['name']} ({pid})" for pid, p in sorted(by_id.items())) or "none"
            raise ValueError(f"--rpc {spec}: {handle.address} has no provider {provider!r} (it has: {hosted})")
        pid = int(info["provider_id"])
        names = sorted(r["name"] for r in rpcs if int(r["provider_id"]) == pid)
        if name not in names:
            raise ValueError(
                f"--rpc {spec}: provider {info['name']!r} ({pid}) at {handle.address} has no RPC {name!r} "
                f"(it has: {', '.join(names) or 'none'})"
            )
        target = RpcTarget(pid, name, str(info["name"]), str(info["type"]))
        if resolved is not None and target.provider_id != resolved.provider_id:
            raise ValueError(
                f"--rpc {spec}: the provider has id {resolved.provider_id} on {targets[0][0]} but {pid} on "
                f"{handle.address}; give PROVIDER_ID:NAME per group, or host it at one id"
            )
        resolved = target
    if resolved is None:
        raise ValueError(f"--rpc {spec}: no servers")
    return resolved


# -- arguments ----------------------------------------------------------------------------------------------------
@dataclass
class ArgContext:
    """What a generator knows of the client process it runs in (see the module docstring).

    Attributes:
        client: this client process's index, 0 .. ``clients`` - 1.
        clients: client processes in the run.
        options: the generator's options (``--arg-option KEY=VALUE``; values are JSON when they parse).
    """

    client: int
    clients: int
    options: Mapping[str, Any]
    engine: Any = field(repr=False, default=None)
    _payloads: dict[int, bytes] = field(default_factory=dict, repr=False)
    _exposed: dict[tuple[int, str], list[Any]] = field(default_factory=dict, repr=False)

    def payload(self, size_bytes: int) -> bytes:
        """``size_bytes`` random bytes, made once per client process and size."""
        data = self._payloads.get(size_bytes)
        if data is None:
            data = self._payloads[size_bytes] = os.urandom(size_bytes)
        return data

    def expose(self, size_bytes: int, mode: str = "r") -> list[Any]:
        """The wire form of a bulk handle over a ``size_bytes`` buffer of random bytes, exposed once per client
        process, size and mode (``"r"``: the server may pull it; ``"w"``: push into it; ``"rw"``), to put in
        the argument (e.g. ``{"bulk": ctx.expose(1 << 20)}``)."""
        wire = self._exposed.get((size_bytes, mode))
        if wire is None:
            if self.engine is None:
                raise RuntimeError("ArgContext.expose needs the client engine (called outside a self-test?)")
            buffer = bytearray(self.payload(size_bytes))
            wire = self._exposed[(size_bytes, mode)] = self.engine.expose(buffer, mode).to_wire()
        return wire


Generator = Callable[[ArgContext, int], Any]


def load_generator(spec: str) -> Generator:
    """The function ``module:function`` (or ``path/to/file.py:function``) names.

    A module name is looked up with the current directory first on ``sys.path`` (as ``python -m`` does; the
    client processes inherit it).

    Raises:
        ValueError: not ``MODULE:FUNCTION``, the module does not import (its error, one line), or it has no
            such callable.
    """
    module_name, sep, function = spec.rpartition(":")
    if not sep or not module_name or not function:
        raise ValueError(f"--arg-generator {spec!r}: expected module:function or path/to/file.py:function")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name).resolve()
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            if loader_spec is None or loader_spec.loader is None or not path.is_file():
                raise ImportError(f"no Python file {path}")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            cwd = os.getcwd()
            if cwd not in sys.path:
                sys.path.insert(0, cwd)
            module = import_module(module_name)  # selftest.generators: the repository's or the installed name
    except Exception as exc:  # the user's module: any failure is theirs to read, in one line
        raise ValueError(f"--arg-generator {spec}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"--arg-generator {spec}: {module_name} has no function {function!r}")
    return fn  # type: ignore[no-any-return]


def arguments(params: Any, rank: int, engine: Any) -> Callable[[], Any]:
    """The argument of each call of client ``rank``: a function of no argument returning the next one.

    The fixed argument (``params.rpc_arg``) is returned as is every time; a generator is called with the
    client's :class:`ArgContext` and the call index.
    """
    if params.rpc_arg_generator is None:
        arg = params.rpc_arg
        return lambda: arg
    generate = load_generator(params.rpc_arg_generator)
    ctx = ArgContext(rank, params.clients, dict(params.rpc_arg_options), engine)
    calls = iter(range(1 << 62))
    return lambda: generate(ctx, next(calls))


# -- bytes per call -----------------------------------------------------------------------------------------------
def call_sizes(statistics: Mapping[str, Any], name: str, provider_id: int) -> dict[str, Any]:
    """Bytes per call of RPC ``name`` at ``provider_id`` from one client engine's statistics
    (``Engine.statistics()``, svcframe/monitoring.py).

    Returns:
        ``{"calls": exact calls, "sampled_calls": calls whose sizes were recorded, "request_bytes_sum",
        "response_bytes_sum" (over the sampled calls), "bulk_bytes_sum" (every bulk transfer of this
        process's buffers, exact)}``.
    """
    rpcs = statistics.get("rpcs") or {}
    rows = [
        r
        for r in rpcs.get("origin") or []
        if r["rpc"] == name and r["provider_id"] == provider_id and not r.get("parent_rpc")
    ]
    return {
        "calls": sum(r["calls"] for r in rows),
        "sampled_calls": sum(r["request_bytes"]["count"] for r in rows),
        "request_bytes_sum": sum(r["request_bytes"]["sum"] for r in rows),
        "response_bytes_sum": sum(r["response_bytes"]["sum"] for r in rows),
        "bulk_bytes_sum": sum(r["bytes"]["sum"] for r in rpcs.get("bulk") or []),
    }


def merge_call_sizes(per_client: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Bytes per call over every client process (means weighted by calls).

    Returns:
        ``{"calls", "sampled_calls", "request_bytes_per_call", "response_bytes_per_call", "bulk_bytes_per_call",
        "bytes_per_call"}`` (their sum, rounded to a byte); zeros when nothing was recorded.
    """
    calls = sum(c["calls"] for c in per_client)
    sampled = sum(c["sampled_calls"] for c in per_client)
    request = sum(c["request_bytes_sum"] for c in per_client) / sampled if sampled else 0.0
    response = sum(c["response_bytes_sum"] for c in per_client) / sampled if sampled else 0.0
    bulk = sum(c["bulk_bytes_sum"] for c in per_client) / calls if calls else 0.0
    return {
        "calls": calls,
        "sampled_calls": sampled,
        "request_bytes_per_call": request,
        "response_bytes_per_call": response,
        "bulk_bytes_per_call": bulk,
        "bytes_per_call": round(request + response + bulk),
    }
