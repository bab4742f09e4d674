"""The in-memory backend (tests and throwaway runs): one module per aggregate's store, each
running the SQL stores' row encoders so that it refuses what they refuse; `store` assembles
them. Nothing is durable."""
