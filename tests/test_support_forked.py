"""The crash tests' forked processes are what ``python ...`` would start: the program's own
argv, working directory, environment, path, output and exit code (a SIGKILL included)."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

from tests.support import forked

PROGRAM = textwrap.dedent(
    """
    import atexit, json, os, sys
    atexit.register(lambda: print("exit handler ran"))
    print(json.dumps({
        "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
        "extra": os.environ.get("EXTRA"), "on_path": os.environ.get("EXTRA") in sys.path,
    }))
    sys.stdout.flush()
    if sys.argv[-1] == "fail":
        raise RuntimeError("the program failed")
    if sys.argv[-1] == "kill":
        os.kill(os.getpid(), 9)
    sys.exit(int(sys.argv[-1]))
    """
)


def _run(tmp_path: Path, argv: list[str]) -> tuple[int, list[str], str]:
    env = {"EXTRA": str(tmp_path / "lib"), "PYTHONPATH": str(tmp_path / "lib")}
    done = forked.run(argv, folder=tmp_path, timeout=60, cwd=tmp_path, env=env)
    return done.returncode, done.stdout.splitlines(), done.stderr


def test_a_script_runs_as_python_script_runs_it(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "program.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    code, out, _ = _run(tmp_path, [str(script), "a", "3"])
    seen = json.loads(out[0])
    assert code == 3
    assert seen["name"] == "__main__" and seen["argv"] == [str(script), "a", "3"]
    assert seen["cwd"] == str(tmp_path) and seen["path0"] == str(script.parent)
    assert seen["on_path"]  # $PYTHONPATH
    assert out[1] == "exit handler ran"


def test_code_runs_as_python_c_runs_it(tmp_path: Path) -> None:
    code, out, _ = _run(tmp_path, ["-c", PROGRAM, "0"])
    seen = json.loads(out[0])
    assert code == 0 and seen["argv"] == ["-c", "0"] and seen["path0"] == str(tmp_path)


def test_a_module_runs_as_python_m_runs_it(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "prog.py").write_text(PROGRAM)
    code, out, _ = _run(tmp_path, ["-m", "prog", "0"])
    seen = json.loads(out[0])
    assert code == 0 and seen["name"] == "__main__"
    assert seen["argv"] == [str(tmp_path / "lib" / "prog.py"), "0"]


def test_a_failing_program_exits_1_with_its_traceback(tmp_path: Path) -> None:
    code, _, err = _run(tmp_path, ["-c", PROGRAM, "fail"])
    assert code == 1 and "RuntimeError: the program failed" in err


def test_a_program_killed_by_a_signal_has_its_negative_exit_code(tmp_path: Path) -> None:
    code, _, _ = _run(tmp_path, ["-c", PROGRAM, "kill"])
    assert code == -signal.SIGKILL


def test_a_running_program_can_be_killed_from_outside(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    loop = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.01)"
    child = forked.start(["-c", loop], stdout=out)
    forked.wait_for_line(child, out, "ready")
    assert child.poll() is None
    child.kill()
    assert child.wait(10) == -signal.SIGKILL
