"""Negotiations and negotiation rooms: the engine side of rounds, fan-out, debate inference and
room notices."""
