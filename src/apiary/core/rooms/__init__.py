"""Negotiation rooms: the room machine, its policy, records and input validation."""
