"""The imperative shell: executes effects (store writes, deliveries, timers, events)."""
