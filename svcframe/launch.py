"""Launch N server processes on this machine from one bootstrap config, and stop them.

Each process is a full server (``python -m svcframe serve``). Readiness is a signal, not a sleep: a
process writes one JSON line (``{"ok": true, "address": ...}`` or ``{"ok": false, "error": ...}``) on a
pipe once it accepts calls, or the pipe closes because it died (its log tail is then the reason). When
every process is ready the group file is written (``svcframe.group.write_group_file``, atomically)::

    {"members": [{"rank": 0, "address": "tcp://127.0.0.1:41234", "provider_id": 0, "pid": 1234}, ...],
     "metadata": {"config": "...", "host": "...", "created": 1700000000.0}}

(the Flock group-file shape, with the admin provider id per member). A server that exits while the others
serve on (killed, crashed, shut down on its own) is noticed at once (``wait_for_exits``: a pidfd per process),
and the group file is written again with the live members only, the departed in ``metadata.departed``::

    "metadata": {..., "departed": [{"rank": 1, "pid": 1235, "status": "killed by SIGKILL", "when": ...}]}

(removed when no member is left). On a cluster, processes are started by the site launcher (srun, mpiexec)
instead; this module is the single-machine case.

Each server gets its rank in ``$SVCFRAME_RANK`` and the group file in ``$SVCFRAME_GROUP``. When the config has a
group provider (``svcframe.group_provider``), the group keeps that file equal to its view; a server that exits is
then also removed from the view at once: the launcher, which saw it end, asks a live member's group provider to
remove it (an authenticated ``leave`` for another), and the file is rewritten with every other member's entry kept
as the group wrote it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .composition import check_document
from .config import ServiceConfig, load_config, read_document
from .errors import AppError, LaunchError, SvcframeError
from .group import (
    GROUP_ENV,
    GROUP_PROVIDER_TYPES,
    RANK_ENV,
    Member,
    read_group_document,
    write_group_document,
    write_group_file,
)
from .transport import parse_address


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def describe_exit(code: int) -> str:
    """A process's exit code in words: ``"exited with code 1"``, ``"killed by SIGKILL"``, ``"exited cleanly"``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return "exited cleanly" if code == 0 else f"exited with code {code}"


