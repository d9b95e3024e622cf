"""The ``group`` provider (Mochi Flock's ``flock``): a group of servers that knows who is alive, and the client
handle that follows it.

A server hosts one group provider; together they keep a view ``(version, members)`` with SWIM failure
detection and Lifeguard's adaptive timeouts (the protocol, sans-IO, is ``svcframe.membership``; this module is
its asyncio pump, written on the engine's public API: ``Engine.register`` through ``Provider`` and
``Engine.call``). Flock's provider type ``flock`` and its config are accepted as they are::

    {"name": "group", "type": "group", "provider_id": 42,
     "config": {"bootstrap": "file", "file": "group.json",
                "group": {"type": "swim", "config": {"protocol_period_ms": 1000}}}}

Config (every key optional):

- ``bootstrap``: how a member finds the group (Flock's names; a list is tried in order):
    - ``"file"`` (the default when a group file is known): wait until ``file`` lists this member (it is the job's
      group file: ``svcframe launch`` and ``svcframe serve --group-file`` write it once every rank accepts
      calls), then contact the others it lists. ``"mpi"`` is read as ``"file"`` (svcframe's launchers publish
      the ranks of an MPI or Slurm job in that file).
    - ``"join"``: join the group ``file`` lists (waiting for it to exist); this member need not be in it.
    - ``"self"`` (the default without a file): a group of one, which others join.
- ``file``: the group file kept equal to the view (default: ``$SVCFRAME_GROUP``, which ``svcframe launch`` sets
  for its servers). The view's first member writes it (Flock's rule), atomically, at every change; its
  metadata is kept and ``metadata.group`` records the version, digest and group provider id.
- ``group``: ``{"type": "swim" | "static" | "centralized", "config": {...}}``. ``swim`` (the default): the
  keys of ``SwimConfig`` (Flock's SWIM keys, in milliseconds, and Lifeguard's). ``static``: the view is
  the file's members, fixed (no failure detection; join and leave are refused). ``centralized`` (Flock's
  primary pings followers) runs as ``swim``, which detects failures without a primary: its
  ``ping_interval_ms`` is the protocol period and ``ping_timeout_ms`` the ping timeout; its other keys are
  ignored with one warning.
- ``require_authentication`` (true): membership messages, ``join`` and ``leave`` need a connection that
  proved the shared secret; the server must then have one (``SVCFRAME_SECRET`` or ``engine.auth``).
- ``join_timeout_seconds`` (120): how long ``file``/``join`` wait for the group file.

RPCs (argument -> result):

==========  ====================================  ===============================================================
``view``    None                                  ``{version, digest, members: [...], member_id}``
``watch``   ``{version, timeout_seconds}``        the view, once its version differs from ``version`` (or at
                                                  the timeout)
``join``    ``{members: [[address, group_id]]}``  this member's view once it contacted them  (authenticated)
``leave``   None, or ``{address}``/``{member_id}``  None: this member leaves; else that member is removed
                                                  ("leave for another")                       (authenticated)
``stats``   None                                  the protocol's counts and live timeouts (seconds)
``swim``    a protocol message                    the immediate answers (members only)        (authenticated)
==========  ====================================  ===============================================================

A member of a view is ``{rank, address, provider_id, group_provider_id, member_id, host, pid}``, where
``provider_id`` is the member's admin provider id, as in every svcframe group file.

``GroupHandle`` is the client's side: the members it may send to, refreshed whenever the group's version
changes (a watch on one member), never a member that left.

Errors: ``ConfigError`` (the config; no shared secret where one is required), ``Unauthenticated`` (a membership
message, join or leave on an unauthenticated connection), ``AppError`` code ``MalformedMessage``, ``NotMember``
(a static group's join and leave, a remove of an unknown member), ``GroupError`` (the client handle: no member
answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .engine import Engine, Request
from .errors import (
    AppError,
    ConfigError,
    ConnectionLost,
    DeadlineExceeded,
    GroupError,
    NoSuchProvider,
    NoSuchRPC,
    Refused,
    RPCError,
    SvcframeError,
    Unauthenticated,
)
from .group import GROUP_ENV, RANK_ENV, read_group_document, write_group_document
from .membership import (
    Ack,
    MalformedMessage,
    MemberInfo,
    Message,
    Nack,
    PingReq,
    Reply,
    Send,
    Swim,
    SwimSettings,
    View,
    decode_message,
    encode_message,
    view_digest,
    view_order,
)
from .provider import Provider, ProviderConfig, register_provider_type, rpc

log = logging.getLogger("svcframe.group")

BOOTSTRAP_METHODS = ("self", "file", "join", "mpi")
#: The most messages one ``swim`` answer may hold.
MAX_REPLIES = 8
#: The longest a ``watch`` waits (the caller's deadline shortens it).
MAX_WATCH_SECONDS = 300.0


class MalformedGroupMessage(AppError):
    """A ``swim`` message that is not one (the detail says what is wrong)."""

    code = "MalformedMessage"


class NotMember(AppError):
    """The operation does not apply: a static group's join or leave, or a member the view does not have."""

    code = "NotMember"


