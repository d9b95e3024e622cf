"""Where the per-call state lives: the attributes the compiled request and call paths read and write on every
call, as slots of a base class of the object that has them.

``Engine``, ``Connection``, ``Monitor``, ``Progress`` and ``Record`` each inherit one of these bases. Where
svcframe._speedups was built (and SVCFRAME_PURE is unset) the base is its C type, whose members are struct
fields that ``serve_request`` and ``begin_call`` read directly: a generic attribute lookup from C cost about 265
instructions each (callgrind, Python 3.11), a dozen per call. Otherwise it is the Python twin below, with the
same names as ``__slots__``. Python code reads and writes them as any attribute, as fast as a slot either way;
an attribute never set raises AttributeError either way (tests/test_speedups.py checks the names agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .wire import PURE

__all__ = ["ConnectionState", "EngineState", "MonitorState", "ProgressState", "RecordState"]


class _PyEngineState:
    __slots__ = (
        "_closing",
        "_conns",
        "_deadlines",
        "_dispatching",
        "_dispatching_cancels",
        "_exposed",
        "_loop",
        "_refused",
        "_root_callpaths",
        "_rows",
        "_rpc_ids",
        "default_timeout_seconds",
        "engine_id",
        "monitor",
        "progress",
        "tracer",
    )  # fmt: skip


class _PyConnectionState:
    __slots__ = (
        "_backlog", "_batch", "_batch_bytes", "_cork", "_decode", "_open", "_paused", "_writelines_pauses", "closed",
        "frame_started", "last_activity", "max_output_bytes", "next_request_id", "owner", "peer_engine_id",
        "peer_label", "peer_max_body_bytes", "peer_push_ahead", "pending", "protocol", "records", "transport",
        "writes",
    )  # fmt: skip


class _PyMonitorState:
    __slots__ = ("bulk", "enabled", "origin", "sample_every", "target")


class _PyProgressState:
    __slots__ = ("blocking", "inflight")


class _PyRecordState:
    __slots__ = ("calls", "errors")


if TYPE_CHECKING or PURE:  # (mypy reads the Python twins as the types)
    EngineState = _PyEngineState
    ConnectionState = _PyConnectionState
    MonitorState = _PyMonitorState
    ProgressState = _PyProgressState
    RecordState = _PyRecordState
else:
    from ._speedups import ConnectionState, EngineState, MonitorState, ProgressState, RecordState
