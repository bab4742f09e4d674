"""Tools (RFC 15): descriptors, schemas, call and retry rules, argv and execution policy."""
