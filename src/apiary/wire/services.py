"""The catalogue of every gRPC service Apiary serves, read from the proto descriptors.

Servers register every method listed here (so a client generated from the canonical protos
finds each one), and the JSON gateway routes by the same names.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import symbol_database
from google.protobuf.descriptor import FileDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from apiary.wire import pb

# Canonical (RFC Appendix A + INTEROP.md) files first, Apiary's extension package last.
_FILES: tuple[FileDescriptor, ...] = (
    pb.registry_pb2.DESCRIPTOR,
    pb.router_pb2.DESCRIPTOR,
    pb.scheduler_pb2.DESCRIPTOR,
    pb.scheduler_policy_pb2.DESCRIPTOR,
    pb.hitl_pb2.DESCRIPTOR,
    pb.worktree_pb2.DESCRIPTOR,
    pb.tool_pb2.DESCRIPTOR,
    pb.connector_pb2.DESCRIPTOR,
    pb.negotiation_pb2.DESCRIPTOR,
    pb.negotiation_room_pb2.DESCRIPTOR,
    pb.handoff_pb2.DESCRIPTOR,
    pb.workflow_pb2.DESCRIPTOR,
    pb.reasoning_pb2.DESCRIPTOR,
    pb.reasoning_proxy_pb2.DESCRIPTOR,
    pb.activity_pb2.DESCRIPTOR,
    pb.logging_pb2.DESCRIPTOR,
    pb.apiary_pb2.DESCRIPTOR,
)


@dataclass(frozen=True, slots=True)
class RpcMethod:
    """One RPC: its names, message classes and streaming shape."""

    service: str
    """Full service name, e.g. 'sw4rm.router.RouterService'."""
    name: str
    request_type: type[Message]
    response_type: type[Message]
    server_streaming: bool
    client_streaming: bool

    @property
    def path(self) -> str:
        """The gRPC method path, '/package.Service/Method'."""
        return f"/{self.service}/{self.name}"


def _message_class(descriptor_full_name: str) -> type[Message]:
    db = symbol_database.Default()
    return type(db.GetSymbol(descriptor_full_name)())


def _method(service: ServiceDescriptor, method: MethodDescriptor) -> RpcMethod:
    return RpcMethod(
        service=service.full_name,
        name=method.name,
        request_type=_message_class(method.input_type.full_name),
        response_type=_message_class(method.output_type.full_name),
        server_streaming=method.server_streaming,
        client_streaming=method.client_streaming,
    )


def _catalogue() -> dict[str, tuple[RpcMethod, ...]]:
    services: dict[str, tuple[RpcMethod, ...]] = {}
    for file in _FILES:
        for service in file.services_by_name.values():
            services[service.full_name] = tuple(_method(service, m) for m in service.methods)
    return services


SERVICES: dict[str, tuple[RpcMethod, ...]] = _catalogue()
"""Every served service by full name, each with its methods in declaration order."""

CANONICAL_SERVICES: tuple[str, ...] = tuple(n for n in SERVICES if n.startswith("sw4rm."))
"""The SW4RM services (canonical protos and INTEROP.md)."""


def find_method(service: str, method: str) -> RpcMethod | None:
    """The RPC `service`/`method`, or None when Apiary serves no such method."""
    for rpc in SERVICES.get(service, ()):
        if rpc.name == method:
            return rpc
    return None
