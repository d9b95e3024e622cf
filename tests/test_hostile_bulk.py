"""Bulk handles as capabilities, against real server processes with hand-made frames.

* A bulk id is 128 random bits: guessing small integers, or random ids, reads and writes nothing.
* A server pulls a caller's handle over the caller's own connection: a peer that says HELLO with the
  victim's engine id no longer receives the victim's bulk traffic (its puts stored the attacker's data).
"""

from __future__ import annotations

import asyncio
import os
import secrets as pysecrets
from pathlib import Path
from typing import Any

import pytest
from reliability_kit import (
    KV_ID,
    MIB,
    RELTEST_ID,
    Procs,
    close_writer,
    open_raw,
    raw_handshake,
    read_frame,
    secret,
    server_env,
    service_config,
    spawn_server,
    wait_closed_by_peer,
)

from svcframe import BulkHandle, Engine
from svcframe.wire import Kind, Status, encode_frame, pack_body, unpack_body

uvloop_test = pytest.mark.asyncio(loop_factories=["uvloop"])


@uvloop_test
async def test_guessed_bulk_ids_read_and_write_nothing(procs: Procs, tmp_path: Path, figures: Any) -> None:
    server = procs.spawn(service_config(tmp_path, kv=None))
    async with Engine(None) as owner:
        exposed = await owner.call(server.address, "expose", {"size": 64, "seed": 3}, provider_id=RELTEST_ID)
        assert isinstance(exposed["bulk"][2], bytes) and len(exposed["bulk"][2]) == 16
    refused = 0
    reader, writer = await open_raw(server.address)
    try:
        await raw_handshake(reader, writer, secret(), engine_id="guesser")
        guesses = [pysecrets.token_bytes(16) for _ in range(200)]
        for i, guess in enumerate(guesses, 1):
            kind = Kind.BULK_PULL if i % 2 else Kind.BULK_PUSH
            writer.write(encode_frame(kind, i, pack_body([guess, 0, 0 if kind == Kind.BULK_PUSH else 64])))
        for _ in guesses:
            fields, body = await read_frame(reader)
            assert fields[2] == Kind.RESPONSE and fields[9] == Status.BULK_ERROR, (fields, body)
            assert "not exposed" in unpack_body(body)
            refused += 1
        # the old guess, a small integer, is not even a bulk id any more: a bad frame, the connection dropped
        writer.write(encode_frame(Kind.BULK_PULL, 999, pack_body([1, 0, 64])))
        await wait_closed_by_peer(reader, 5.0)
    finally:
        await close_writer(writer)
    figures.record("hostile: guessed bulk ids refused", refused, "of 200")
    assert refused == 200


def _victim_script(address: str, out: Path) -> str:
    return f"""
import asyncio, json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from svcframe import Engine
from svcframe.loops import run
from providers.kv import KVClient

async def main():
    async with Engine(None, secret=None) as engine:
        kv = KVClient(engine, {address!r}, {KV_ID})
        await kv.put(b"warm", b"w")
        print(engine.engine_id, flush=True)
        sys.stdin.readline()  # the attacker has said HELLO with our engine id
        await kv.put(b"victim-key", b"V" * 100_000)  # over inline_max_bytes: a bulk pull by the server
        got = await kv.get(b"victim-key")
        open({str(out)!r}, "w").write(json.dumps({{"intact": got == b"V" * 100_000}}))

run(main())
"""


