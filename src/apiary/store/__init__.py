"""Storage behind narrow per-aggregate protocols: memory, SQLite (default), PostgreSQL."""
