"""The SDK's gRPC target for a coordinator address: one address as given; several replicas
(`host:port,host:port`) as an ipv4:/ipv6: target gRPC connects to in order; host names in a
list refused, naming the setting and the way out (one DNS name for every replica)."""

from __future__ import annotations

import pytest

from apiary.sdk.channel import channel_target


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("127.0.0.1:50051", "127.0.0.1:50051"),
        ("apiary.internal:50051", "apiary.internal:50051"),
        ("dns:///apiary.internal:50051", "dns:///apiary.internal:50051"),
        ("ipv4:10.0.0.1:1,10.0.0.2:1", "ipv4:10.0.0.1:1,10.0.0.2:1"),
        ("10.0.0.1:50051,10.0.0.2:50051", "ipv4:10.0.0.1:50051,10.0.0.2:50051"),
        ("10.0.0.1:1, 10.0.0.2:2,", "ipv4:10.0.0.1:1,10.0.0.2:2"),
        ("[::1]:50051,[::1]:50052", "ipv6:[::1]:50051,[::1]:50052"),
    ],
)
def test_a_target_for_one_or_several_replicas(given: str, target: str) -> None:
    assert channel_target(given) == target


@pytest.mark.parametrize(
    "given",
    [
        "a.internal:50051,b.internal:50051",
        "10.0.0.1:50051,b.internal:50051",
        "10.0.0.1,10.0.0.2",
        "10.0.0.256:1,10.0.0.2:1",
        "10.0.0.1:1,[::1]:2",
    ],
)
def test_several_addresses_must_be_ip_literals_with_ports(given: str) -> None:
    with pytest.raises(ValueError, match="coordinator: several addresses") as refused:
        channel_target(given)
    assert "one DNS name" in str(refused.value)
