"""One handler per service: thin adapters from request messages to the engine."""