@uvloop_test
async def test_a_hello_with_another_engines_id_gets_none_of_its_bulk_traffic(tmp_path: Path, figures: Any) -> None:
    """An attack: with no shared secret, a peer says HELLO with the victim's engine id. Before,
    the server's next pull of the victim's handle went to the attacker, who supplied the bytes stored
    under the victim's key while the victim was told OK. Now the server pulls over the caller's connection."""
    import subprocess
    import sys

    config = service_config(tmp_path, kv="fast")
    env = server_env(secret=False)
    server = spawn_server(config, tmp_path, env=env)
    attacker_writer = None
    try:
        out = tmp_path / "victim.json"
        victim = subprocess.Popen(  # noqa: ASYNC220 (started once, read from a thread)
            [sys.executable, "-c", _victim_script(server.address, out)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=os.getcwd(),
        )  # fmt: skip
        assert victim.stdout is not None and victim.stdin is not None
        victim_id = (await asyncio.to_thread(victim.stdout.readline)).strip()
        assert victim_id, "the victim did not start"
        reader, attacker_writer = await open_raw(server.address)
        await raw_handshake(reader, attacker_writer, None, engine_id=victim_id)
        served = asyncio.create_task(_serve_pulls_with_garbage(reader, attacker_writer))
        victim.stdin.write("go\n")
        victim.stdin.flush()
        assert await asyncio.to_thread(victim.wait, 60) == 0
        victim.stdin.close()
        victim.stdout.close()
        served.cancel()
        await asyncio.gather(served, return_exceptions=True)
        result = out.read_text()
    finally:
        if attacker_writer is not None:
            await close_writer(attacker_writer)
        server.stop()
    figures.record("hostile: victim's data intact after an engine-id HELLO impostor", result, "")
    assert '"intact": true' in result


async def _serve_pulls_with_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The impostor: answer any BULK_PULL sent to it with the attacker's bytes."""
    while True:
        try:
            fields, body = await read_frame(reader, 120)
        except asyncio.IncompleteReadError:
            return
        if fields[2] == Kind.BULK_PULL:
            _, _, size = unpack_body(body)
            writer.write(encode_frame(Kind.BULK_DATA_REPLY, fields[7], b"A" * size))
            writer.write(encode_frame(Kind.RESPONSE, fields[7], b""))


@uvloop_test
async def test_a_server_is_no_confused_deputy(procs: Procs, tmp_path: Path, figures: Any) -> None:
    """A caller passed another engine's bulk handle to kv put_bulk and the server pulled the
    victim's buffer for it. Now a handler moves bulk data only for the caller that exposed the handle."""
    from svcframe import BulkError

    server = procs.spawn(service_config(tmp_path, kv="fast"))
    secret_data = bytearray(b"victim's secret " * 4096)
    async with Engine("tcp://127.0.0.1:0") as victim, Engine(None) as attacker:
        handle = victim.expose(secret_data, "rw")  # suppose the attacker learnt this handle
        with pytest.raises(BulkError, match="not to the caller"):
            await attacker.call(
                server.address, "put_bulk", {"key": "stolen", "bulk": handle.to_wire(), "size": handle.size},
                provider_id=KV_ID, timeout_seconds=10,
            )  # fmt: skip
        assert await attacker.call(server.address, "exists", {"key": "stolen"}, provider_id=KV_ID) is False
        served = sum(1 for (direction, _), _rec in victim.monitor.bulk.items() if direction.startswith("served"))
    figures.record("hostile: bulk transfers a server made for a confused-deputy caller", served, "")
    assert served == 0


@uvloop_test
async def test_forged_sizes_cost_the_server_nothing(procs: Procs, tmp_path: Path, figures: Any) -> None:
    """Four 158-byte put_bulk requests claiming 256 MiB made the server allocate 1 GiB before the
    owner answered. Now the claim is checked against kv max_value_bytes, and what is allocated is committed
    only as the owner's bytes arrive."""
    from svcframe import AppError, BulkError

    config = service_config(tmp_path, kv="fast")
    config["providers"][1]["config"]["max_value_bytes"] = 64 * MIB
    server = procs.spawn(config)
    rss_before = server.rss()
    async with Engine(None) as attacker:
        small = attacker.expose(bytearray(16), "r")
        forged = BulkHandle(small.address, small.engine_id, small.bulk_id, 256 * MIB, "r")
        for _ in range(4):
            with pytest.raises(AppError, match="max_value_bytes"):
                await attacker.call(server.address, "put_bulk", {"key": "k", "bulk": forged.to_wire()},
                                    provider_id=KV_ID, timeout_seconds=10)  # fmt: skip
        forged = BulkHandle(small.address, small.engine_id, small.bulk_id, 32 * MIB, "r")  # under the limit
        for _ in range(4):
            with pytest.raises(BulkError):  # the owner refuses the range: nothing arrives
                await attacker.call(server.address, "put_bulk", {"key": "k", "bulk": forged.to_wire()},
                                    provider_id=KV_ID, timeout_seconds=10)  # fmt: skip
    grown = server.rss() - rss_before
    figures.record("hostile: 8 forged put_bulk sizes (4 x 256 MiB, 4 x 32 MiB), server RSS growth",
                   round(grown / MIB, 1), "MiB")  # fmt: skip
    assert grown < 16 * MIB


@uvloop_test
async def test_forged_sizes_in_the_self_test_keep_nothing(procs: Procs, tmp_path: Path, figures: Any) -> None:
    """Forged bulk sizes in the self-test's ``work`` RPC left 384 MiB kept after the calls failed.
    Now buffers are committed as data lands (nothing lands when the owner refuses) and four sizes at most
    are kept."""
    from reliability_kit import SELFTEST_ID

    from svcframe import BulkError

    server = procs.spawn(service_config(tmp_path, kv=None, selftest=True))
    rss_before = server.rss()
    async with Engine(None) as attacker:
        small = attacker.expose(bytearray(16), "rw")
        for n in range(8):
            forged = BulkHandle(small.address, small.engine_id, small.bulk_id, (64 + n) * MIB, "rw")
            with pytest.raises(BulkError):  # the owner refuses the range: no byte arrives
                await attacker.call(server.address, "work", [0, "pull", forged.to_wire(), b""],
                                    provider_id=SELFTEST_ID, timeout_seconds=10)  # fmt: skip
    grown = server.rss() - rss_before
    figures.record(
        "hostile: 8 forged self-test bulk sizes (64-71 MiB), server RSS growth", round(grown / MIB, 1), "MiB"
    )
    assert grown < 16 * MIB


@uvloop_test
async def test_pushes_ahead_of_an_answer_from_a_raw_peer() -> None:
    """At the protocol level, pushes flagged NO_REPLY (a handler's push ahead of its answer, naming the
    call): into an exposed "w" buffer its bytes land and nothing is answered; naming a call we never made,
    or a handle not exposed, changes nothing else (the data is discarded, the connection serves on, no
    answer); a CANCEL of a push whose data stopped coming forgets it; a body without the call's id is a bad
    frame (BAD_REQUEST, GOODBYE)."""
    from svcframe.wire import Flag

    async with Engine("tcp://127.0.0.1:0") as server:
        server.register(1, "noop", lambda req, arg: arg)
        sink = bytearray(4096)
        handle = server.expose(sink, "w")
        reader, writer = await open_raw(server.address or "")
        try:
            await raw_handshake(reader, writer, secret(), announce={"push_ahead": True})

            def push(rid: int, bulk_id: bytes, data: bytes, *call: int) -> bytes:
                head = encode_frame(Kind.BULK_PUSH, rid, pack_body([bulk_id, 0, len(data), *call]), flags=Flag.NO_REPLY)
                return head + encode_frame(Kind.BULK_DATA_PUSH, rid, data) if data else head

            async def served(rid: int) -> None:  # the next frame is this noop's answer: nothing came before it
                writer.write(
                    encode_frame(Kind.REQUEST, rid, pack_body(rid), provider_id=1, rpc=server.table.rpc_id("noop"))
                )
                fields, body = await read_frame(reader)
                assert fields[2] == Kind.RESPONSE and fields[7] == rid and unpack_body(body) == rid, fields

            writer.write(push(1, handle.bulk_id, b"a" * 1000, 77))  # a call we never made: bytes land, no answer
            await served(2)
            assert sink[:1000] == b"a" * 1000 and sink[1000:1008] == bytes(8)
            writer.write(push(3, pysecrets.token_bytes(16), b"b" * 1000, 2))  # not exposed: discarded
            await served(4)
            writer.write(encode_frame(Kind.BULK_PUSH, 5, pack_body([handle.bulk_id, 0, 100, 4]), flags=Flag.NO_REPLY))
            writer.write(encode_frame(Kind.CANCEL, 5))  # its data never comes: forgotten
            await served(6)
            assert not server.connections.peers["raw-peer"].protocol.pushes and sink[:1000] == b"a" * 1000
            writer.write(encode_frame(Kind.BULK_PUSH, 7, pack_body([handle.bulk_id, 0, 10]), flags=Flag.NO_REPLY))
            fields, body = await read_frame(reader)  # (NO_REPLY: no BAD_REQUEST answer, the GOODBYE says it)
            assert fields[2] == Kind.GOODBYE and fields[9] == Status.BAD_REQUEST and "malformed" in unpack_body(body)
            await wait_closed_by_peer(reader, 5.0)
        finally:
            writer.close()
