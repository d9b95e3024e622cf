"""Scenarios run on whichever build of svcframe this process imports, for tests/test_compiled.py.

The compiled modules and their interpreted run are one source (svcframe/*.py with a .pxd); this kit records what
the decoder and the encoders do with the same input, as plain data, so that the test compares the compiled build
(in its own process) with ``SVCFRAME_PURE=1`` (this file run as a script) byte for byte. Nothing here is timed.

    python tests/compiled_kit.py SEED COUNT   # prints the record as JSON
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from svcframe.decoder import FrameDecoder
from svcframe.errors import ProtocolError
from svcframe.wire import (
    F_INTO,
    F_NO_REPLY,
    Kind,
    data_reply_header,
    encode_frame,
    encode_header,
    ok_response,
    pack_body,
    push_ahead_frames,
    request_frame,
    unpack_body,
)

#: kinds a fuzzed stream is made of (the bulk data kinds go to the recording sink)
_KINDS = [int(k) for k in Kind]


def _frame_record(frame: Any) -> list[Any]:
    """A decoded frame as JSON: its fields, bytes as hex."""
    return [
        value.hex() if isinstance(value, bytes | bytearray | memoryview) else repr(value) for value in frame.fields()
    ]


def _random_frame(rng: random.Random) -> bytes:
    kind = rng.choice(_KINDS)
    if kind in (Kind.BULK_DATA_REPLY, Kind.BULK_DATA_PUSH):
        size = rng.choice([0, 1, 7, 100, 4096, 70_000])
        return encode_header(kind, rng.randrange(1, 1 << 20), size) + rng.randbytes(size)
    body = rng.choice(
        [
            b"",
            pack_body(rng.randrange(-(1 << 40), 1 << 40)),
            pack_body([b"x" * rng.randrange(300)]),
            rng.randbytes(rng.randrange(64)),
        ]
    )
    return encode_frame(
        kind,
        rng.randrange(1 << 64),
        body,
        provider_id=rng.randrange(1 << 16),
        rpc=rng.randrange(1 << 32),
        status=rng.choice([0, 0, 1, 7]),
    )


def _mutate(rng: random.Random, stream: bytes) -> bytes:
    b = bytearray(stream)
    for _ in range(rng.randrange(1, 4)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _decode(stream: bytes, cuts: list[int], buffer_bytes: int) -> list[Any]:
    """Feed ``stream`` cut at ``cuts``; returns each read's frames, the sink's requests and the end (or error)."""
    sunk: list[Any] = []

    def sink(kind: int, request_id: int, length: int) -> memoryview:
        sunk.append([kind, request_id, length])
        buffer = bytearray(length)
        sunk.append(buffer)
        return memoryview(buffer)

    decoder = FrameDecoder(max_body_bytes=1 << 17, bulk_sink=sink, buffer_bytes=buffer_bytes)
    out: list[Any] = []
    at = 0
    try:
        for cut in [*cuts, len(stream)]:
            read = [_frame_record(f) for f in decoder.feed(stream[at:cut])]
            while decoder.held:
                read += [_frame_record(f) for f in decoder.more()]
            out.append(read)
            at = cut
        out.append(["idle", decoder.idle])
    except ProtocolError as exc:  # RemoteProtocolError and FrameTooLarge
        out.append([type(exc).__name__, str(exc)])
    finally:
        decoder.close()
    return [*out, [s.hex() if isinstance(s, bytearray) else s for s in sunk]]


def decode_streams(seed: int, count: int) -> list[Any]:
    """``count`` streams of random frames (a third mutated), each cut at random points."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        stream = b"".join(_random_frame(rng) for _ in range(rng.randrange(1, 6)))
        if rng.random() < 0.33:
            stream = _mutate(rng, stream)
        cuts = sorted(rng.sample(range(len(stream)), min(len(stream), rng.randrange(4))))
        records.append(_decode(stream, cuts, rng.choice([160, 4096, 256 * 1024])))
    return records


