"""The negotiation round (RFC 17.1-17.3): its machine and the steps a round builds (rounds),
its vocabulary, policy, scoring, validation, outcomes, deltas, events and records."""
