# The compiled twin of svcframe.wire.FrameDecoder's loop (svcframe/_speedups.c); see its docstrings.
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
    /,
) -> int: ...
