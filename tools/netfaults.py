"""Network faults on a node of tools/netns_nodes.sh's bed: packet loss, delay with jitter, link down and up.

With ``tc netem`` where the kernel has it (``sch_netem``): ``tc qdisc replace dev eth0 root netem loss P%`` or
``delay Dms Jms``. A kernel built without it (``CONFIG_NET_SCH_NETEM`` not set, as on some cloud VMs) gets the
same faults another way, and ``mechanism()`` says which:

- loss: nftables drops that share of the packets leaving the node (``numgen random mod 100000 < P``): real
  packets lost in the kernel, as netem's ``loss``;
- delay: the packets leaving the node go to an NFQUEUE (``iptables -j NFQUEUE --queue-bypass``), where this
  script, run in the node's namespace (``delay-queue``), holds each for ``D + uniform(-J, J)`` ms before it lets
  it go, as netem's ``delay D J`` (a uniform jitter, which reorders packets as netem's does).

    python tools/netfaults.py delay-queue --queue 7 --delay-ms 50 --jitter-ms 10    (in the node's namespace)

The delay queue speaks nfnetlink_queue (``linux/netfilter/nfnetlink_queue.h``) over a raw netlink socket: it
asks for the packets' metadata only (``NFQNL_COPY_META``) and answers each with ``NF_ACCEPT`` when its time
comes. With ``--queue-bypass`` the kernel lets packets through unqueued if this process is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big-endian queue number, packed by hand)


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


class DelayQueue:
    """One NFQUEUE's packets, each let go after its delay."""

    def __init__(self, queue: int, delay_seconds: float, jitter_seconds: float, seed: int | None = None) -> None:
        self.queue = queue
        self.delay = delay_seconds
        self.jitter = jitter_seconds
        self.rng = random.Random(seed)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((0, 0))
        self.seq = 0
        self.held: list[tuple[float, int]] = []  # (when, packet id)
        self.packets = 0
        self._config(_attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, socket.htons(socket.AF_INET))))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)))

    def _config(self, attrs: bytes) -> None:
        self.seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attrs, self.seq, NLM_F_REQUEST | NLM_F_ACK))
        data = self.sock.recv(65536)
        _, kind, _, _, _ = _NLMSGHDR.unpack_from(data)
        if kind == NLMSG_ERROR:
            error = struct.unpack_from("=i", data, _NLMSGHDR.size)[0]
            if error:
                raise OSError(-error, f"nfnetlink_queue config: {os.strerror(-error)}")

    def _verdict(self, packet_id: int) -> None:
        self.seq += 1
        attrs = _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))
        self.sock.send(_message(NFQNL_MSG_VERDICT, self.queue, attrs, self.seq))

    def _received(self, data: bytes, now: float) -> None:
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                pos, end = offset + _NLMSGHDR.size + _NFGENMSG.size, offset + length
                while pos + 4 <= end:
                    alen, akind = struct.unpack_from("=HH", data, pos)
                    if alen < 4:
                        break
                    if akind & 0x7FFF == NFQA_PACKET_HDR:
                        packet_id = struct.unpack_from(">I", data, pos + 4)[0]
                        wait = max(0.0, self.delay + self.rng.uniform(-self.jitter, self.jitter))
                        heapq.heappush(self.held, (now + wait, packet_id))
                        self.packets += 1
                        break
                    pos += alen + (-alen % 4)
            offset += length + (-length % 4)

    def run(self, stop: list[bool]) -> None:
        while not stop[0]:
            now = time.monotonic()
            while self.held and self.held[0][0] <= now:
                self._verdict(heapq.heappop(self.held)[1])
            timeout = max(0.0, self.held[0][0] - now) if self.held else 0.5
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if ready:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    self._received(self.sock.recv(1 << 20), time.monotonic())
        for _, packet_id in self.held:  # let the held ones go
            self._verdict(packet_id)


# -- applying faults to a node --------------------------------------------------------------------------------------
def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def netem_available() -> bool:
    """Whether this kernel has ``sch_netem`` (tried on a veth in a scratch namespace)."""
    ns = f"svcf-netem-probe-{os.getpid()}"
    if _run("ip", "netns", "add", ns).returncode != 0:
        return False
    try:
        _run("ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        return _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p0", "root", "netem", "loss",
                    "1%").returncode == 0  # fmt: skip
    finally:
        _run("ip", "netns", "del", ns)


