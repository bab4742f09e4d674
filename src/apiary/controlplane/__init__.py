"""Transport-agnostic command handlers of the runtime control plane
(spec/runtime-control-plane.txt; docs/control-plane.md): one `RuntimeControl` per tenant
over its engine and store, and the command table (`commands.COMMANDS`) that the HTTP JSON
routes and the JSON-RPC endpoint (server/http/runtime.py) both call."""
