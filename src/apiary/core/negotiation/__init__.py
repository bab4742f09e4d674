"""The negotiation round (RFC 17.1-17.3): its machine, vocabulary, policy, scoring and records."""
