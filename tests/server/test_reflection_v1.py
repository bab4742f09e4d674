"""Server reflection v1 (grpc.reflection.v1) beside v1alpha, over a real socket, asked by a
client built from grpc-proto's own v1 reflection.proto (compiled here by protoc into a pool
of the test's own, so nothing of the server's making is reused on the client side)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as alpha_grpc

from apiary.server.coordinator import Coordinator

V1_PROTO = """syntax = "proto3";
package grpc.reflection.v1;
option go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1";
option java_multiple_files = true;
option java_package = "io.grpc.reflection.v1";
option java_outer_classname = "ServerReflectionProto";

service ServerReflection {
  rpc ServerReflectionInfo(stream ServerReflectionRequest)
      returns (stream ServerReflectionResponse);
}
message ServerReflectionRequest {
  string host = 1;
  oneof message_request {
    string file_by_filename = 3;
    string file_containing_symbol = 4;
    ExtensionRequest file_containing_extension = 5;
    string all_extension_numbers_of_type = 6;
    string list_services = 7;
  }
}
message ExtensionRequest {
  string containing_type = 1;
  int32 extension_number = 2;
}
message ServerReflectionResponse {
  string valid_host = 1;
  ServerReflectionRequest original_request = 2;
  oneof message_response {
    FileDescriptorResponse file_descriptor_response = 4;
    ExtensionNumberResponse all_extension_numbers_response = 5;
    ListServiceResponse list_services_response = 6;
    ErrorResponse error_response = 7;
  }
}
message FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }
message ExtensionNumberResponse {
  string base_type_name = 1;
  repeated int32 extension_number = 2;
}
message ListServiceResponse { repeated ServiceResponse service = 1; }
message ServiceResponse { string name = 1; }
message ErrorResponse {
  int32 error_code = 1;
  string error_message = 2;
}
"""
V1_METHOD = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


@dataclass(frozen=True)
class V1:
    file: descriptor_pb2.FileDescriptorProto
    request: Any
    response: Any


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> V1:
    """The v1 messages as protoc compiles grpc-proto's file, in a pool of their own."""
    where = tmp_path_factory.mktemp("reflection")
    source = where / "grpc" / "reflection" / "v1" / "reflection.proto"
    source.parent.mkdir(parents=True)
    source.write_text(V1_PROTO)
    out = where / "set.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{where}",
         f"--descriptor_set_out={out}", "grpc/reflection/v1/reflection.proto"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(files.file[0])

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    return V1(
        files.file[0],
        cls("grpc.reflection.v1.ServerReflectionRequest"),
        cls("grpc.reflection.v1.ServerReflectionResponse"),
    )


@pytest.fixture
async def channel(coordinator: Coordinator) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as ch:
        yield ch


async def _ask(channel: grpc.aio.Channel, v1: V1, *requests: Any) -> list[Any]:
    call = channel.stream_stream(
        V1_METHOD,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=v1.response.FromString,
    )
    return [reply async for reply in call(iter(requests))]


async def test_v1_lists_every_service_and_both_reflection_versions(
    channel: grpc.aio.Channel, v1: V1
) -> None:
    (reply,) = await _ask(channel, v1, v1.request(list_services=""))
    assert reply.WhichOneof("message_response") == "list_services_response"
    names = {s.name for s in reply.list_services_response.service}
    assert {
        "sw4rm.router.RouterService", "sw4rm.registry.RegistryService",
        "apiary.v1.EventLogService", "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection",
    } <= names  # fmt: skip
    assert reply.original_request.list_services == ""


async def test_v1_describes_a_canonical_service(channel: grpc.aio.Channel, v1: V1) -> None:
    (reply,) = await _ask(
        channel, v1, v1.request(file_containing_symbol="sw4rm.router.RouterService")
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in reply.file_descriptor_response.file_descriptor_proto
    ]
    router = next(f for f in files if f.package == "sw4rm.router")
    methods = {m.name for s in router.service for m in s.method}
    assert "SendMessage" in methods


async def test_v1_describes_itself_as_grpc_proto_defines_it(
    channel: grpc.aio.Channel, v1: V1
) -> None:
    """A client that asks what grpc.reflection.v1 is gets grpc-proto's messages: the same
    names, numbers, types and oneofs."""
    (reply,) = await _ask(
        channel, v1, v1.request(file_containing_symbol="grpc.reflection.v1.ServerReflection")
    )
    (raw,) = reply.file_descriptor_response.file_descriptor_proto
    served = descriptor_pb2.FileDescriptorProto.FromString(raw)
    assert (served.name, served.package) == ("grpc/reflection/v1/reflection.proto",
                                             "grpc.reflection.v1")  # fmt: skip

    def shape(file: descriptor_pb2.FileDescriptorProto) -> Any:
        return (
            {m.name: {(f.name, f.number, f.type, f.label, f.type_name,
                       f.oneof_index if f.HasField("oneof_index") else None)
                      for f in m.field} for m in file.message_type},
            [(m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
             for s in file.service for m in s.method],
        )  # fmt: skip

    assert shape(served) == shape(v1.file)


async def test_v1_answers_several_requests_on_one_stream_and_names_a_missing_symbol(
    channel: grpc.aio.Channel, v1: V1
) -> None:
    first, second = await _ask(
        channel, v1,
        v1.request(file_containing_symbol="no.such.Service"),
        v1.request(file_by_filename="router.proto"),
    )  # fmt: skip
    assert first.WhichOneof("message_response") == "error_response"
    assert first.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert second.WhichOneof("message_response") == "file_descriptor_response"


async def test_v1alpha_still_answers(channel: grpc.aio.Channel) -> None:
    stub = alpha_grpc.ServerReflectionStub(channel)
    request = alpha_pb2.ServerReflectionRequest(list_services="")
    names: set[str] = set()
    async for reply in stub.ServerReflectionInfo(iter([request])):
        names = {s.name for s in reply.list_services_response.service}
    assert {"grpc.reflection.v1.ServerReflection", "sw4rm.router.RouterService"} <= names


def test_the_v1_proto_text_is_grpc_protos(v1: V1) -> None:
    """The client side really is the v1 package (not v1alpha renamed by the server)."""
    assert v1.file.package == "grpc.reflection.v1"
    assert Path(v1.file.name).parts[:3] == ("grpc", "reflection", "v1")
