"""Workflows (RFC 17.7): the definition and its DAG, node and run machines, data flow and events."""
