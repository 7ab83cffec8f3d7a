"""Start ``python -m module ...`` or ``python script ...`` as a process forked from a warm one.

The crash and wire tests start real processes: workers they SIGKILL mid-call and resume
with a new process, MCP servers they kill and restart. Each ``python`` pays its start and
its imports (LangChain, LangGraph, MCP, this package: 1-2 s of CPU), often more than the
process's own work. :func:`start` forks it instead from Python's own fork server
(``multiprocessing``'s ``forkserver``), which has imported :data:`PRELOAD` once, has one
thread, and is a child of the test process (each xdist worker starts its own). To the
program the child is a new process: ``__main__`` is the program, ``sys.argv``, ``sys.path[0]``,
the working directory, the environment and its output are its own, stdin is empty, and
its exit handlers run at its end; only the modules are imported already. It dies when the
fork server does (when the test process ends). :class:`ForkedProcess` answers what the tests
and :class:`~tests.support.processes.ServerProcess` ask of a :class:`subprocess.Popen`
(``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``): a SIGKILL is a real
SIGKILL, and the exit code of a killed child is ``-9`` as for ``Popen``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["PRELOAD", "ForkedProcess", "run", "run_script", "start", "wait_for_line"]

#: What the fork server imports before it forks (each if installed): what the programs
#: started this way import.
PRELOAD = [
    "langchain_idempotent",
    "langchain_idempotent.adapters.tool",
    "langchain_idempotent.adapters.middleware",
    "langchain_idempotent.stores.sqlite",
    "langchain_idempotent.stores.redis",
    "langchain_idempotent.stores.postgres",
    "langchain_idempotent.integrations.mcp",
    "langchain_core.tools",
    "langchain_core.messages",
    "langchain_core.language_models.fake_chat_models",
    "langgraph.graph",
    "langgraph.prebuilt",
    "langgraph.func",
    "langgraph.checkpoint.memory",
    "langgraph.checkpoint.sqlite",
    "langchain.agents",
    "redis",
    "psycopg",
    "psycopg_pool",
    "fastmcp",
    "mcp.server.fastmcp",
    "uvicorn",
]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


class ForkedProcess:
    """A forked program, as far as the tests use :class:`subprocess.Popen`."""

    def __init__(
        self,
        process: multiprocessing.process.BaseProcess,
        argv: list[str],
        stdout: Path,
        stderr: Path | None,
    ) -> None:
        self._process = process
        self.args = argv
        self._stdout, self._stderr = stdout, stderr
        assert process.pid is not None
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def finish(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Wait for the program (killed, and ``TimeoutExpired`` raised, if it runs longer
        than ``timeout``), kill what it left running, and give its exit code and output
        (stderr ``""`` when it went to stdout's file)."""
        try:
            code = self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)  # what the program left running
        err = self._stderr.read_text() if self._stderr is not None else ""
        return subprocess.CompletedProcess(self.args, code, self._stdout.read_text(), err)


def start(
    argv: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    stdout: str | Path = os.devnull,
    stderr: str | Path | None = None,
) -> ForkedProcess:
    """``python *argv`` (``["-m", "pkg.mod", ...]``, ``["-c", code, ...]`` or
    ``["script.py", ...]``), forked.

    Its output is appended to the files ``stdout`` and ``stderr`` (``None``: stdout's
    file too, as ``stderr=subprocess.STDOUT``); ``env`` is its whole environment (default:
    this process's). It runs in a process group of its own."""
    argv = [str(a) for a in argv]
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        raise ValueError(f"start needs '-m module', '-c code' or a script, got {argv!r}")
    process = _CONTEXT.Process(
        target=_child,
        args=(
            argv,
            str(cwd or os.getcwd()),
            dict(os.environ if env is None else env),
            str(stdout),
            None if stderr is None else str(stderr),
        ),
        name=" ".join(argv[:3]),
    )
    process.start()
    return ForkedProcess(process, argv, Path(stdout), None if stderr is None else Path(stderr))


def run(
    argv: Sequence[str],
    *,
    folder: str | Path,
    timeout: float,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """:func:`start` and wait, as ``subprocess.run(..., capture_output=True, text=True)``;
    the output is kept in ``folder`` (``forked-stdout.txt``, ``forked-stderr.txt``); what
    the program leaves running is killed."""
    folder = Path(folder)
    out, err = folder / "forked-stdout.txt", folder / "forked-stderr.txt"
    out.unlink(missing_ok=True)  # this run's output only (start appends, as to a log)
    err.unlink(missing_ok=True)
    return start(argv, cwd=cwd, env=env, stdout=out, stderr=err).finish(timeout)


def run_script(script: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python script`` in the script's folder (docs snippets, the README's quickstart)."""
    return run([str(script)], folder=script.parent, cwd=script.parent, timeout=timeout)


def wait_for_line(process: ForkedProcess, path: Path, line: str, timeout: float = 120) -> None:
    """Wait until the file ``path`` (a :func:`start`'s ``stdout``) holds the whole ``line``;
    fail if the process ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            if line in path.read_text().splitlines():
                return
        if process.poll() is not None:
            raise AssertionError(f"{process.args} exited ({process.returncode}) before {line!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{process.args} did not print {line!r} in {timeout} s")
        time.sleep(0.005)


def _child(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str | None) -> None:
    """In the forked child: become ``python *argv`` and exit with its code."""
    with contextlib.suppress(Exception):  # die with the fork server (PR_SET_PDEATHSIG)
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    os.setpgid(0, 0)  # :func:`run` can kill what the program leaves running, and nothing else
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    for fd, path in ((1, out), (2, err or out)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the process's own stdin, for its life)
    # The path ``python`` would start with: the folder (-m: the working directory), then
    # $PYTHONPATH, then the rest (the fork server's "" meant its own working directory).
    first = cwd if argv[0] in ("-m", "-c") else os.path.dirname(os.path.abspath(argv[0]))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *(p for p in sys.path if p and p not in (first, *extra))]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
