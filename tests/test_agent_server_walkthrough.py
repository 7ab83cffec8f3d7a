"""The Agent Server walkthrough (``docs/agent-server.md``), run as printed, with only the
``[server]`` extra.

Its commands start the payment provider (``python -m graphs.provider``) and a real
``langgraph dev`` on the repository's ``langgraph.json``, in a Python where what only the
``[demo]`` extra installs cannot be imported (``langgraph-checkpoint-sqlite``, ``rich``,
``matplotlib``, ...): the server loads both graphs. Then the walkthrough's script double-texts
a refund while it settles: one refund protected, two with the plain assistant.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_server import REPO, AgentServer, free_port, langgraph_cli

pytestmark = [
    pytest.mark.skipif(langgraph_cli() is None, reason="langgraph-cli not installed"),
    pytest.mark.server,
]

#: Modules that only the [demo] extra brings (beside what the core and [server] install).
DEMO_ONLY = ("langgraph.checkpoint.sqlite", "aiosqlite", "sqlite_vec", "rich", "matplotlib")
BLOCKER = f"""
import importlib.abc, sys

class _DemoOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in {DEMO_ONLY!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}} (only [server] installed)")
        return None

sys.meta_path.insert(0, _DemoOnly())
"""


def walkthrough() -> tuple[list[str], str]:
    page = (REPO / "docs" / "agent-server.md").read_text()
    section = page.split("* **Which store.**")[0]
    bash = re.search(r"```bash\n(.*?)```", section, re.S)
    script = re.search(r"```python\n(.*?)```", section, re.S)
    assert bash and script, "the walkthrough has a bash block and a python block"
    return bash.group(1).splitlines(), script.group(1)


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[str]:
    """The provider, started by the walkthrough's own command (on a free port)."""
    [command] = [line for line in walkthrough()[0] if "graphs.provider" in line]
    argv = command.split("#")[0].split()
    assert argv[:3] == ["python", "-m", "graphs.provider"], command
    port = str(free_port())
    argv[argv.index("--port") + 1] = port
    proc = subprocess.Popen(
        [sys.executable, *argv[1:]], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert f"payment provider on http://127.0.0.1:{port}" in first, first
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def test_the_walkthrough_runs_on_the_server_extra_alone_and_refunds_once(
    tmp_path: Path, provider: str
) -> None:
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    server = AgentServer(
        tmp_path,
        env={"REFUND_PROVIDER_URL": provider, "PYTHONPATH": str(tmp_path / "blocker")},
    )
    _, script = walkthrough()
    assert 'SERVER_URL = "http://127.0.0.1:2024"' in script and "settle_seconds" in script
    script = script.replace("http://127.0.0.1:8700", provider)
    with server:
        assert "ModuleNotFoundError" not in server.log_text()
        script = script.replace("http://127.0.0.1:2024", server.url)
        answers = {}
        for assistant in ("refund_agent", "refund_agent_plain"):
            path = tmp_path / f"{assistant}.py"
            path.write_text(script.replace('"refund_agent"', f'"{assistant}"'))
            done = subprocess.run(
                [sys.executable, str(path)], capture_output=True, text=True, timeout=240
            )
            assert done.returncode == 0, done.stderr[-3000:] + server.log_text()[-3000:]
            answers[assistant] = done.stdout.strip().splitlines()[-1]
    assert answers == {"refund_agent": "refunds: 1", "refund_agent_plain": "refunds: 2"}
