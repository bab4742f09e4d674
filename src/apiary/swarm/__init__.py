"""The Agent Swarm Protocol: federation between deployments."""
