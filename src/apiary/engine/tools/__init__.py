"""Tools: the tool service, its catalog and call table, and the providers (agents, commands,
MCP servers)."""
