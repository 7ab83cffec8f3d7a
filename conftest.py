"""Plugins of the repository's own runs beyond ``addopts``, which names the plugins instead
of autoloading them (``pyproject.toml`` says why): nbmake, for ``pytest --nbmake
notebooks``, where it is installed (the ``notebooks`` extra; the drift and mcp 2 venvs of
``.ci/`` have none)."""

import importlib.util

pytest_plugins = ["nbmake.pytest_plugin"] if importlib.util.find_spec("nbmake") else []
