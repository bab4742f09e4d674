"""Pure state machines, policies and value types: no I/O, no asyncio, no clock reads."""
