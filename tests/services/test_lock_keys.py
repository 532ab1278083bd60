"""The advisory lock key registry (hostedrooms/advisory_keys.py): every key hostedrooms takes is there, retired ones
included; no two collide, in one namespace or across namespaces once the backend scopes them; every user takes its
key from the registry."""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path

import pytest

import hostedrooms
from hostedrooms import advisory_keys as locks
from hostedrooms import backends, ledger, replicas, rooms
from hostedrooms.advisory_keys import LOCK_KEYS
from hostedrooms.backends import namespace_of, scoped_key
from hostedrooms.store import peers as peer_store

_INT64 = (-(2**63), 2**63 - 1)
#: Namespaces as the backend derives them: the legacy schema (the keys as written), schemas of one database, the
#: same schema name in another database.
_NAMESPACES = (None, namespace_of("hostedrooms", "gw_a"), namespace_of("hostedrooms", "gw_b"),
               namespace_of("other", "gw_a"), namespace_of("hostedrooms", "public_"))


def test_every_key_is_a_distinct_signed_64_bit_value_with_a_reason() -> None:
    values = [key.value for key in LOCK_KEYS.values()]
    assert len(set(values)) == len(values), "two lock keys collide"
    for name, key in LOCK_KEYS.items():
        assert key.name == name and key.reason
        assert _INT64[0] <= key.value <= _INT64[1], name


def test_the_retired_budget_key_is_kept_and_no_live_key_reuses_it() -> None:
    retired = [key for key in LOCK_KEYS.values() if key.retired]
    assert [key.value for key in retired] == [0x686F737465640002]
    live = {key.value for key in LOCK_KEYS.values() if not key.retired}
    assert live.isdisjoint(key.value for key in retired)


def test_the_module_constants_are_the_registry_entries() -> None:
    constants = {name: value for name, value in vars(locks).items() if name.endswith("_LOCK_KEY")}
    assert len(constants) == len(LOCK_KEYS) - 1  # every live key has its constant (a retired key none)
    assert set(constants.values()) == {key.value for key in LOCK_KEYS.values() if not key.retired}


@pytest.mark.parametrize("pair", list(combinations(_NAMESPACES, 2)), ids=str)
def test_scoped_keys_stay_distinct_across_keys_and_namespaces(pair: tuple[str | None, str | None]) -> None:
    """Scoped per namespace (as the backend takes them), no key of one namespace meets any key of another, nor
    another key of its own."""
    scoped = [scoped_key(namespace, key.value) for namespace in pair for key in LOCK_KEYS.values()]
    assert len(set(scoped)) == len(scoped)
    assert all(_INT64[0] <= value <= _INT64[1] for value in scoped)


def test_every_user_takes_its_key_from_the_registry() -> None:
    assert backends.MIGRATION_LOCK_KEY == LOCK_KEYS["migration"].value
    assert rooms.ROOM_CREATION_LOCK_KEY == LOCK_KEYS["room_creation"].value
    assert replicas.REPLICA_CREATION_LOCK_KEY == LOCK_KEYS["replica_creation"].value
    assert ledger.PREPARE_LOCK_KEY == LOCK_KEYS["ledger_prepare"].value
    assert peer_store.PEER_LINKS_LOCK_KEY == LOCK_KEYS["peer_links"].value
    assert peer_store.PEER_RESERVATIONS_LOCK_KEY == LOCK_KEYS["peer_reservations"].value


def test_no_module_but_the_registry_writes_a_key_out() -> None:
    """A key written as a literal ("hosted"/"ledger" + n) or hashed from a table name outside the registry would be
    a key nobody checks for collisions."""
    package = Path(hostedrooms.__file__).parent
    literal = re.compile(r"0x(686F7374656400|6C6564676572)[0-9A-F]{2}", re.IGNORECASE)
    offenders = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
                 if path != package / "advisory_keys.py"
                 and (literal.search(text := path.read_text(encoding="utf-8")) or 'b"hostedrooms:hosted_' in text)]
    assert offenders == []
