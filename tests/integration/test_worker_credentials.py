"""SecretResolver against the moto server's Secrets Manager and SSM (no worker process)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import boto3
import pytest

from wsfleet.upstream_options import Credential, CredentialPlacement
from wsfleet_worker.credentials import CredentialUnavailable, SecretResolver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def client(aws: Any, service: str) -> Any:
    return boto3.session.Session(region_name=aws.region).client(
        service, endpoint_url=aws.endpoint_url
    )


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def header(ref: str, **kw: Any) -> Credential:
    return Credential(ref, CredentialPlacement.HEADER, "Authorization", **kw)


def test_concurrent_connects_share_one_read_and_the_cache_holds_for_its_ttl(aws):
    arn = client(aws, "secretsmanager").create_secret(
        Name=f"wsfleet/c-{uuid.uuid4().hex[:6]}", SecretString=json.dumps({"k": "v1"})
    )["ARN"]
    resolver = SecretResolver(in_thread, ttl_seconds=3600)

    async def scenario() -> list[str]:
        return list(await asyncio.gather(*(resolver.resolve(header(arn, json_key="k"))
                                           for _ in range(20))))

    assert asyncio.run(scenario()) == ["v1"] * 20
    assert resolver.reads == 1
    client(aws, "secretsmanager").put_secret_value(SecretId=arn, SecretString='{"k": "v2"}')
    assert asyncio.run(resolver.resolve(header(arn, json_key="k"))) == "v1"  # cached


def test_ttl_zero_reads_at_every_connect_so_a_rotation_shows_at_once(aws):
    arn = client(aws, "secretsmanager").create_secret(
        Name=f"wsfleet/r-{uuid.uuid4().hex[:6]}", SecretString="first"
    )["ARN"]
    resolver = SecretResolver(in_thread, ttl_seconds=0)
    assert asyncio.run(resolver.resolve(header(arn))) == "first"
    client(aws, "secretsmanager").put_secret_value(SecretId=arn, SecretString="second")
    assert asyncio.run(resolver.resolve(header(arn))) == "second"


def test_ssm_securestring_is_decrypted(aws):
    name = f"/wsfleet/p-{uuid.uuid4().hex[:6]}"
    client(aws, "ssm").put_parameter(Name=name, Value="ssm-value", Type="SecureString")
    ref = f"arn:aws:ssm:{aws.region}:123456789012:parameter{name}"
    resolver = SecretResolver(in_thread, ttl_seconds=60)
    cred = Credential(ref, CredentialPlacement.QUERY, "token")
    assert asyncio.run(resolver.resolve(cred)) == "ssm-value"


def test_a_missing_secret_names_the_reference_and_the_error_code_only(aws):
    ref = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/absent"
    resolver = SecretResolver(in_thread, ttl_seconds=60)
    with pytest.raises(CredentialUnavailable) as refused:
        asyncio.run(resolver.resolve(header(ref)))
    assert str(refused.value) == f"credential {ref} unavailable: ResourceNotFoundException"


def test_a_refused_handshake_reads_the_secret_again_once_per_interval(aws):
    # GIVEN a resolver that caches for an hour, its clock under the test's control
    arn = client(aws, "secretsmanager").create_secret(
        Name=f"wsfleet/f-{uuid.uuid4().hex[:6]}", SecretString="old"
    )["ARN"]
    now = [100.0]
    resolver = SecretResolver(
        in_thread, ttl_seconds=3600, refresh_interval_seconds=30, clock=lambda: now[0]
    )
    assert asyncio.run(resolver.resolve(header(arn))) == "old"
    # WHEN the secret is rotated and a handshake with the old value is refused
    client(aws, "secretsmanager").put_secret_value(SecretId=arn, SecretString="new")
    assert asyncio.run(resolver.refresh(header(arn)))
    # THEN the next connect presents the new value, though the cache is far from aging out
    assert asyncio.run(resolver.resolve(header(arn))) == "new"
    assert (resolver.reads, resolver.refreshes) == (3, 1)  # resolve, forced read, cache hit
    # AND a wrong secret cannot make every refused handshake a read: refused again within
    # the interval, nothing is read; after it, once more
    assert not asyncio.run(resolver.refresh(header(arn)))
    now[0] += 29.9
    assert not asyncio.run(resolver.refresh(header(arn)))
    assert resolver.refreshes == 1
    now[0] += 0.1
    assert asyncio.run(resolver.refresh(header(arn)))
    assert resolver.refreshes == 2


def test_concurrent_refusals_share_one_read(aws):
    arn = client(aws, "secretsmanager").create_secret(
        Name=f"wsfleet/s-{uuid.uuid4().hex[:6]}", SecretString="v"
    )["ARN"]
    resolver = SecretResolver(in_thread, ttl_seconds=3600)

    async def scenario() -> list[bool]:
        return list(await asyncio.gather(*(resolver.refresh(header(arn)) for _ in range(10))))

    assert sorted(asyncio.run(scenario())) == [False] * 9 + [True]
    assert resolver.reads == 1
