"""Across the wire and into other tools: MCP on both sides (``mcp``), a run on
another Agent Server once per key (``remote``), OpenTelemetry spans (``otel``).
Each stands on the engine, never on the LangChain adapters.
"""
