"""Run LangGraph prebuilt's, langchain-core's, LangChain's agents, langgraph-supervisor's and
langgraph-swarm's tests with every tool made idempotent, with no options.

    python tests/peer/run.py                       # every suite, modes fresh and thread
    python tests/peer/run.py --suite core --mode off     # the suite's own baseline
    python tests/peer/run.py --suite prebuilt,core,supervisor,swarm   # all but LangChain's agents
    python tests/peer/run.py --suite prebuilt --mode thread -- -k interrupt -x
    python tests/peer/run.py --suite agents --mode thread --wrap middleware -- -k same_tool_twice

The test files come from the sdists of the *installed* versions (``pip download
--no-binary :all: --no-deps NAME==VERSION``, cached in ``--cache``, default
``.cache/peer``); only their ``tests/`` are used, so the installed packages are what is
tested. Each run loads the ``idempotent_peer`` plugin (this directory), which wraps every
tool the tests build (see its docstring). The exit status is non-zero when a test fails
that is not in :data:`BY_DESIGN` for its mode, or a by-design failure starts passing
(then the list is stale), or a tool needed a declaration before it could be wrapped (the
plugin counts them: the summary prints ``declarations needed`` per suite and mode, and the
wrapper failures, those that are neither by design nor the environment's): the lists below
are the documented ones (``docs/peer-suites.md``). The suites' own test dependencies are
the ``peer`` extra of ``pyproject.toml``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


@dataclass(frozen=True)
class Suite:
    name: str
    dist: str  # the PyPI name, also the installed distribution
    files: tuple[str, ...]  # what to copy out of the sdist, relative to its root
    tests: tuple[str, ...]  # what pytest runs, relative to the copy
    wrap: str  # the plugin's --idempotent-wrap
    #: Test files not run: they import a provider package the ``peer`` extra does not have.
    ignore: tuple[str, ...] = ()


SUITES = {
    "prebuilt": Suite(
        "prebuilt", "langgraph-prebuilt", ("pyproject.toml", "tests"), ("tests",), "toolnode"
    ),
    "core": Suite(
        "core",
        "langchain-core",
        (
            "pyproject.toml",
            "tests/__init__.py",
            "tests/unit_tests/__init__.py",
            "tests/unit_tests/conftest.py",
            "tests/unit_tests/pydantic_utils.py",
            "tests/unit_tests/stubs.py",
            "tests/unit_tests/fake",
            "tests/unit_tests/test_tools.py",
            "tests/unit_tests/test_tools_postponed_annotations.py",
        ),
        (
            "tests/unit_tests/test_tools.py",
            "tests/unit_tests/test_tools_postponed_annotations.py",
        ),
        "core",
    ),
    "agents": Suite(
        "agents",
        "langchain",
        (
            "pyproject.toml",
            "tests/__init__.py",
            "tests/unit_tests/__init__.py",
            "tests/unit_tests/conftest.py",
            "tests/unit_tests/agents",
        ),
        ("tests/unit_tests/agents",),
        "toolnode",
        ignore=tuple(
            f"tests/unit_tests/agents/{f}"
            for f in (
                "middleware/implementations/test_model_fallback.py",
                "test_response_format_integration.py",
                "test_responses_spec.py",
                "test_return_direct_spec.py",
            )
        ),  # langchain_openai
    ),
    "supervisor": Suite(
        "supervisor", "langgraph-supervisor", ("pyproject.toml", "tests"), ("tests",), "toolnode"
    ),
    "swarm": Suite("swarm", "langgraph-swarm", ("pyproject.toml", "tests"), ("tests",), "toolnode"),
}

#: Tests that fail by design, per suite and mode, each with the reason (docs/peer-suites.md).
_ISINSTANCE = "asserts isinstance(t, StructuredTool); the wrapper is an IdempotentTool"
_UNSTORABLE = (
    "returns an object that cannot replay as itself (a class defined in the test, not in "
    "allowed_types, or holding a bare object()): refused on the first call"
)
_UNKEYABLE = (
    "passes a plain object (a class defined in the test) as an InjectedToolArg: an injected "
    "value enters the key, and one with no canonical form is refused at the first call, "
    "naming key_exclude=[...] (docs/keys.md)"
)
_CORE = "tests/unit_tests/test_tools.py::"
_CORE_BY_DESIGN = {
    f"{_CORE}test_structured_tool_types_parsed": _ISINSTANCE,
    f"{_CORE}test_structured_tool_types_parsed_pydantic_v1": _ISINSTANCE,
    f"{_CORE}test_tool_return_output_mixin": _UNSTORABLE + " (a ToolOutputMixin Bar)",
    f"{_CORE}test_tool_class_callable_uses_constructor_annotations": _UNSTORABLE,
    f"{_CORE}test_tool_class_callable_attribute_annotation_is_not_injected": _UNSTORABLE,
    "tests/unit_tests/test_tools_postponed_annotations.py::"
    "test_class_callable_resolves_postponed_injected_arg": _UNSTORABLE,
    f"{_CORE}test_injected_arg_with_complex_type": _UNKEYABLE,
    f"{_CORE}test_tool_injected_arg_with_custom_schema": _UNKEYABLE,
}
_RA, _TN = "tests/test_react_agent.py::", "tests/test_tool_node.py::"
_PREBUILT_THREAD = {
    **{
        f"{_RA}test_react_agent_update_state[memory-{schema}-{v}]": (
            "the model repeats the call get_user_name({}); the test expects the repeat to "
            "interrupt again, the replay returns the stored Command and the agent loops"
        )
        for schema in ("CustomState", "CustomStatePydantic")
        for v in ("v1", "v2")
    },
    f"{_RA}test_react_agent_parallel_tool_calls[memory-v1]": (
        "resuming re-runs the tool node (v1: both calls in one task); the test expects "
        "get_weather to run twice, it runs once and the resume replays it"
    ),
    f"{_RA}test_tool_node_stream_writer": (
        "streams the same graph twice; the second run replays, so the tool writes no custom events"
    ),
    f"{_TN}test_tool_node_stream_writer": (
        "streams the same graph twice; the second run replays, so the tool writes no custom events"
    ),
    **{
        f"{_TN}test_tool_node_send_tool_call_gets_same_state_as_edge[{schema}]": (
            "runs record({}) by Send, then by edge; the second replays, so it records nothing"
        )
        for schema in (
            "_InjectStateSchema",
            "_InjectedStateDataclassSchema",
            "_InjectedStatePydanticSchema",
            "_InjectedStatePydanticV2Schema",
        )
    },
}
#: LangChain's agents suite: nothing fails by design. (At key format 3, TodoListMiddleware's
#: write_todos, a handoff, was refused without handoff=, and test_tool_runtime_config_access
#: was told a stale config: the run's config was no input of the effect.)
_AGENTS_BY_DESIGN: dict[str, str] = {}
_AGENTS_THREAD: dict[str, str] = {}
BY_DESIGN: dict[tuple[str, str], dict[str, str]] = {
    ("core", "off"): {},
    ("core", "fresh"): _CORE_BY_DESIGN,
    ("core", "thread"): _CORE_BY_DESIGN,
    ("prebuilt", "off"): {},
    ("prebuilt", "fresh"): {},
    ("prebuilt", "thread"): _PREBUILT_THREAD,
    ("agents", "off"): {},
    ("agents", "fresh"): _AGENTS_BY_DESIGN,
    ("agents", "thread"): _AGENTS_THREAD,
    **{(s, m): {} for s in ("supervisor", "swarm") for m in ("off", "fresh", "thread")},
}


#: By-design failures that do not end: the agent loops on the replayed answer, its state
#: growing every turn until the machine runs out of memory (24 GiB; capped, msgpack aborts
#: the whole process). They are deselected and counted as failed by design, unrun.
LOOPS: dict[tuple[str, str], set[str]] = {
    ("prebuilt", "thread"): {t for t in _PREBUILT_THREAD if "test_react_agent_update_state" in t},
}


#: Failures that are defects, not design, tracked elsewhere: reported, not failing the run.
KNOWN_DEFECTS: dict[tuple[str, str], dict[str, str]] = {}

#: Tests that fail with nothing wrapped (``--mode off``) in this environment: reported in
#: every mode, not failing the run (they say nothing about the wrapper).
_AG, _AGM = "tests/unit_tests/agents/", "tests/unit_tests/agents/middleware/"
_SNAPSHOT = "the graph drawing snapshot predates the installed langgraph's (tools listed in it)"
UNWRAPPED_FAILURES: dict[str, dict[str, str]] = {
    "agents": {
        f"{_AGM}core/test_framework.py::"
        "test_agent_graph_with_jump_to_end_as_after_agent": _SNAPSHOT,
        f"{_AGM}core/test_framework.py::test_create_agent_jump[memory]": _SNAPSHOT,
        f"{_AGM}core/test_framework.py::test_simple_agent_graph": _SNAPSHOT,
        f"{_AG}test_return_direct_graph.py::test_agent_graph_with_mixed_tools": _SNAPSHOT,
        f"{_AG}test_return_direct_graph.py::test_agent_graph_with_return_direct_tool": _SNAPSHOT,
        f"{_AG}test_return_direct_graph.py::test_agent_graph_without_return_direct_tools": (
            _SNAPSHOT
        ),
        f"{_AGM}core/test_overrides.py::"
        "test_model_request_initialization_preserves_concurrent_warnings": (
            "a DeprecationWarning of the installed langchain is raised as an error"
        ),
        f"{_AGM}implementations/test_tool_emulator/TestLLMToolEmulatorModelConfiguration.py::"
        "test_default_model_deprecated_and_missing_langchain_anthropic_raises_clear_error": (
            "expects langchain_anthropic to be missing; the environment has it"
        ),
    },
}


def installed(dist: str) -> str:
    return importlib.metadata.version(dist)


def fetch(suite: Suite, cache: Path) -> Path:
    """The suite's test files for the installed version, unpacked under ``cache``."""
    version = installed(suite.dist)
    root = cache / f"{suite.name}-{version}"
    if (root / ".complete").exists():
        return root
    downloads = cache / "sdists"
    downloads.mkdir(parents=True, exist_ok=True)
    stem = f"{suite.dist.replace('-', '_')}-{version}"
    sdist = downloads / f"{stem}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:",
             "--no-deps", f"{suite.dist}=={version}", "--dest", str(downloads)],
            check=True,
        )  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if any(
                m.name == f"{stem}/{f}" or m.name.startswith(f"{stem}/{f}/") for f in suite.files
            )
        ]
        tar.extractall(cache / "unpack", members=members, filter="data")
    shutil.move(cache / "unpack" / stem, root)
    (root / ".complete").touch()
    return root


