"""The runtime control plane's contract as pure types and rules (spec/runtime-control-plane.txt,
spec/agentruntime/): its events and snapshots, the turn lifecycle, the records a session keeps,
the channel's resume rules. The SDK reads the same types the coordinator writes."""
