"""The record protocol and the engine: what a record is and what each store operation
decides (``record``, ``protocol``, ``store``), results as bytes (``serde``), keys'
canonical JSON, and the engine that claims, runs and completes once per key
(``engine`` and ``_flow``), with the policy, context, events and heartbeat it
stands on.

Nothing here imports LangChain or LangGraph, beyond LangGraph's msgpack serde
(``_compat``); ``lint-imports`` checks it (``pyproject.toml``).
"""