# -- config ------------------------------------------------------------------------------------------------------
class SwimConfig(ProviderConfig):
    """SWIM and Lifeguard settings (Flock's swim keys, in milliseconds; ``null``: derived, as described)."""

    protocol_period_ms: float = Field(1000.0, gt=0, description="time between two probes (Flock's default)")
    ping_timeout_ms: float | None = Field(
        None, gt=0, description="a direct probe's timeout; null: the measured round trip (RFC 6298 SRTT + 4 RTTVAR)"
    )
    ping_timeout_min_ms: float = Field(50.0, gt=0, description="the least ping timeout derived from the round trip")
    ping_req_timeout_ms: float | None = Field(
        None, gt=0, description="the indirect probes' timeout; null: twice the ping timeout"
    )
    ping_req_members: int = Field(3, ge=0, le=16, description="members asked to probe one that missed a ping")
    suspicion_timeout_ms: float | None = Field(
        None, gt=0, description="the shortest suspicion; null: 4 x max(1, log10(members)) x protocol period"
    )
    suspicion_max_timeout_multiplier: float = Field(
        6.0, ge=1, description="the longest suspicion, without confirmations, as a multiple of the shortest"
    )
    awareness_max_multiplier: int = Field(8, ge=1, le=64, description="the largest local health multiplier")
    push_pull_interval_ms: float = Field(30000.0, ge=0, description="a full-state exchange this often (0: never)")
    reconnect_interval_ms: float = Field(
        2000.0, ge=0, description="retry one member declared dead this often (a healed partition rejoins; 0: never)"
    )
    reconnect_timeout_ms: float = Field(3_600_000.0, ge=0, description="how long a dead member is retried")

    def settings(self) -> SwimSettings:
        """The protocol's settings, in seconds."""

        def s(msec: float | None) -> float | None:
            return None if msec is None else msec / 1000

        return SwimSettings(
            protocol_period=self.protocol_period_ms / 1000,
            ping_timeout=s(self.ping_timeout_ms),
            ping_timeout_min=self.ping_timeout_min_ms / 1000,
            initial_ping_timeout=min(0.5, self.protocol_period_ms / 2000),
            ping_req_timeout=s(self.ping_req_timeout_ms),
            ping_req_members=self.ping_req_members,
            suspicion_timeout=s(self.suspicion_timeout_ms),
            suspicion_max_multiplier=self.suspicion_max_timeout_multiplier,
            awareness_max=self.awareness_max_multiplier,
            push_pull_interval=self.push_pull_interval_ms / 1000,
            reconnect_interval=self.reconnect_interval_ms / 1000,
            reconnect_timeout=self.reconnect_timeout_ms / 1000,
        )


#: Flock's centralized keys that have a SWIM equivalent (its ping interval is the protocol period).
_CENTRALIZED_KEYS = {"ping_interval_ms": "protocol_period_ms", "ping_timeout_ms": "ping_timeout_ms"}