#: Address space for one suite's pytest process. Under ``thread`` scope a test that expected
#: its tool to run again can loop instead, its state growing each turn; capped, it fails with
#: a MemoryError (it is on the by-design list) instead of the machine's OOM killer ending
#: the whole run (24 GiB were reached uncapped).
MEMORY_CAP = 6 * 1024**3


def _cap_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@dataclass
class Outcome:
    """One suite's run in one mode: each test's outcome (passed / failed / skipped;
    ``looped`` for the :data:`LOOPS`, deselected), pytest's exit code, and the tools the
    library refused until a declaration (``{"tool", "option", "times"}``)."""

    tests: dict[str, str]
    code: int
    declared: list[dict[str, object]]
    wrapped: int


def run(suite: Suite, mode: str, root: Path, extra: list[str]) -> Outcome:
    """Run one suite in one mode."""
    loops = sorted(LOOPS.get((suite.name, mode), set()))
    extra = [*extra, *(arg for t in loops for arg in ("--deselect", t))]
    extra += [arg for path in suite.ignore for arg in ("--ignore", path)]
    report = root / f"report-{mode}.xml"
    report.unlink(missing_ok=True)  # a run that dies must not be judged by an old report
    counted = root / f"declared-{mode}.json"
    counted.unlink(missing_ok=True)
    env = {
        **os.environ,
        # A test that loops under thread scope (a replay where it expected an interrupt)
        # then stops at LangGraph's recursion limit instead of running out of memory.
        "LANGGRAPH_DEFAULT_RECURSION_LIMIT": "100",
        "IDEMPOTENT_PEER_REPORT": str(counted),
        "PYTHONPATH": os.pathsep.join(
            [str(REPO), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "idempotent_peer",
        f"--idempotent-mode={mode}", f"--idempotent-wrap={suite.wrap}",
        "-o", "addopts=", "--timeout=20", f"--junitxml={report}", "-W", "ignore",
        *suite.tests, *extra,
    ]  # fmt: skip
    print(f"\n== {suite.name} ({suite.dist} {installed(suite.dist)}), mode {mode}", flush=True)
    code = subprocess.run(cmd, cwd=root, env=env, preexec_fn=_cap_memory).returncode
    outcomes: dict[str, str] = dict.fromkeys(loops, "looped")
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            path = case.get("classname", "").replace(".", "/")
            name = f"{path}.py::{case.get('name')}"
            kinds = {child.tag for child in case}
            outcomes[name] = (
                "failed"
                if kinds & {"failure", "error"}
                else "skipped"
                if "skipped" in kinds
                else "passed"
            )
    plugin = json.loads(counted.read_text()) if counted.exists() else {}
    return Outcome(outcomes, code, plugin.get("declared", []), plugin.get("wrapped", 0))


def _suites(text: str) -> list[Suite]:
    """``--suite``: ``all``, or suite names joined by commas (``prebuilt,core``)."""
    if text == "all":
        return list(SUITES.values())
    names = text.split(",")
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown suite {', '.join(map(repr, unknown))}: choose all or from {', '.join(SUITES)}"
        )
    return [SUITES[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        type=_suites,
        default=list(SUITES.values()),
        help=f"all (the default), one of {', '.join(SUITES)}, or several joined by commas",
    )
    parser.add_argument("--mode", choices=["off", "fresh", "thread", "all"], default="all")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "peer")
    parser.add_argument(
        "--wrap",
        help="what the plugin wraps instead of the suite's default (--idempotent-wrap), e.g. "
        "middleware: an IdempotencyMiddleware first in every create_agent (agents suite)",
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)
    suites: list[Suite] = args.suite
    modes = ["fresh", "thread"] if args.mode == "all" else [args.mode]
    lines, bad = [], False
    for suite in suites:
        root = fetch(suite, args.cache.resolve())
        for mode in modes:
            chosen = suite if args.wrap is None else dataclasses.replace(suite, wrap=args.wrap)
            result = run(chosen, mode, root, args.pytest_args)
            outcomes, code = result.tests, result.code
            failed = {t for t, o in outcomes.items() if o in ("failed", "looped")}
            expected = set(BY_DESIGN[(suite.name, mode)])
            known = set(KNOWN_DEFECTS.get((suite.name, mode), {}))
            unwrapped = set(UNWRAPPED_FAILURES.get(suite.name, {}))
            known |= unwrapped
            passed = sum(o == "passed" for o in outcomes.values())
            needed = sum(int(str(d["times"])) for d in result.declared)
            wrapper_failures = failed - expected - known
            lines.append(
                f"{suite.name:10} {mode:6}  {passed}/{len(outcomes)} passed"
                f"  ({len(failed & expected)} fail by design)"
                f"  tools wrapped {result.wrapped}, declarations needed {needed},"
                f" wrapper failures {len(wrapper_failures)}"
            )
            for d in result.declared:
                lines.append(f"  DECLARATION NEEDED {d['tool']} ({d['option']}) x{d['times']}")
            bad |= needed > 0
            for t in sorted(t for t, o in outcomes.items() if o == "looped"):
                lines.append(f"  not run (loops by design) {t}")
            for t in sorted(failed & known):
                kind = "fails unwrapped too" if t in unwrapped else "known defect"
                lines.append(f"  {kind} {t}")
            for t in sorted(failed - expected - known):
                lines.append(f"  UNEXPECTED FAILURE {t}")
            if not args.pytest_args:
                for t in sorted(expected - failed):
                    lines.append(f"  BY-DESIGN LIST STALE (now {outcomes.get(t, 'missing')}) {t}")
                bad |= bool(expected - failed)
            bad |= bool(failed - expected - known) or (code not in (0, 1)) or not outcomes
    print("\n" + "\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
