"""Transport-agnostic command handlers of the runtime control plane."""
