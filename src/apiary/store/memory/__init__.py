"""The in-memory backend (tests and throwaway runs): the stores, nothing durable."""
