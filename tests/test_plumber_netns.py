"""The plumber on real interfaces: two network namespaces joined by two veth pairs (a two-NIC server node
and a two-NIC client node, in miniature), servers and clients choosing NICs with the plumber, traffic
checked on each interface's byte counters and on each connection's local address.

Needs root (``ip netns add``); skipped with the reason otherwise. Only private test addresses in 10.99.x.y,
on veths this test creates inside namespaces it creates; everything is deleted at the end.

    server namespace                       client namespace
    nic0 10.99.1.1/24  <-- veth pair -->   nic0 10.99.1.2/24   (from 10.99.1.2: table 101, 10.99/16 via nic0)
    nic1 10.99.2.1/24  <-- veth pair -->   nic1 10.99.2.2/24   (from 10.99.2.2: table 102, 10.99/16 via nic1)

The client namespace routes by source address, one table per NIC, as multi-rail hosts do: binding a
connection's source address (``Engine(local_host=...)``) is then what selects its link. Each client talks to
the server on the *other* subnet, so without the binding its traffic would take the other link.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux-only"),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces and veth pairs needs root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="the ip command (iproute2) is not installed"),
    pytest.mark.timeout(90),
]

BULK_BYTES = 4 * 1024 * 1024
NICS = ("nic0", "nic1")
#: Servers listen on non-loopback addresses: every connection is authenticated with a shared secret.
SECRET = os.urandom(16).hex()


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30).stdout


@pytest.fixture(scope="module")
def namespaces() -> Iterator[tuple[str, str]]:
    """(server namespace, client namespace), joined by two veth pairs; deleted at teardown."""
    tag = os.getpid() % 1000000
    server_ns, client_ns = f"sfplumb-s{tag}", f"sfplumb-c{tag}"
    made: list[str] = []
    try:
        for ns in (server_ns, client_ns):
            _ip("netns", "add", ns)
            made.append(ns)
        for k, nic in enumerate(NICS, start=1):
            _ip("link", "add", nic, "netns", server_ns, "type", "veth", "peer", "name", nic, "netns", client_ns)
            _ip("-n", server_ns, "addr", "add", f"10.99.{k}.1/24", "dev", nic)
            _ip("-n", client_ns, "addr", "add", f"10.99.{k}.2/24", "dev", nic)
            for ns in (server_ns, client_ns):
                _ip("-n", ns, "link", "set", nic, "up")
            _ip("-n", client_ns, "rule", "add", "from", f"10.99.{k}.2", "table", str(100 + k))
            _ip("-n", client_ns, "route", "add", "10.99.0.0/16", "dev", nic, "table", str(100 + k))
        for ns in (server_ns, client_ns):
            _ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        pytest.skip(f"cannot create network namespaces / veth pairs here: {exc.stderr.strip()}")
    try:
        yield server_ns, client_ns
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _tx_bytes(ns: str) -> dict[str, int]:
    """Transmitted bytes per interface of a namespace (``ip -s -j link``)."""
    links = json.loads(_ip("-n", ns, "-s", "-j", "link", "show"))
    return {link["ifname"]: link["stats64"]["tx"]["bytes"] for link in links if link["ifname"] in NICS}


def _start_server(ns: str, config: Path, control: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    r, w = os.pipe()
    env = {**os.environ, "SVCFRAME_PLUMBER_DIR": str(control), "SVCFRAME_SECRET": SECRET}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "svcframe", "serve", str(config), "--ready-fd", str(w)],
            pass_fds=(w,), env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    os.close(w)
    with os.fdopen(r, "rb") as ready:
        line = ready.readline()  # one JSON line once the server accepts calls, or EOF if it died
    msg = json.loads(line) if line else {"ok": False, "error": "exited before reporting readiness"}
    if not msg.get("ok"):
        proc.kill()
        proc.wait()
        pytest.fail(f"server in {ns} failed: {msg.get('error')}\n{log.read_text(errors='replace')[-2000:]}")
    return proc, msg["address"]


#: A client process: choose a NIC with the plumber, bind to it, let the server on the other NIC's subnet pull
#: BULK bytes from it, and report the choice, its connection's local address and the server's own choice.
_CLIENT = """
import asyncio, json, os, sys
from selftest.provider import work_arg
from svcframe import Engine
from svcframe.settings import PlumberConfig
from svcframe.plumber import choose_local_host

policy, servers, go_fd, bulk = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print("ready", flush=True)
os.read(go_fd, 1)
choice = choose_local_host(PlumberConfig(bucket_policy="all", nic_policy=policy))
subnet = choice.address.rsplit(".", 1)[0]
target = next(s for s in servers if s.split("//")[1].rsplit(".", 1)[0] != subnet)

