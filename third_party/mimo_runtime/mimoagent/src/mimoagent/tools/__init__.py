"""The tool bridge of general_agent tasks (MCP over stdio)."""
