"""gRPC server reflection under both names clients ask for: grpc.reflection.v1 (what current
grpcurl, Postman and grpc-java ask first) and grpc.reflection.v1alpha (older clients).

grpcio-reflection ships the v1alpha service only. The v1 protocol is v1alpha's, field for
field, under another package (grpc-proto's reflection/v1/reflection.proto): the same bytes
on the wire. So one servicer answers both: the v1 service's descriptor is v1alpha's renamed
(added to the default descriptor pool, so that reflection describes itself under either
name), and the v1 method hands its frames to the v1alpha servicer as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Protocol

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA_SERVICE: Final = reflection.SERVICE_NAME
V1_PACKAGE: Final = "grpc.reflection.v1"
V1_SERVICE: Final = f"{V1_PACKAGE}.ServerReflection"
V1_FILE: Final = "grpc/reflection/v1/reflection.proto"
_METHOD: Final = "ServerReflectionInfo"


class HandlerSink(Protocol):
    """Where handlers are added: a server, or what collects them to serve behind the guard."""

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None: ...


def v1_file_descriptor() -> FileDescriptor:
    """grpc/reflection/v1/reflection.proto in the default pool (added on first use)."""
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(V1_FILE)
    except KeyError:
        pass
    alpha = reflection_pb2.DESCRIPTOR
    proto = descriptor_pb2.FileDescriptorProto.FromString(alpha.serialized_pb)
    old, new = f".{alpha.package}.", f".{V1_PACKAGE}."
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    options = proto.options
    options.ClearField("deprecated")
    options.java_package = "io.grpc.reflection.v1"
    options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    pool.AddSerializedFile(proto.SerializeToString())
    return pool.FindFileByName(V1_FILE)


def enable_reflection(server: HandlerSink, service_names: Iterable[str]) -> None:
    """Serve reflection of `service_names` (and of both reflection services) on `server`."""
    v1_file_descriptor()
    names = [*service_names, V1_SERVICE, V1ALPHA_SERVICE]
    servicer = reflection.aio.ReflectionServicer(names)
    server.add_generic_rpc_handlers(
        [_handlers(V1ALPHA_SERVICE, servicer), _handlers(V1_SERVICE, servicer)]
    )


def _handlers(service: str, servicer: reflection.aio.ReflectionServicer) -> grpc.GenericRpcHandler:
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(service, {_METHOD: method})
