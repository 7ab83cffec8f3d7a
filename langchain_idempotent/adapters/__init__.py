"""LangChain and LangGraph in front of the engine: the wrapped tool (``tool``), the
``create_agent`` middleware (``middleware``), one call's derivation (``_call``,
``keys``), approval (``approval``, ``_asking``), batched sibling claims
(``_siblings``), identical calls in one message (``_identical``), handoffs and
re-stamped replays (``_handoff``, ``_replay``), and every private LangChain /
LangGraph touch (``_compat``).
"""
