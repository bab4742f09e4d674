"""The gRPC transport: every served method, grpc.health.v1 and server reflection."""
