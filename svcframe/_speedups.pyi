# The compiled twins of svcframe's per-call hot paths (svcframe/_speedups.c); see its docstrings.
from typing import Any

SOURCE_SHA256: str

def parse_inline(
    buffer: Any,
    start: int,
    end: int,
    max_body: int,
    legal_kinds: int,
    frames: list[Any],
    frame_type: type,
    zero_trace_id: bytes,
    sink: Any,
    data_max: int,
    /,
) -> int: ...
def configure(
    frame_type: type,
    zero_trace_id: bytes,
    unpack: Any,
    unpack_kwargs: dict[str, Any],
    request_frame_py: Any,
    ok_response_py: Any,
    unpack_body_py: Any,
    /,
) -> None: ...
def configure_decoder(keep_bytes: int, /) -> None: ...
def unpack_body(body: bytes | bytearray | memoryview | Any, /) -> object: ...
def receive_bytes(size: int, /) -> tuple[bytes, memoryview]: ...
def ok_response(request_id: int, result: bytes | None, /) -> bytes: ...
def request_frame(
    flags: int,
    provider_id: int,
    rpc_id: int,
    request_id: int,
    deadline_usec: int,
    parent_provider_id: int,
    parent_rpc_id: int,
    callpath: int,
    trace_id: bytes,
    span_id: int,
    lamport: int,
    body: bytes,
    /,
) -> bytes: ...

class DecoderCore:
    _buf: Any
    _view: memoryview
    _head: memoryview
    _direct: memoryview | None
    bulk_sink: Any
    answers: dict[int, Any] | None
    into_pulls: dict[int, Any] | None
    _start: int
    _end: int
    _high: int
    _data_max: int
    _direct_pos: int
    max_body_bytes: int
    legal_kinds: int
    reuse_large: bool
    def get_buffer(self, sizehint: int = -1, /) -> memoryview: ...
    def buffer_updated(self, nbytes: int, /) -> list[Any] | None: ...
    @property
    def idle(self) -> bool: ...

class DeadlinesCore:
    _heap: list[Any]
    _seq: int
    _timer_at: float
    def add(self, deadline: float, waiting: dict[int, Any], request_id: int, /) -> None: ...
    def _compact(self) -> None: ...

def serve_request(engine: Any, conn: Any, frame: Any, arrival_ns: int, arrival: float, /) -> None: ...
def configure_serve(
    on_request_py: Any,
    request_type: type,
    sync: Any,
    not_fast_flags: int,
    into_flag: int,
    small_result_bytes: int,
    always_timed: int,
    batch_flush_bytes: int,
    done: Any,
    handler_globals: dict[str, Any],
    suspended: int,
    finished: int,
    /,
) -> None: ...
def configure_calls(
    task_request: Any,
    pack_body: Any,
    nil_body: bytes,
    error_from_status: Any,
    cancel_remote: Any,
    no_response: Any,
    deadline_expired: type,
    cancelled_error: type,
    no_parent_provider: int,
    lent_status: int,
    as_byte_view: Any,
    incoming_pull: type,
    too_large: Any,
    into_flag: int,
    cma_min_bytes: int,
    wire: Any,
    fold_at: int,
    /,
) -> None: ...
def begin_call(
    engine: Any,
    address: str,
    name: str,
    arg: Any,
    provider_id: int,
    timeout_seconds: float | None,
    flags: int,
    into: Any,
    /,
) -> Call | None: ...

class Call:
    @property
    def future(self) -> Any: ...
    def answered(self, answer: Any, /) -> Any: ...
    def failed(self, exc: BaseException, /) -> BaseException: ...

class EngineState: ...

class ConnectionState:
    def buffer_updated(self, nbytes: int) -> None: ...

class MonitorState: ...
class ProgressState: ...
class RecordState: ...

def buffer_address(view: Any, /) -> int: ...
def vm_read(pid: int, address: int, dest: Any, /) -> None: ...
def vm_write(pid: int, address: int, src: Any, mark_address: int = 0, mark: bytes = b"", /) -> None: ...
def push_ahead_now(engine: Any, handle: Any, offset: int, src: bytes, /) -> bool: ...
def push_ahead_frames(request_id: int, bulk_id: bytes, offset: int, size: int, call_id: int, /) -> bytes: ...
def configure_push(handle_type: type, /) -> None: ...
def place_ahead(engine: Any, conn: Any, request_id: int, bulk_id: bytes, offset: int, size: int, /) -> Any: ...
def configure_read(
    on_frames: Any,
    on_answers: Any,
    protocol_error: type,
    frames_per_turn: int,
    no_frames: Any,
    engine_globals: dict[str, Any],
    /,
) -> None: ...
