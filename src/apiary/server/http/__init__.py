"""The HTTP transport: health, readiness, metrics and the JSON gateway."""
