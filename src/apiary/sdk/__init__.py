"""What agent authors import: the Agent runtime and typed clients (no coordinator code)."""
