"""Pure parts of the delivery ledger: the retry schedule and claim validation (no database)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from factories import envelope

from hostedrooms.ledger import delivery_claim, outbound_claim, retry_delay


def test_retry_delay_doubles_then_caps_at_256_seconds() -> None:
    assert [retry_delay(attempts) for attempts in range(1, 11)] == [2, 4, 8, 16, 32, 64, 128, 256, 256, 256]
    assert retry_delay(10_000) == 256  # the exponent is capped before the power is taken


def _claim(envelope: dict[str, Any], **overrides: Any) -> tuple[dict[str, Any], str]:
    arguments: dict[str, Any] = {"transport_role": "host", "connection_id": "conn-1", "lease_token": "lease-1",
                                 "target_chat_id": "chat-1", **overrides}
    return delivery_claim(envelope, **arguments)


def test_claim_digest_ignores_lease_token_and_key_order_but_not_routing() -> None:
    claim, digest = _claim(envelope())
    assert claim["lease_token"] == "lease-1" and len(digest) == 64
    assert _claim(envelope(), lease_token="lease-2")[1] == digest
    reordered = dict(reversed(list(envelope().items())))
    assert _claim(reordered)[1] == digest
    assert _claim(envelope(), connection_id="conn-2")[1] != digest
    assert _claim(envelope(), target_chat_id="chat-2")[1] != digest
    assert _claim(envelope(body={"message": "other"}))[1] != digest


def test_claim_coerces_like_the_reference() -> None:
    claim, _ = _claim(envelope(used_legs="3", parent_leg=2.0, target_peer_id=7), connection_id=5)
    coerced = (claim["used_legs"], claim["parent_leg"], claim["target_peer_id"], claim["connection_id"])
    assert coerced == (3, 2, "7", "5")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"action": "other"}, "action is invalid"),
        ({"kind": None}, "kind is invalid"),
        ({"body": {"message": "x", "extra": 1}}, "body is invalid"),
        ({"body": {"message": "x" * 100_001}}, "body is invalid"),
        ({"exchange_id": ""}, "identity is incomplete"),
        ({"used_legs": 0}, "leg budget is invalid"),
        ({"max_legs": 7}, "leg budget is invalid"),
        ({"parent_leg": "two"}, "leg budget is invalid"),
        ({"expires_at": 2**63}, "expiry is invalid"),
    ],
)
def test_claim_refusals(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _claim(envelope(**overrides))


def test_claim_refuses_bad_role_and_non_mapping_envelope() -> None:
    with pytest.raises(ValueError, match="role is invalid"):
        _claim(envelope(), transport_role="peer")
    with pytest.raises(ValueError, match="envelope is invalid"):
        _claim(["not", "a", "mapping"])  # type: ignore[arg-type]


def test_outbound_claim_digest_and_refusals() -> None:
    snapshot = {"connection_id": "c1", "source_route_id": "sr", "source_route_revision": "v1",
                "source_chat_id": "chat-1", "action": "instruction"}
    arguments: dict[str, Any] = {"request_id": "out-1", "source_session_id": "chat-1", "source_run_id": "run-1",
                                 "snapshot": snapshot, "body": "hello", "action": "instruction", "expires_at": 9}
    values, digest, text = outbound_claim(**arguments)
    assert values["connection_id"] == "c1" and text.startswith('{"action":"instruction"')
    assert digest == hashlib.sha256(
        b'{"action":"instruction","body":"hello","expires_at":9,"request_id":"out-1","snapshot":'
        + text.encode() + b',"source_run_id":"run-1","source_session_id":"chat-1"}').hexdigest()
    for bad in ({"snapshot": ["c1"]}, {"snapshot": {**snapshot, "x": object()}}, {"request_id": 5},
                {"snapshot": {**snapshot, "source_chat_id": "other"}}, {"body": " "}, {"expires_at": "soon"}):
        with pytest.raises(ValueError, match="secure peer outbound intent is invalid"):
            outbound_claim(**{**arguments, **bad})
