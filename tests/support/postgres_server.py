"""A throwaway PostgreSQL cluster for tests, like :mod:`tests.support.redis_servers`.

``initdb`` into a temporary directory, then the ``postgres`` server itself (not
``pg_ctl``, so that the test holds the postmaster's pid and can pause or kill it) on a free
loopback port, with its socket directory inside the cluster directory, ``fsync=off`` and
trust authentication. It never touches another PostgreSQL on the machine. PostgreSQL
refuses to run as root: when the tests run as root, ``initdb`` and ``postgres`` run as the
``postgres`` system user (Debian's ``postgresql`` package creates it).

    server = PostgresServer()           # initdb + start; PostgresServer(start=False) to wait
    server.url                          # "postgresql://postgres@127.0.0.1:<port>/postgres"
    server.pause(); server.resume()     # SIGSTOP / SIGCONT on the postmaster and backends
    server.stop(); server.kill()        # fast shutdown / SIGKILL of the postmaster
    server.restart()                    # same port, same data directory
    server.close()                      # kill and remove the directory

The life cycle is :class:`tests.support.processes.ServerProcess`'s.

The binaries are looked up on ``PATH`` and then in ``/usr/lib/postgresql/*/bin``;
:func:`postgres_available` says whether they were found (tests skip with the reason
otherwise). ``IDEMPOTENCY_TEST_PG_URL`` names an existing server to use instead (the
fixtures in ``tests/conftest.py`` honour it; fault tests that stop the server skip).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from .processes import ServerProcess

__all__ = ["PG_BIN", "PostgresServer", "postgres_available", "postgres_unavailable_reason"]


def _find_bin() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb and Path(os.path.realpath(initdb)).with_name("postgres").exists():
        return Path(os.path.realpath(initdb)).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "postgres").exists():
            return Path(candidate)
    return None


#: Directory holding ``initdb`` and ``postgres``, or ``None``.
PG_BIN = _find_bin()


def _run_as() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return None


def postgres_unavailable_reason() -> str | None:
    if PG_BIN is None:
        return "PostgreSQL binaries (initdb, postgres) not found; install Debian's postgresql"
    if os.geteuid() == 0 and _run_as() is None:
        return "running as root and there is no 'postgres' user to run PostgreSQL as"
    return None


def postgres_available() -> bool:
    return postgres_unavailable_reason() is None


class PostgresServer(ServerProcess):
    """One PostgreSQL cluster on 127.0.0.1; ``settings`` are extra ``-c name=value``."""

    name = "postgres"
    log_name = "postgres.log"
    stop_signal = signal.SIGINT  # fast shutdown: backends are terminated
    stop_timeout = 30.0
    probe_interval = 0.05

    def __init__(self, *, start: bool = True, start_timeout: float = 30.0, **settings: str) -> None:
        reason = postgres_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        super().__init__(
            Path(tempfile.mkdtemp(prefix="pg-test-")),
            port=None,
            own_dir=True,
            start_timeout=start_timeout,
        )
        self.data = self.dir / "data"
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.dir),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
            **settings,
        }
        self._user = _run_as()
        if self._user is not None:
            os.chown(self.dir, self._user.pw_uid, self._user.pw_gid)
        self._initdb()
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def connect(self, **kwargs: object) -> psycopg.Connection[tuple[object, ...]]:
        """A plain autocommit connection for setting up and inspecting state."""
        return psycopg.connect(self.url, autocommit=True, connect_timeout=5, **kwargs)  # type: ignore[arg-type]

    def _initdb(self) -> None:
        assert PG_BIN is not None
        subprocess.run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=self._preexec,
            cwd=self.dir,
        )

    # -- what ServerProcess needs --------------------------------------------------------

    def _preexec(self) -> None:
        super()._preexec()
        if self._user is not None:
            os.setgid(self._user.pw_gid)
            os.setuid(self._user.pw_uid)

    def _argv(self) -> list[str]:
        """The ``postgres`` server itself (not ``pg_ctl``: the test holds the postmaster)."""
        assert PG_BIN is not None
        argv = [str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        return argv

    def _ready(self) -> bool:
        """It accepts connections."""
        try:
            with psycopg.connect(self.url, connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    def _signal(self, sig: int) -> None:
        """Signal the postmaster and every backend (its process group is ours): a paused
        server keeps its connections open and answers nothing; a killed one crashed
        (recovery runs on the next start)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = [self.proc.pid]
        with contextlib.suppress(OSError):
            out = subprocess.run(
                ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True
            ).stdout
            pids += [int(p) for p in out.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _reap(self) -> None:
        super()._reap()
        with contextlib.suppress(OSError):
            (self.data / "postmaster.pid").unlink()
