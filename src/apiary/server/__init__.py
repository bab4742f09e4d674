"""Transport adapters: gRPC, the HTTP JSON gateway, and the coordinator that assembles them."""
