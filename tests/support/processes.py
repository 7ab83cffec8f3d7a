"""One throwaway server process for tests: the life cycle shared by every kind of server.

:class:`ServerProcess` starts a server on a free loopback port (another port if it lost
the race for that one), writes its output to a log file in its own directory, waits until
it answers, and can pause it (SIGSTOP: sockets stay open, nothing answers), resume it,
stop it, kill it (a crash), restart it on the same port, and close it (kill and remove
the directory). Every server dies with the test process (``PR_SET_PDEATHSIG`` on Linux,
plus an ``atexit`` sweep), so a crashed test run never leaves a server behind.

A kind of server (:mod:`tests.support.redis_servers`, :mod:`tests.support.postgres_server`)
says how to launch it (:meth:`ServerProcess._argv`) and how to tell it is ready
(:meth:`ServerProcess._ready`); it may widen :meth:`ServerProcess._signal` (PostgreSQL
signals its backends too) and :meth:`ServerProcess._reap`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar, Self

__all__ = ["ServerProcess", "free_port"]

_LIVE: set[ServerProcess] = set()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the server retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServerProcess:
    """A server process on 127.0.0.1 that this test process owns."""

    #: The program's name, for errors ("redis-server did not start").
    name: ClassVar[str]
    #: The log file's name inside :attr:`dir`.
    log_name: ClassVar[str]
    #: The signal :meth:`stop` sends for a clean shutdown, and how long it waits.
    stop_signal: ClassVar[int] = signal.SIGTERM
    stop_timeout: ClassVar[float] = 10.0
    #: Seconds between readiness probes while starting.
    probe_interval: ClassVar[float] = 0.01

    def __init__(
        self, directory: Path, *, port: int | None, own_dir: bool, start_timeout: float
    ) -> None:
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.dir = directory
        self._own_dir = own_dir
        self.start_timeout = start_timeout
        self.proc: Any = None  # subprocess.Popen, or what _spawn returns

    # -- what a kind of server says ------------------------------------------------------

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        """One probe: does the server answer yet?"""
        raise NotImplementedError

    def _preexec(self) -> None:
        die_with_parent()

    def _spawn(self) -> Any:
        """Start the process (:meth:`_argv` in :attr:`dir`, output to the log): a
        :class:`subprocess.Popen`, or what answers the same (``poll``, ``wait``,
        ``send_signal``, ``kill``)."""
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self._argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=self._preexec,
                cwd=self.dir,
            )

    # -- life cycle ----------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.dir / self.log_name

    def start(self) -> None:
        """Start the process and wait until it answers."""
        for attempt in range(5):
            self.proc = self._spawn()
            _LIVE.add(self)
            if self._wait_ready():
                return
            self._reap()
            if self._fixed_port or attempt == 4:
                break
            self.port = free_port()  # lost the race for the port; try another
        raise RuntimeError(f"{self.name} did not start; log:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if self._ready():
                return True
            time.sleep(self.probe_interval)
        return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets open but answers nothing."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)

    def stop(self, timeout: float | None = None) -> None:
        """A clean shutdown (:attr:`stop_signal`) and wait; a paused server is resumed so
        that it can exit, one that does not exit in time is killed."""
        if self.proc is None:
            return
        self.resume()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reap()

    def kill(self) -> None:
        """SIGKILL: a crash, no clean shutdown."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        _LIVE.discard(self)

    def restart(self) -> None:
        """Stop and start again on the same port with the same directory."""
        self.stop()
        fixed, self._fixed_port = self._fixed_port, True
        try:
            self.start()
        finally:
            self._fixed_port = fixed

    def close(self) -> None:
        """Kill the process and remove its directory (if this object created it)."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} 127.0.0.1:{self.port} running={self.running}>"


def live_servers() -> list[ServerProcess]:
    """The servers this process started and has not stopped."""
    return list(_LIVE)


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.close()
