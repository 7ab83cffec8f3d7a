"""Run scripts as ``python script.py`` runs them, in children forked from one warm process.

A docs snippet runs in a fresh process of its own ("as printed"). Starting Python and
importing LangChain, LangGraph and this package costs 2-3 s of CPU per process, more than
most snippets take themselves. A :class:`WarmRunner` pays it once: a helper process
imports them and then forks one child per script (it has a single thread, so forking it is
safe). To the script the child is a new process: ``__main__`` is the script, ``sys.argv``
and ``sys.path[0]`` are as ``python script.py`` sets them, the working directory and
output are its own, and the exit handlers run at its end; only the modules are imported
already. ``python -m tests.support.warm_runner`` is the helper (it reads one JSON request
a line on stdin and answers each with the child's exit code).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

__all__ = ["WarmRunner"]

#: What the helper imports before it forks: what the snippets import, each if installed.
WARM = (
    "langchain_idempotent",
    "langchain_idempotent.adapters.tool",
    "langchain_idempotent.adapters.middleware",
    "langchain_idempotent.stores.sqlite",
    "langchain_core.tools",
    "langchain_core.messages",
    "langchain_core.language_models.fake_chat_models",
    "langgraph.graph",
    "langgraph.prebuilt",
    "langgraph.func",
    "langgraph.checkpoint.memory",
    "langchain.agents",
)


class WarmRunner:
    """The helper process, started once; :meth:`run` one script in a forked child."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[2]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.warm_runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=root,
        )

    def run(self, script: Path, timeout: float) -> tuple[int, str, str]:
        """``python script`` in the script's folder: its exit code, stdout and stderr."""
        folder = script.parent
        out, err = folder / "stdout.txt", folder / "stderr.txt"
        request = {"script": str(script), "out": str(out), "err": str(err)}
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise TimeoutError(f"{script} ran longer than {timeout} s")
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm runner died (exit {self._proc.wait()})")
        return int(json.loads(line)["code"]), out.read_text(), err.read_text()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


def _child(script: str, out: str, err: str) -> None:
    """In the forked child: become ``python script`` and exit with its code."""
    os.setpgid(0, 0)  # the helper can kill what the script starts, and nothing else
    os.chdir(os.path.dirname(script))
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the process's own stdin, for its life)
    sys.argv = [script]
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
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
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve() -> None:
    for name in WARM:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request["script"], request["out"], request["err"])
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # what the script left running
        sys.stdout.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