class Launch:
    """N server processes from one config on this machine.

    Args:
        config: a ServiceConfig or a path to a JSON config.
        procs: number of server processes.
        cores: pin rank i to ``cores[i % len(cores)]`` (None = no pinning).
        group_file: where to write the group file once all are ready (None = not written).
        start_timeout_seconds: how long to wait for every process to report readiness.

    Use as a context manager, or ``start()`` / ``stop()``. Raises LaunchError from ``start()``.
    """

    def __init__(
        self,
        config: ServiceConfig | str | os.PathLike[str],
        procs: int = 1,
        *,
        cores: list[int] | None = None,
        group_file: str | os.PathLike[str] | None = None,
        start_timeout_seconds: float = 60.0,
        secret_file: str | None = None,
    ) -> None:
        if procs < 1:
            raise LaunchError("--procs must be at least 1")
        self.config_source = str(config) if not isinstance(config, ServiceConfig) else "(in memory)"
        if isinstance(config, ServiceConfig):
            self.config = config
        else:  # every problem of the user's file, before anything starts (as svcframe config check --procs N)
            _, _, findings = check_document(read_document(config), str(config), procs=procs)
            findings.raise_problems()
            self.config = load_config(config)
        self.procs = procs
        self.cores = cores
        self.group_file = Path(group_file) if group_file else None
        self.start_timeout_seconds = start_timeout_seconds
        self.secret_file = secret_file
        self.workdir = Path(tempfile.mkdtemp(prefix="svcframe-launch-"))  # rank configs and logs
        self.workdir_kept = True
        self.members: list[Member] = []
        self._created = 0.0  # when the group was first complete (the group file's metadata.created)
        self.departed: dict[int, dict[str, Any]] = {}  # rank -> {"rank", "pid", "status", "when"}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._pidfds: dict[int, int] = {}  # rank -> pidfd of its process (readable once it exited)
        groups = [p for p in self.config.providers if p.type in GROUP_PROVIDER_TYPES]
        self.has_group = bool(groups)
        self.group_provider_id = groups[0].provider_id if groups else None  # None: assigned; the file says
        self.group_notes: dict[int, str] = {}  # rank -> what the group did when it departed
        # No orphaned servers if the launcher dies: each server watches the read end of this pipe and shuts
        # down when the write end, held only by this process, closes. (PR_SET_PDEATHSIG is not used: it
        # fires when the *thread* that started the child exits, not the process.)
        self._lifeline: int | None = None

    def _rank_config(self, rank: int) -> ServiceConfig:
        cfg = self.config.model_copy(deep=True)
        addr = parse_address(cfg.engine.address)
        if addr.scheme == "unix" and self.procs > 1:
            cfg.engine.address = f"unix://{addr.path}.{rank}"
        elif addr.scheme == "tcp" and addr.port and self.procs > 1:
            cfg.engine.address = f"tcp://{addr.host}:{addr.port + rank}"
        if self.cores:
            cfg.engine.cpu_affinity = [self.cores[rank % len(self.cores)]]
        return cfg

    def start(self) -> list[Member]:
        readers: dict[int, int] = {}
        lifeline_r, self._lifeline = os.pipe()
        os.set_inheritable(self._lifeline, False)
        try:
            for rank in range(self.procs):
                path = self.workdir / f"rank-{rank}.json"
                path.write_text(self._rank_config(rank).model_dump_json())
                r, w = os.pipe()
                cmd = [sys.executable, "-m", "svcframe", "serve", str(path), "--ready-fd", str(w),
                       "--lifeline-fd", str(lifeline_r), "--config-name", self.config_source, "--rank", str(rank),
                       "--procs", str(self.procs)]  # fmt: skip
                if self.secret_file:
                    cmd += ["--secret-file", self.secret_file]
                env = {**os.environ, RANK_ENV: str(rank)}
                if self.group_file is not None:
                    env[GROUP_ENV] = str(self.group_file.resolve())
                log = open(self.workdir / f"rank-{rank}.log", "wb")  # noqa: SIM115 - owned by the child
                proc = subprocess.Popen(
                    cmd, pass_fds=(w, lifeline_r), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env=env,
                )  # fmt: skip
                log.close()
                os.close(w)
                self._procs.append(proc)
                readers[r] = rank
            self.members = self._await_ready(readers)
        except BaseException:
            self.stop()
            raise
        finally:
            os.close(lifeline_r)
            for r in readers:
                os.close(r)
        self._created = time.time()
        self._write_group_file()
        return self.members

    def _write_group_file(self) -> None:
        """The group file: the live members, and the departed ones in the metadata (none left: removed)."""
        if self.group_file is None:
            return
        live = [m for m in self.members if m.rank not in self.departed]
        metadata: dict[str, Any] = {"config": self.config_source, "host": socket.gethostname(),
                                    "created": self._created}  # fmt: skip
        if self.departed:
            metadata["departed"] = [self.departed[r] for r in sorted(self.departed)]
        doc = read_group_document(self.group_file) if self.has_group and self.departed else None
        if live and doc is not None:  # the group's file: its entries kept, the departed ones out
            gone = {m.address for m in self.members if m.rank in self.departed}
            doc["members"] = [e for e in doc["members"] if e.get("address") not in gone]
            doc["metadata"].update(departed=metadata["departed"])
            write_group_document(self.group_file, doc)
        elif live:
            write_group_file(self.group_file, live, metadata)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.group_file.unlink()

    def wait_for_exits(self, timeout_seconds: float | None = None, wake_fd: int | None = None) -> dict[int, int]:
        """Wait until a live server exits (or ``wake_fd`` is readable, or the timeout passes); record each
        server that exited since the last call as departed and rewrite the group file without it.

        Args:
            timeout_seconds: None waits until something happens.
            wake_fd: a descriptor that ends the wait when readable (``signal.set_wakeup_fd``'s pipe).

        Returns:
            The exit codes of the servers that departed now, by rank (a signal is a negative code).
        """
        live = {rank: p for rank, p in enumerate(self._procs) if rank not in self.departed}
        fds = [self._pidfd(rank, p) for rank, p in live.items()]
        watch = [fd for fd in fds if fd is not None] + ([wake_fd] if wake_fd is not None else [])
        if len(watch) == len(live) + (wake_fd is not None) and watch:
            with contextlib.suppress(InterruptedError):
                select.select(watch, [], [], timeout_seconds)
        else:  # no pidfd (an old kernel): poll the processes
            deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
            while all(p.poll() is None for p in live.values()):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                ready, _, _ = select.select([wake_fd] if wake_fd is not None else [], [], [], 0.2)
                if ready:
                    break
        now: dict[int, int] = {}
        for rank, p in live.items():
            code = p.poll()
            if code is None:
                continue
            now[rank] = code
            self.departed[rank] = {"rank": rank, "pid": p.pid, "status": describe_exit(code), "when": time.time()}
            fd = self._pidfds.pop(rank, None)
            if fd is not None:
                os.close(fd)
        if now:
            self._write_group_file()
            self.group_notes.update(self._tell_group([m for m in self.members if m.rank in now]))
        return now

    def _tell_group(self, gone: list[Member]) -> dict[int, str]:
        """Ask a live member's group provider to remove members that exited (the launcher saw them end: proof a
        member's own failure detection would take seconds to reach). Returns a note per rank for the output."""
        live = [m for m in self.members if m.rank not in self.departed]
        if not self.has_group or not gone or not live:
            return {}
        doc = read_group_document(self.group_file) if self.group_file is not None else None
        ids = {e.get("address"): e.get("group_provider_id") for e in doc["members"]} if doc else {}

        async def tell() -> dict[int, str]:
            from .engine import FROM_ENVIRONMENT, Engine
            from .server import read_secret_file

            secret = read_secret_file(self.secret_file) if self.secret_file else FROM_ENVIRONMENT
            notes: dict[int, str] = {}
            async with Engine(None, secret=secret) as engine:
                for m in gone:
                    problem = "no live member runs the group provider"
                    for peer in live:
                        group_id = (
                            self.group_provider_id if self.group_provider_id is not None else ids.get(peer.address)
                        )
                        if not isinstance(group_id, int):
                            continue
                        try:
                            await engine.call(peer.address, "leave", {"address": m.address}, provider_id=group_id,
                                              timeout_seconds=2.0)  # fmt: skip
                        except AppError as exc:
                            if exc.code == "NotMember":  # the group removed it already
                                notes[m.rank] = "already out of the group's view"
                                break
                            problem = f"{peer.address}: {exc}"
                        except SvcframeError as exc:
                            problem = f"{peer.address}: {exc}"
                        else:
                            view = await engine.call(peer.address, "view", None, provider_id=group_id,
                                                     timeout_seconds=2.0)  # fmt: skip
                            notes[m.rank] = f"removed from the group's view (version {view['version']})"
                            break
                    else:
                        notes[m.rank] = f"the group could not be told ({problem}); it detects the exit itself"
            return notes

        from .loops import run

        try:
            return run(tell())
        except SvcframeError as exc:
            return {m.rank: f"the group could not be told ({exc}); it detects the exit itself" for m in gone}

    def _pidfd(self, rank: int, proc: subprocess.Popen[bytes]) -> int | None:
        if rank not in self._pidfds:
            try:
                self._pidfds[rank] = os.pidfd_open(proc.pid)
            except (OSError, AttributeError):
                return None
        return self._pidfds[rank]

    def _await_ready(self, readers: dict[int, int]) -> list[Member]:
        deadline = time.monotonic() + self.start_timeout_seconds
        found: dict[int, Member] = {}
        buffers = {r: b"" for r in readers}
        open_fds = set(readers)
        while len(found) < self.procs:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                missing = sorted(set(range(self.procs)) - set(found))
                raise LaunchError(
                    f"server rank(s) {missing} not ready within {self.start_timeout_seconds:g} s (logs kept in "
                    f"{self.workdir})"
                )
            ready, _, _ = select.select(list(open_fds), [], [], timeout)
            for fd in ready:
                rank = readers[fd]
                chunk = os.read(fd, 65536)
                buffers[fd] += chunk
                if chunk and b"\n" not in buffers[fd]:
                    continue
                open_fds.discard(fd)
                line = buffers[fd].split(b"\n", 1)[0]
                try:
                    msg: dict[str, Any] = (
                        json.loads(line) if line else {"ok": False, "error": "exited before reporting readiness"}
                    )
                except ValueError:
                    msg = {"ok": False, "error": f"bad readiness line {line[:200]!r}"}
                if not msg.get("ok"):
                    raise LaunchError(
                        f"server rank {rank} failed to start: {msg.get('error')} (logs kept in {self.workdir})\n"
                        f"{self.log_tail(rank)}"
                    )
                found[rank] = Member(rank, msg["address"], self.config.admin.provider_id, int(msg["pid"]))
        return [found[r] for r in range(self.procs)]

    def log_tail(self, rank: int, lines: int = 20) -> str:
        try:
            text = (self.workdir / f"rank-{rank}.log").read_text(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last lines of rank {rank}'s log ---\n{tail}" if tail else ""

    def poll(self) -> dict[int, int]:
        """Exit codes of processes that have exited, by rank."""
        return {rank: p.returncode for rank, p in enumerate(self._procs) if p.poll() is not None}

    def wait(self, timeout_seconds: float | None = None) -> dict[int, int]:
        """Wait until every process has exited or the timeout passed; return the exit codes so far."""
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        for p in self._procs:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                p.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                break
        return self.poll()

    def stop(self, grace_seconds: float = 10.0) -> dict[int, int]:
        """SIGTERM every process (they drain and exit), SIGKILL after ``grace_seconds``; return exit codes."""
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        codes: dict[int, int] = {}
        for rank, p in enumerate(self._procs):
            try:
                codes[rank] = p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                codes[rank] = p.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()
        if self.group_file is not None and self.members:
            with contextlib.suppress(FileNotFoundError):
                self.group_file.unlink()
        # the rank configs and logs: removed after a clean run, kept (and named) when a server failed
        self.workdir_kept = any(c != 0 for c in codes.values()) or not self.members
        if not self.workdir_kept:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return codes

    def __enter__(self) -> Launch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