def _placement(
    stream: bytes, cuts: list[int], calls: list[int], into: int | None = None, decoder_class: Any = FrameDecoder
) -> list[Any]:
    """A caller's decoder (calls waiting for answers, pushes ahead placed) fed ``stream`` cut at ``cuts``: each
    read's batches, the pushes placed, the sink's requests, the calls' answers, and the error that ended it."""
    loop = asyncio.new_event_loop()
    placed: list[Any] = []
    sunk: list[Any] = []

    def place(request_id: int, bulk_id: bytes, offset: int, size: int) -> bytearray:
        buffer = bytearray(size)
        placed.append([request_id, bulk_id.hex(), offset, size, buffer])
        return buffer

    def sink(kind: int, request_id: int, length: int) -> memoryview:
        sunk.append([kind, request_id, length])
        return memoryview(bytearray(length))

    class Pull:  # what an into= call's pull shows the decoder (svcframe.protocol.IncomingPull)
        overflow_ok = True
        cursor = 5

    decoder = decoder_class(bulk_sink=sink, buffer_bytes=4096)
    decoder.place_ahead = place
    answers = {rid: loop.create_future() for rid in calls}
    decoder.answers = answers
    decoder.into_pulls = {} if into is None else {into: Pull()}
    reads: list[Any] = []
    at = 0
    try:
        for cut in [*cuts, len(stream)]:  # (as a connection reads: a read, then its held batches)
            while at < cut:
                buffer = decoder.get_buffer()
                n = min(len(buffer), cut - at)
                buffer[:n] = stream[at : at + n]
                at += n
                batches = [decoder.buffer_updated(n) or []]
                while decoder.held:
                    batches.append(decoder.more())
                reads.append([[_frame_record(f) for f in batch] for batch in batches])
        reads.append(["end", decoder.idle])
    except Exception as exc:
        reads.append([type(exc).__name__, str(exc)])
    decoder.close()
    results = {rid: ([*list(f.result()[:1]), repr(f.result()[1:])]) if f.done() else None for rid, f in answers.items()}
    loop.close()
    return [reads, [[*p[:4], bytes(p[4]).hex()] for p in placed], sunk, results]


def interpreted(module: str) -> ModuleType:
    """``svcframe.<module>`` loaded from its ``.py`` under the package name ``svcframe_interpreted`` (its own
    copies of the modules it imports), beside the compiled one in the same process."""
    name = f"{_INTERPRETED}.{module}"
    if _INTERPRETED not in sys.modules:
        package = ModuleType(_INTERPRETED)
        package.__path__ = [str(_SOURCE)]
        sys.modules[_INTERPRETED] = package
        sys.meta_path.insert(0, _InterpretedFinder())
    return importlib.import_module(name)


_INTERPRETED = "svcframe_interpreted"
_SOURCE = Path(__file__).resolve().parents[1] / "svcframe"


class _InterpretedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        source = _SOURCE / f"{name}.py"
        if package != _INTERPRETED or not source.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def placement_streams() -> list[Any]:
    """The reads where a caller's decoder completes frames itself: a push ahead (placed once), an OK answer to
    a waiting call, an into= call's data, and the frames behind them, whole and cut at every byte."""
    ahead = push_ahead_frames(900, bytes(range(16)), 3, 10, 5) + b"0123456789"
    second = push_ahead_frames(901, bytes(range(16)), 20, 4, 6) + b"abcd"
    answer = ok_response(5, b"done")
    data = data_reply_header(0, 6, 9) + b"xxxxxx"
    into_data = data_reply_header(F_INTO, 5, 8) + b"intoo"
    streams = [
        ahead + answer + data,  # a push ahead, an answer, then data: the push placed once
        ahead + answer + second,  # ... then a second push ahead
        data + ahead + answer,  # a push ahead behind a data reply: held for the next batch, then placed
        into_data + ahead + answer,
        ahead + ok_response(77, b"not waited for") + answer,
        encode_frame(Kind.BULK_PUSH, 902, pack_body([bytes(16), 0, 99, 5]), flags=F_NO_REPLY) + answer,  # size lies
    ]
    records = []
    for stream in streams:
        for cuts in ([], *([c] for c in range(1, len(stream)))):
            records.append(_placement(stream, cuts, calls=[5, 6, 8], into=8))
    return records


def encoders(seed: int) -> list[Any]:
    """What the encoders make of random values, and the body decoder of random bytes."""
    rng = random.Random(seed)
    out: list[Any] = []
    for _ in range(200):
        value = rng.choice(
            [
                None,
                rng.randbytes(rng.randrange(600)),
                rng.randrange(-(1 << 63), 1 << 64),
                {"k": [1, 2.5, "s"]},
                "text" * rng.randrange(5),
            ]
        )
        body = pack_body(value)
        rid = rng.randrange(1 << 64)
        result = rng.choice([None, rng.randbytes(rng.randrange(300))])
        request = request_frame(
            rng.randrange(1 << 16),
            rng.randrange(1 << 16),
            rng.randrange(1 << 32),
            rid,
            rng.randrange(1 << 32),
            rng.randrange(1 << 16),
            rng.randrange(1 << 32),
            rng.randrange(1 << 64),
            rng.randbytes(16),
            rng.randrange(1 << 64),
            rng.randrange(1 << 64),
            body,
        )
        out.append([body.hex(), ok_response(rid, result).hex(), request.hex()])
        garbage = rng.randbytes(rng.randrange(40))
        try:
            out.append(repr(unpack_body(garbage)))
        except ProtocolError as exc:
            out.append([type(exc).__name__, str(exc)])
    return out