class BackendConfig(ProviderConfig):
    """Flock's ``group`` section: the backend's type and its config."""

    type: Literal["swim", "static", "centralized"] = "swim"
    config: SwimConfig = Field(default_factory=SwimConfig)

    @model_validator(mode="before")
    @classmethod
    def _centralized_as_swim(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("type") != "centralized" or not isinstance(data.get("config"), dict):
            return data
        config, ignored = {}, []
        for key, value in data["config"].items():
            if key in _CENTRALIZED_KEYS:
                if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
                    value = (value[0] + value[1]) / 2  # Flock's [min, max] interval: its mean
                config[_CENTRALIZED_KEYS[key]] = value
            else:
                ignored.append(key)
        if ignored:
            log.warning("group: the centralized backend runs as SWIM here; ignoring %s", ", ".join(sorted(ignored)))
        return {**data, "config": config}


class GroupConfig(ProviderConfig):
    """The group provider's settings (see the module docstring)."""

    bootstrap: list[Literal["self", "file", "join", "mpi"]] | None = Field(
        None, description="self | file | join | mpi, or a list tried in order (default: file with a file, else self)"
    )
    file: str | None = Field(None, min_length=1, description="the group file (default: $SVCFRAME_GROUP)")
    group: BackendConfig = Field(default_factory=BackendConfig)
    require_authentication: bool = Field(
        True, description="membership messages, join and leave need a connection that proved the shared secret"
    )
    join_timeout_seconds: float = Field(120.0, gt=0, description="how long file/join bootstraps wait for the file")

    @field_validator("bootstrap", mode="before")
    @classmethod
    def _one_method(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


# -- the provider ----------------------------------------------------------------------------------------------
def member_entry(info: MemberInfo) -> dict[str, Any]:
    """A member as a view and a group file list it (``provider_id``: its admin provider id)."""
    entry = {
        "rank": info.rank,
        "address": info.address,
        "provider_id": info.admin_provider_id,
        "group_provider_id": info.provider_id,
        "member_id": info.member_id,
        "host": info.host,
        "pid": info.pid,
    }
    return {k: v for k, v in entry.items() if v is not None}


def view_document(view: View, member_id: str | None = None) -> dict[str, Any]:
    """A view as JSON: ``{version, digest, members, member_id}`` (``member_id``: who answered)."""
    doc: dict[str, Any] = {
        "version": view.version,
        "digest": view.digest,
        "members": [member_entry(m) for m in view.members],
    }
    if member_id is not None:
        doc["member_id"] = member_id
    return doc


@register_provider_type
class GroupProvider(Provider):
    """A member of a group (type ``"group"``; ``"flock"`` is the same class). See the module docstring.

    Raises:
        ConfigError: an invalid config; a client-only engine; authentication required without a secret.
    """

    type_name: ClassVar[str] = "group"

    class Config(GroupConfig):
        """The group provider's settings (see the module docstring)."""

    settings: Config

    def __init__(self, engine: Engine, provider_id: int, **kwargs: Any) -> None:
        super().__init__(engine, provider_id, **kwargs)
        self.swim: Swim | None = None
        self.file: Path | None = None
        self.bootstrapped = asyncio.Event()
        self.static = self.settings.group.type == "static"
        self._wake: asyncio.Event | None = None
        self._view_changed: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._next_token = 0
        self._written_digest: str | None = None
        self._static_view: View | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        address = self.engine.address
        if address is None:
            raise ConfigError(f"group provider {self.name!r}: a member must listen (the engine has no address)")
        if self.settings.require_authentication and self.engine.identity.secret is None:
            raise ConfigError(
                f"group provider {self.name!r}: require_authentication is true but this server has no shared secret "
                "(SVCFRAME_SECRET or engine.auth.secret_file); without one anyone could say who is in the group. "
                "Give one, or set require_authentication to false on a trusted machine"
            )
        file = self.settings.file or os.environ.get(GROUP_ENV)
        self.file = Path(file) if file else None
        methods = self.settings.bootstrap or (["file"] if self.file is not None else ["self"])
        if any(m != "self" for m in methods) and self.file is None:
            raise ConfigError(
                f"group provider {self.name!r}: bootstrap {methods} needs a group file: set 'file' or {GROUP_ENV}"
            )
        loop = asyncio.get_running_loop()
        me = MemberInfo(
            uuid.uuid4().hex[:16], address, self.provider_id, _launcher_rank(), socket.gethostname(), os.getpid(),
            _admin_provider_id(self.engine),
        )  # fmt: skip
        self.swim = Swim(me, self.settings.group.config.settings(), now=loop.time())
        self._wake = asyncio.Event()
        self._view_changed = asyncio.Event()
        if not self.static:
            self._runner = loop.create_task(self._run(), name=f"group {self.name} protocol")
        self._spawn(self._bootstrap(methods))

    async def close(self) -> None:
        for task in [*self._tasks, *([self._runner] if self._runner else [])]:
            task.cancel()
        for task in [*self._tasks, *([self._runner] if self._runner else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._runner = None

    async def before_close(self) -> None:
        """Leave the group while the engine still runs (the server calls this before it drains), so that the
        others remove this member at once instead of detecting its end."""
        await self.leave_group()

    async def leave_group(self, timeout_seconds: float = 1.0) -> None:
        """Tell up to ``ping_req_members`` members that this one leaves; wait for them up to the timeout."""
        swim = self.swim
        if swim is None or swim.left or self.static:
            return
        loop = asyncio.get_running_loop()
        swim.leave(loop.time())
        sends = [o for o in swim.take_outputs() if isinstance(o, Send)]
        if sends:
            await asyncio.wait([loop.create_task(self._deliver(s)) for s in sends], timeout=timeout_seconds)
        self._after_change()

    # -- the protocol's pump ----------------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("group %s: %s", self.name, task.exception(), exc_info=task.exception())

    async def _run(self) -> None:
        swim, wake = self.swim, self._wake
        assert swim is not None and wake is not None
        loop = asyncio.get_running_loop()
        while True:
            swim.tick(loop.time())
            self._flush()
            deadline = swim.next_deadline()
            wake.clear()
            if deadline is None:
                await wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), max(0.0, deadline - loop.time()))

    def _flush(self) -> None:
        """Start the sends, answer the deferred replies, and act on view changes."""
        swim = self.swim
        assert swim is not None
        for out in swim.take_outputs():
            if isinstance(out, Reply):
                future = self._replies.pop(out.token, None)
                if future is not None and not future.done():
                    future.set_result(out.message)
            else:
                self._spawn(self._deliver(out))
        self._after_change()

    def _after_change(self) -> None:
        swim = self.swim
        assert swim is not None
        changes = swim.take_changes()
        for change in changes:
            who = f"rank {change.member.rank} " if change.member.rank is not None else ""
            level = logging.WARNING if change.status == "dead" else logging.INFO
            log.log(level, "group %s: member %s%s (%s) %s: %s", self.name, who, change.member.address,
                    change.member.member_id, {"alive": "joined"}.get(change.status, change.status), change.why)  # fmt: skip
        if changes and self._view_changed is not None:
            self._view_changed.set()
            self._view_changed = asyncio.Event()
        if changes or self._written_digest is None:
            self._write_file()

    def _call_timeout(self, message: Message) -> float:
        """How long a call carrying ``message`` may take: the protocol's own timers decide earlier what a late
        answer means, and an answer that comes late still teaches the round trip."""
        swim = self.swim
        assert swim is not None
        scale = swim.awareness + 1
        if isinstance(message, PingReq):
            return swim.ping_req_timeout() * scale + swim.ping_timeout() * scale
        return max(swim.settings.protocol_period * scale, 1.0)

    async def _deliver(self, send: Send) -> Any:
        """Send one message; its answers go back to the protocol. Returns them (decoded), or None on failure."""
        swim = self.swim
        assert swim is not None
        loop = asyncio.get_running_loop()
        try:
            answers = await self.engine.call(
                send.address, "swim", encode_message(send.message), provider_id=send.provider_id,
                timeout_seconds=self._call_timeout(send.message),
            )  # fmt: skip
        except (ConnectionLost, NoSuchProvider, NoSuchRPC, Refused) as exc:
            log.debug("group %s: %s unreachable: %s", self.name, send.address, exc)
            swim.send_failed(send, loop.time())
            self._flush()
            return None
        except DeadlineExceeded as exc:
            # the protocol's own timers decide what it means; the connection may be the one stuck (TCP backs off
            # for seconds on a path that failed and came back): the next message dials afresh
            log.debug("group %s: %s: %s", self.name, send.address, exc)
            self.engine.disconnect(send.address, "a membership message timed out")
            return None
        except RPCError as exc:
            log.debug("group %s: %s: %s", self.name, send.address, exc)
            return None
        except ConfigError as exc:  # an address the engine cannot dial
            log.warning("group %s: cannot send to %s: %s", self.name, send.address, exc)
            return None
        messages = []
        if isinstance(answers, list):
            for raw in answers[:MAX_REPLIES]:
                try:
                    messages.append(decode_message(raw))
                except MalformedMessage as exc:
                    log.warning("group %s: a malformed answer from %s: %s", self.name, send.address, exc)
                    break
        now = loop.time()
        for message in messages:
            swim.receive(message, now)
        self._flush()
        assert self._wake is not None
        self._wake.set()
        return messages

    # -- bootstrap and the group file --------------------------------------------------------------------------
    async def _bootstrap(self, methods: Sequence[str]) -> None:
        swim = self.swim
        assert swim is not None
        for method in methods:
            if method == "self":
                break
            joined = await self._bootstrap_from_file(listed=method in ("file", "mpi"))
            if joined:
                break
        else:
            log.warning("group %s: bootstrap %s did not find the group: a group of one for now", self.name, methods)
        self.bootstrapped.set()
        self._written_digest = None
        self._after_change()

    async def _bootstrap_from_file(self, *, listed: bool) -> bool:
        """Wait for the group file (listing this member when ``listed``), then contact its members."""
        swim, path = self.swim, self.file
        assert swim is not None and path is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.join_timeout_seconds
        interval = 0.01
        while True:
            entries = _read_entries(path)
            mine = [e for e in entries if e.get("address") == swim.me.address] if entries else []
            if entries and (not listed or (mine and mine[0].get("pid") in (None, os.getpid()))):
                break
            if loop.time() > deadline:
                what = "listing this member" if listed else "to exist"
                log.warning("group %s: waited %g s for group file %s %s", self.name,
                            self.settings.join_timeout_seconds, path, what)  # fmt: skip
                return False
            await asyncio.sleep(interval)  # bounded polling of a condition (the file is written by another process)
            interval = min(2 * interval, 0.1)
        rank = mine[0].get("rank") if mine and "member_id" not in mine[0] else None  # the launcher's entry only
        if swim.me.rank is None and type(rank) is int and rank >= 0:
            swim.update_me(replace(swim.me, rank=rank), loop.time())
        if self.static:
            members = [_info_from_entry(e, self.provider_id) for e in entries]
            if not mine:
                members.append(swim.me)
            members = [swim.me if m.address == swim.me.address else m for m in members]
            self._static_view = View(1, tuple(sorted(members, key=view_order)), view_digest(members))
            return True
        seeds = [
            (str(e["address"]), _group_id(e, self.provider_id)) for e in entries if e.get("address") != swim.me.address
        ]
        await self.join_seeds(seeds)
        return True

    async def join_seeds(self, seeds: Iterable[tuple[str, int]]) -> None:
        """Contact ``seeds`` (``(address, group provider id)``) with this member's state and wait for their
        answers (each within a protocol period or two)."""
        swim = self.swim
        assert swim is not None
        loop = asyncio.get_running_loop()
        swim.join(seeds, loop.time())
        sends = [o for o in swim.take_outputs() if isinstance(o, Send)]
        if sends:
            await asyncio.wait([loop.create_task(self._deliver(s)) for s in sends])
        self._flush()
        assert self._wake is not None
        self._wake.set()

    def _write_file(self) -> None:
        """Keep the group file equal to the view: written, atomically, by the view's first member only."""
        swim, path = self.swim, self.file
        if swim is None or path is None or not self.bootstrapped.is_set() or self.static:
            return
        view = swim.view()
        if not view.members or view.members[0].member_id != swim.member_id:
            return
        existing = read_group_document(path) or {"members": [], "metadata": {}}
        # The file says whose view it holds: another member may have written it since this one last did (a
        # member that was first in the view, and left it), so what this one wrote last proves nothing.
        if (existing["metadata"].get("group") or {}).get("digest") == view.digest:
            self._written_digest = view.digest
            return
        metadata = dict(existing["metadata"])
        # what another writer recorded of a member (the launcher's "ready"), kept while it is the same process
        before = {(e.get("address"), e.get("pid")): e for e in existing["members"]}
        metadata["group"] = {"version": view.version, "digest": view.digest, "provider_id": self.provider_id,
                             "writer": swim.member_id}  # fmt: skip
        members, taken = [], {m.rank for m in view.members if m.rank is not None}
        next_rank = max(taken, default=-1) + 1
        seen: set[int] = set()
        for m in view.members:
            entry = {**before.get((m.address, m.pid), {}), **member_entry(m)}
            if m.rank is None or m.rank in seen:  # a member without a rank (or a second of one) gets the next
                entry["rank"], next_rank = next_rank, next_rank + 1
            seen.add(entry["rank"])
            members.append(entry)
        try:
            write_group_document(path, {"members": members, "metadata": metadata})
        except OSError as exc:
            log.warning("group %s: cannot write group file %s: %s", self.name, path, exc.strerror)
            return
        self._written_digest = view.digest

    # -- RPCs ------------------------------------------------------------------------------------------------
    def _check_member(self, req: Request, what: str) -> None:
        if self.settings.require_authentication and not req.conn.authenticated:
            raise Unauthenticated(
                f"{what} refused: group membership needs a connection authenticated with the shared secret "
                "(SVCFRAME_SECRET or engine.auth.secret_file on both ends)"
            )

    def current_view(self) -> View:
        if self.static:
            assert self.swim is not None
            return self._static_view or View(0, (self.swim.me,), view_digest([self.swim.me]))
        assert self.swim is not None
        return self.swim.view()

    @rpc(name="view")
    def get_view(self, req: Request, _: Any) -> dict[str, Any]:
        assert self.swim is not None
        return view_document(self.current_view(), self.swim.member_id)

    @rpc
    async def watch(self, req: Request, arg: Any) -> dict[str, Any]:
        """The view once its version differs from ``arg["version"]``, or at ``arg["timeout_seconds"]``."""
        assert self.swim is not None
        if not isinstance(arg, dict):
            raise TypeError("watch takes {version, timeout_seconds}")
        since, timeout = arg.get("version"), arg.get("timeout_seconds", 30.0)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
            raise ValueError(f"timeout_seconds must be a number >= 0, not {timeout!r}")
        remaining = req.remaining_seconds()
        timeout = min(float(timeout), MAX_WATCH_SECONDS, *([max(0.0, remaining - 0.05)] if remaining else []))
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self.current_view().version == since and self._view_changed is not None:
            left = end - loop.time()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._view_changed.wait(), left)
        return view_document(self.current_view(), self.swim.member_id)

    @rpc
    async def join(self, req: Request, arg: Any) -> dict[str, Any]:
        """Contact the members ``arg["members"]`` lists (``[[address, group_provider_id], ...]``)."""
        self._check_member(req, "join")
        if self.static:
            raise NotMember("a static group's members are fixed: join is refused")
        members = arg.get("members") if isinstance(arg, dict) else None
        if not isinstance(members, list) or len(members) > 4096:
            raise TypeError("join takes {members: [[address, group_provider_id], ...]} (at most 4096)")
        seeds = []
        for m in members:
            if not (isinstance(m, list) and len(m) == 2 and isinstance(m[0], str) and type(m[1]) is int):
                raise TypeError(f"a member to join is [address, group_provider_id], not {m!r}")
            seeds.append((m[0], m[1]))
        await self.join_seeds(seeds)
        self.bootstrapped.set()
        self._after_change()
        assert self.swim is not None
        return view_document(self.current_view(), self.swim.member_id)

    @rpc
    async def leave(self, req: Request, arg: Any) -> None:
        """None: this member leaves; ``{address}`` or ``{member_id}``: that member is removed."""
        self._check_member(req, "leave")
        swim = self.swim
        assert swim is not None
        if self.static:
            raise NotMember("a static group's members are fixed: leave is refused")
        if arg is None:
            await self.leave_group()
            return
        if not isinstance(arg, dict) or not (
            isinstance(arg.get("address"), str) or isinstance(arg.get("member_id"), str)
        ):
            raise TypeError("leave takes None (this member) or {address} / {member_id} (another)")
        target = arg.get("member_id")
        if target is None:
            info = swim.find(arg["address"])
            target = None if info is None else info.member_id
        if target == swim.member_id:
            await self.leave_group()
            return
        peer = req.peer_address or "a client"
        if target is None or not swim.remove(target, asyncio.get_running_loop().time(), why=f"removed by {peer}"):
            raise NotMember(f"no member {arg.get('member_id') or arg.get('address')} in this member's view")
        self._flush()
        assert self._wake is not None
        self._wake.set()

    @rpc
    def stats(self, req: Request, _: Any) -> dict[str, Any]:
        assert self.swim is not None
        return {**self.swim.statistics(), "bootstrapped": self.bootstrapped.is_set(), "file": str(self.file or "")}

    @rpc(name="swim")
    async def swim_message(self, req: Request, arg: Any) -> list[Any]:
        self._check_member(req, "a membership message")
        swim = self.swim
        assert swim is not None
        if self.static:
            raise NotMember("a static group runs no membership protocol")
        try:
            message = decode_message(arg)
        except MalformedMessage as exc:
            raise MalformedGroupMessage(str(exc)) from None
        loop = asyncio.get_running_loop()
        self._next_token += 1
        token = self._next_token
        answers = swim.receive(message, loop.time(), token)
        if isinstance(message, PingReq) and not answers and not swim.left:
            future: asyncio.Future[Any] = loop.create_future()
            self._replies[token] = future
            self._flush()
            assert self._wake is not None
            self._wake.set()
            try:
                answer = await asyncio.wait_for(future, self._call_timeout(message))
            except TimeoutError:
                answer = None
            finally:
                self._replies.pop(token, None)
            answers = [answer] if isinstance(answer, Ack | Nack) else []
        else:
            self._flush()
            assert self._wake is not None
            self._wake.set()
        return [encode_message(a) for a in answers]


@register_provider_type
class FlockProvider(GroupProvider):
    """Mochi Flock's provider type name for the same provider."""

    type_name: ClassVar[str] = "flock"


# -- helpers ---------------------------------------------------------------------------------------------------
def _launcher_rank() -> int | None:
    """This process's rank: ``$SVCFRAME_RANK`` (``svcframe launch``), else the launcher's (srun, mpiexec)."""
    from .ranks import from_environment

    value = os.environ.get(RANK_ENV, "")
    if value.isdigit():
        return int(value)
    try:
        info = from_environment()
    except Exception:  # an inconsistent launcher environment: the group file will say
        return None
    return None if info is None else info.rank


def _admin_provider_id(engine: Engine) -> int:
    """The admin provider's id on this engine (its registrations say; 0, Bedrock's, without one)."""
    for registration in engine.registrations():
        if getattr(registration.owner, "type_name", None) == "admin":
            return registration.provider_id
    return 0


def _read_entries(path: Path) -> list[dict[str, Any]]:
    """The member entries of a group file; [] when it is missing, partial or not one."""
    doc = read_group_document(path)
    return [m for m in doc["members"] if isinstance(m.get("address"), str)] if doc else []


def _group_id(entry: dict[str, Any], default: int) -> int:
    value = entry.get("group_provider_id")
    return value if type(value) is int and 0 <= value <= 65535 else default


def _info_from_entry(entry: dict[str, Any], provider_id: int) -> MemberInfo:
    def opt_int(key: str) -> int | None:
        value = entry.get(key)
        return value if type(value) is int and value >= 0 else None

    member_id = entry.get("member_id")
    address = str(entry["address"])
    group_id = _group_id(entry, provider_id)
    host = entry.get("host")
    return MemberInfo(
        member_id if isinstance(member_id, str) and member_id else f"{address}#{group_id}",
        address, group_id, opt_int("rank"), host if isinstance(host, str) else None, opt_int("pid"),
        opt_int("provider_id") or 0,
    )  # fmt: skip


# -- the client's handle ------------------------------------------------------------------------------------------
class GroupHandle:
    """A client's view of a group: the members to send to, refreshed when the group's version changes.

    Args:
        engine: the client's engine.
        members: where to ask for the view first: ``(address, group provider id)`` pairs (a group file's,
            ``from_group_file``).
        timeout_seconds: the deadline of each view request.

    ``await handle.refresh()`` reads the view from the first member that answers; ``async with handle:`` (or
    ``start()``/``close()``) also keeps it fresh with a watch on one member, re-reading the view at each
    version change and after a member stops answering. ``handle.members`` never lists a member that left the
    view it last read, and ``handle.call`` refuses to send to one.
    """

    def __init__(self, engine: Engine, members: Sequence[tuple[str, int]], *, timeout_seconds: float = 5.0) -> None:
        if not members:
            raise GroupError("a group handle needs at least one member to ask")
        self.engine = engine
        self.timeout_seconds = timeout_seconds
        self._seeds = list(dict.fromkeys(members))
        self.view: dict[str, Any] | None = None
        self.refreshes = 0
        self._watcher: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @classmethod
    def from_group_file(
        cls,
        engine: Engine,
        path: str | os.PathLike[str],
        *,
        provider_id: int | None = None,
        timeout_seconds: float = 5.0,
    ) -> GroupHandle:
        """A handle on the group a group file lists (its members' ``group_provider_id``, else ``provider_id``).

        Raises:
            GroupError: the file is not a group file, or neither it nor ``provider_id`` names the group provider.
        """
        entries = _read_entries(Path(path))
        if not entries:
            raise GroupError(f"group file {path}: missing, or lists no member")
        seeds = []
        for e in entries:
            group_id = e.get("group_provider_id", provider_id)
            if type(group_id) is not int:
                raise GroupError(
                    f"group file {path} does not name the group provider's id (no group_provider_id): give it"
                )
            seeds.append((str(e["address"]), group_id))
        return cls(engine, seeds, timeout_seconds=timeout_seconds)

    @property
    def version(self) -> int | None:
        """The version of the last view read (None before the first ``refresh``)."""
        return None if self.view is None else int(self.view["version"])

    @property
    def members(self) -> list[dict[str, Any]]:
        """The members of the last view read (``member_entry`` dicts, rank order)."""
        return list(self.view["members"]) if self.view is not None else []

    def _candidates(self) -> list[tuple[str, int]]:
        known = [(m["address"], m["group_provider_id"]) for m in self.members]
        return list(dict.fromkeys([*known, *self._seeds]))

    async def refresh(self) -> dict[str, Any]:
        """Read the view from the first member that answers (members of the last view first).

        Raises:
            GroupError: no member answered.
        """
        problems = []
        for address, group_id in self._candidates():
            try:
                view = await self.engine.call(address, "view", None, provider_id=group_id,
                                              timeout_seconds=self.timeout_seconds)  # fmt: skip
            except RPCError as exc:
                problems.append(f"{address}: {exc}")
                if isinstance(exc, DeadlineExceeded):  # the connection may be stuck in TCP's backoff: dial afresh
                    self.engine.disconnect(address, "a view request timed out")
                continue
            if isinstance(view, dict) and view.get("members"):
                self._adopt(view, (address, group_id))
                return view
            problems.append(f"{address}: not in a group (it left)")
        raise GroupError("no member of the group answered: " + "; ".join(problems[:4]))

    def _adopt(self, view: dict[str, Any], source: tuple[str, int]) -> None:
        old = self.view
        self.view = view
        self._source = source
        if old is None or old.get("digest") != view.get("digest"):
            self.refreshes += 1
            self._changed.set()
            self._changed = asyncio.Event()

    async def watch(self, timeout_seconds: float = 30.0) -> AsyncIterator[dict[str, Any]]:
        """Each view as it changes (the first one at once), for as long as the caller iterates."""
        view = await self.refresh()
        yield view
        while True:
            address, group_id = self._source
            try:
                view = await self.engine.call(
                    address, "watch", {"version": view["version"], "timeout_seconds": timeout_seconds},
                    provider_id=group_id, timeout_seconds=timeout_seconds + self.timeout_seconds,
                )  # fmt: skip
            except RPCError as exc:
                if isinstance(exc, DeadlineExceeded):
                    self.engine.disconnect(address, "a watch timed out")
                view = await self.refresh()  # that member is gone: ask another
                yield view
                continue
            if isinstance(view, dict) and view.get("members"):
                changed = view.get("digest") != (self.view or {}).get("digest")
                self._adopt(view, (address, group_id))
                if changed:
                    yield view
            else:
                view = await self.refresh()
                yield view

    async def start(self) -> GroupHandle:
        """Read the view, then keep it fresh in the background."""
        await self.refresh()

        async def follow() -> None:
            while True:
                try:
                    async for _ in self.watch():
                        pass
                except SvcframeError as exc:  # no member answered (GroupError), or a call failed otherwise
                    log.warning("group handle: %s", exc)
                    await asyncio.sleep(self.timeout_seconds)  # try again later

        self._watcher = asyncio.get_running_loop().create_task(follow())
        return self

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    async def __aenter__(self) -> GroupHandle:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def changed(self) -> None:
        """Wait for the next change of the view this handle holds."""
        await self._changed.wait()

    def member(self, which: int | str) -> dict[str, Any]:
        """The member of rank ``which`` (an int) or at address ``which`` (a str) in the last view read.

        Raises:
            GroupError: no such member in the view (it left, or never was).
        """
        key = "rank" if isinstance(which, int) else "address"
        for m in self.members:
            if m.get(key) == which:
                return m
        have = ", ".join(str(m.get(key)) for m in self.members)
        raise GroupError(f"{key} {which} is not in the group's view (version {self.version}; {key}s: {have})")

    async def call(
        self, which: int | str, name: str, arg: Any = None, *, provider_id: int, timeout_seconds: float | None = None,
        idempotent: bool = False,
    ) -> Any:  # fmt: skip
        """Call RPC ``name`` of provider ``provider_id`` on a member (``which``: its rank, or its address), never one
        that left the view; a connection lost to it refreshes the view before the error is raised.

        Raises:
            GroupError: no such member in the view; the errors of ``Engine.call``.
        """
        member = self.member(which)
        try:
            return await self.engine.call(member["address"], name, arg, provider_id=provider_id,
                                          timeout_seconds=timeout_seconds, idempotent=idempotent)  # fmt: skip
        except ConnectionLost:
            with contextlib.suppress(GroupError):
                await self.refresh()
            raise


__all__ = [
    "BackendConfig",
    "FlockProvider",
    "GroupConfig",
    "GroupHandle",
    "GroupProvider",
    "MalformedGroupMessage",
    "NotMember",
    "SwimConfig",
    "member_entry",
    "view_document",
]