async def main():
    async with Engine(None, local_host=choice.address, secret=os.environ["SVCFRAME_SECRET"].encode()) as engine:
        conn = await engine.connection(target)
        buf = bytearray(os.urandom(bulk))
        await engine.call(target, "work", work_arg(0, "pull", engine.expose(buf, "r"), b""), provider_id=1,
                          timeout_seconds=30)
        status = await engine.call(target, "status", None, provider_id=0, timeout_seconds=30)
        return {"nic": choice.nic, "address": choice.address, "reason": choice.reason, "target": target,
                "sockname": conn.transport.get_extra_info("sockname")[0], "server_plumber": status["plumber"]}

print(json.dumps(asyncio.run(main())), flush=True)
"""


def _run_clients(ns: str, policy: str, servers: list[str], n: int, control: Path) -> list[dict[str, Any]]:
    """``n`` client processes in ``ns``, released together by one write on a pipe they all block on."""
    go_r, go_w = os.pipe()
    env = {**os.environ, "SVCFRAME_PLUMBER_DIR": str(control), "SVCFRAME_SECRET": SECRET}
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-c", _CLIENT, policy, json.dumps(servers), str(go_r)]
    procs = [
        subprocess.Popen([*cmd, str(BULK_BYTES)], pass_fds=(go_r,), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]  # fmt: skip
    os.close(go_r)
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            assert line == "ready", p.communicate(timeout=30)[1]
        os.write(go_w, b"g" * n)
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        os.close(go_w)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    return [json.loads(out) for out, _ in outs]


@pytest.fixture(scope="module")
def servers(namespaces: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two self-test servers in the server namespace, both configured with ``tcp://*:0``: round robin puts
    them on distinct NICs."""
    server_ns, _ = namespaces
    tmp = tmp_path_factory.mktemp("netns")
    config = tmp / "server.json"
    config.write_text(json.dumps({
        "engine": {"address": "tcp://*:0", "plumber": {"bucket_policy": "all", "nic_policy": "roundrobin"}},
        "libraries": ["selftest.provider"],
        "providers": [{"name": "selftest", "type": "selftest", "provider_id": 1}],
    }))  # fmt: skip
    procs = []
    addresses = []
    try:
        for k in range(len(NICS)):  # one after the other: selections 1 and 2 of the server namespace's bucket
            proc, address = _start_server(server_ns, config, tmp / "control-servers", tmp / f"server-{k}.log")
            procs.append(proc)
            addresses.append(address)
        yield addresses
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_servers_listen_on_distinct_nics(servers: list[str]) -> None:
    assert [a.rsplit(":", 1)[0] for a in servers] == ["tcp://10.99.1.1", "tcp://10.99.2.1"]


def test_roundrobin_clients_use_both_nics(namespaces: tuple[str, str], servers: list[str], tmp_path: Path) -> None:
    _, client_ns = namespaces
    before = _tx_bytes(client_ns)
    results = _run_clients(client_ns, "roundrobin", servers, 4, tmp_path / "control-clients")
    after = _tx_bytes(client_ns)
    assert Counter(r["nic"] for r in results) == Counter({"nic0": 2, "nic1": 2})
    for r in results:
        assert r["sockname"] == r["address"]  # the connection left from the chosen NIC's address
        assert r["server_plumber"]["address"] == r["target"].split("//")[1].rsplit(":", 1)[0]
        assert "roundrobin" in r["server_plumber"]["reason"]
    for nic in NICS:  # each client's BULK_BYTES left through its own NIC's veth, not the target's
        assert after[nic] - before[nic] >= 2 * BULK_BYTES, (nic, before, after)


def test_byset_unbound_clients_share_one_nic(namespaces: tuple[str, str], servers: list[str], tmp_path: Path) -> None:
    """The paper's third scenario on real links: unbound processes share a cpuset, so byset gives them all
    the same NIC and the other link stays idle (Carns 2025, Figure 2)."""
    _, client_ns = namespaces
    before = _tx_bytes(client_ns)
    results = _run_clients(client_ns, "byset", servers, 4, tmp_path / "control-clients")
    after = _tx_bytes(client_ns)
    assert {r["nic"] for r in results} == {"nic0"}
    assert {r["target"].rsplit(":", 1)[0] for r in results} == {"tcp://10.99.2.1"}  # routed by source: via nic0
    assert all(r["sockname"] == "10.99.1.2" for r in results)
    assert after["nic0"] - before["nic0"] >= 4 * BULK_BYTES
    assert after["nic1"] - before["nic1"] < BULK_BYTES // 4  # idle but for stray control packets