@dataclass
class NodeFaults:
    """Faults on one node's link (``dev`` in namespace ``ns``): ``loss``, ``delay``, ``link``; ``clear()`` undoes
    them all. ``netem``: use tc netem (else nftables and the delay queue)."""

    ns: str
    dev: str = "eth0"
    netem: bool = True
    queue: int = 7
    _delayer: subprocess.Popen[bytes] | None = None

    def _exec(self, *cmd: str) -> None:
        result = _run("ip", "netns", "exec", self.ns, *cmd)
        if result.returncode != 0:
            raise RuntimeError(f"{self.ns}: {' '.join(cmd)}: {result.stderr.strip()}")

    def loss(self, percent: float) -> None:
        self.clear()
        if self.netem:
            self._exec("tc", "qdisc", "replace", "dev", self.dev, "root", "netem", "loss", f"{percent}%")
            return
        self._exec("nft", "add", "table", "inet", "svcf_faults")
        self._exec("nft", "add", "chain", "inet", "svcf_faults", "out", "{ type filter hook output priority 0; }")
        self._exec("nft", "add", "rule", "inet", "svcf_faults", "out", "oifname", self.dev, "numgen", "random",
                   "mod", "100000", "<", str(round(percent * 1000)), "drop")  # fmt: skip

    def delay(self, delay_ms: float, jitter_ms: float) -> None:
        self.clear()
        if self.netem:
            self._exec("tc", "qdisc", "replace", "dev", self.dev, "root", "netem", "delay", f"{delay_ms}ms",
                       f"{jitter_ms}ms")  # fmt: skip
            return
        self._delayer = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, __file__, "delay-queue", "--queue", str(self.queue),
             "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert self._delayer.stdout is not None
        line = self._delayer.stdout.readline().decode()  # "ready" once bound to the queue
        if "ready" not in line:
            raise RuntimeError(f"{self.ns}: the delay queue did not start: {line}")
        self._exec("iptables-legacy", "-A", "OUTPUT", "-o", self.dev, "-j", "NFQUEUE", "--queue-num",
                   str(self.queue), "--queue-bypass")  # fmt: skip

    def link(self, up: bool) -> None:
        self._exec("ip", "link", "set", self.dev, "up" if up else "down")

    def clear(self) -> None:
        _run("ip", "netns", "exec", self.ns, "tc", "qdisc", "del", "dev", self.dev, "root")
        _run("ip", "netns", "exec", self.ns, "nft", "delete", "table", "inet", "svcf_faults")
        while _run("ip", "netns", "exec", self.ns, "iptables-legacy", "-D", "OUTPUT", "-o", self.dev, "-j", "NFQUEUE",
                   "--queue-num", str(self.queue), "--queue-bypass").returncode == 0:  # fmt: skip
            pass
        if self._delayer is not None:
            self._delayer.send_signal(signal.SIGTERM)
            try:
                self._delayer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._delayer.kill()
                self._delayer.wait()
            self._delayer = None


def mechanism(netem: bool) -> str:
    """How loss and delay are made, for the benchmark's output."""
    if netem:
        return "tc netem"
    return "nftables (loss) and an NFQUEUE delay queue (delay): this kernel has no sch_netem"


def tools_missing(netem: bool) -> list[str]:
    need = ["ip", "tc"] if netem else ["ip", "nft", "iptables-legacy"]
    return [t for t in need if shutil.which(t) is None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dq = sub.add_parser("delay-queue", help="hold the packets of an NFQUEUE (run in the node's namespace)")
    dq.add_argument("--queue", type=int, required=True)
    dq.add_argument("--delay-ms", type=float, required=True)
    dq.add_argument("--jitter-ms", type=float, default=0.0)
    sub.add_parser("netem", help="print whether this kernel has tc netem")
    args = parser.parse_args()
    if args.command == "netem":
        print("yes" if netem_available() else "no")
        return
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__(0, True))
    queue = DelayQueue(args.queue, args.delay_ms / 1000, args.jitter_ms / 1000)
    print("ready", flush=True)
    queue.run(stop)
    print(f"released {queue.packets} packets", flush=True)


if __name__ == "__main__":
    main()