def _counts(value: Any) -> Any:
    """Statistics without what differs from run to run (times, ids, addresses, progress): counts and bytes."""
    drop = ("since", "engine_id", "address", "peer", "progress", "samples", "polls", "names")
    if isinstance(value, dict):
        if "count" in value and "sum" in value and "p50" in value:  # a histogram: how many, and of what total
            return [value["count"], value["sum"]] if not isinstance(value["sum"], float) or value["sum"] >= 0 else None
        return {k: _counts(v) for k, v in sorted(value.items()) if k not in drop and not k.endswith("_usec")}
    if isinstance(value, list):
        return sorted((_counts(v) for v in value), key=repr)
    return value


async def _engine_scenario(workdir: str) -> dict[str, Any]:
    """A server and a client engine of this build, over a unix socket: every kind of call and bulk transfer the
    hot paths serve, each outcome (result, or error class and message) and both engines' statistics' counts."""
    from svcframe import BulkHandle, Engine

    outcomes: list[Any] = []

    async def outcome(what: str, aw: Any) -> Any:
        try:
            value = await aw
        except Exception as exc:
            outcomes.append([what, type(exc).__name__, str(exc).split("\n")[0].replace(workdir, "<workdir>")])
            return None
        outcomes.append([what, "ok", value.hex() if isinstance(value, bytes | bytearray) else repr(value)])
        return value

    def fail(req: Any, arg: Any) -> None:
        raise ValueError(f"refused {arg!r}")

    async def suspends(req: Any, arg: Any) -> Any:
        await asyncio.sleep(0)
        return arg

    async def finishes(req: Any, arg: Any) -> Any:
        return arg

    async def push_to_caller(req: Any, arg: list[Any]) -> int:
        await req.engine.push(BulkHandle.from_wire(arg[0]), bytes(range(256)) * (arg[1] // 256), ahead=arg[2])
        return int(arg[1])

    exposed = bytearray(bytes(range(251)) * 400)

    async with Engine(f"unix://{workdir}/server.sock", secret=None) as server, Engine(None, secret=None) as client:
        server.register(1, "echo", lambda req, arg: arg)
        server.register(1, "fail", fail)
        server.register(1, "suspends", suspends)
        server.register(1, "finishes", finishes)
        server.register(1, "push_to_caller", push_to_caller)
        server.register(1, "expose", lambda req, arg: server.expose(exposed, "r").to_wire())
        server.register(1, "bytes", lambda req, n: bytes(range(256)) * (n // 256))
        to = server.address or ""
        for arg in (None, b"", b"x" * 300, b"y" * 70_000, {"k": [1, 2.5, "s"]}, "text", 2**63):
            await outcome(f"echo {type(arg).__name__}", client.call(to, "echo", arg, provider_id=1))
        for name in ("suspends", "finishes", "fail"):
            await outcome(name, client.call(to, name, b"abc", provider_id=1))
        await outcome("unknown rpc", client.call(to, "nope", None, provider_id=1))
        await outcome("unknown provider", client.call(to, "echo", None, provider_id=9))
        answers = await asyncio.gather(*(client.call(to, "echo", i, provider_id=1) for i in range(50)))
        outcomes.append(["pipelined", answers == list(range(50))])
        into = bytearray(1 << 20)
        got = await outcome("into", client.call(to, "bytes", 65536, provider_id=1, into=into))
        outcomes.append(["into bytes", got is not None and into[: int(got)] == bytes(range(256)) * 256])
        mine = bytearray(4 << 20)
        handle = client.expose(mine, "w").to_wire()
        for size, ahead in ((4096, True), (65536, True), (3 << 20, True), (1024, False)):
            mine[:] = bytes(len(mine))
            await outcome(f"push {size} ahead={ahead}", client.call(to, "push_to_caller", [handle, size, ahead],
                                                                    provider_id=1))  # fmt: skip
            outcomes.append([f"pushed {size}", mine[:size] == bytes(range(256)) * (size // 256)])
        remote = BulkHandle.from_wire(await client.call(to, "expose", None, provider_id=1))
        pulled = await outcome("pull", client.pull(remote))
        outcomes.append(["pulled", pulled == exposed])
        stats = {"server": _counts(server.statistics()), "client": _counts(client.statistics())}
    return {"outcomes": outcomes, "statistics": stats}


def engine_record() -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        return asyncio.run(_engine_scenario(workdir))


def constants() -> dict[str, int]:
    """The wire's constants as each build exports them (compiled: C enum values, also module ints)."""
    import svcframe.wire as wire

    names = [n for n in dir(wire) if n.startswith(("K_", "F_")) or n in ("HEADER_SIZE", "WIRE_VERSION")]
    return {name: int(getattr(wire, name)) for name in names}


def record(seed: int, count: int) -> dict[str, Any]:
    import svcframe.compiled

    return {
        "build": svcframe.compiled.build(),
        "constants": constants(),
        "streams": decode_streams(seed, count),
        "placement": placement_streams(),
        "encoders": encoders(seed),
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["engine"]:
        json.dump(engine_record(), sys.stdout)
    else:
        json.dump(record(int(sys.argv[1]), int(sys.argv[2])), sys.stdout)
