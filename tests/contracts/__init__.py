"""Contract suites: one abstract test class per store interface and per backend interface (eventsourcing's pattern).

Each ``*Contract`` class (:class:`~contracts.test_backend.BackendContract`,
:class:`~contracts.test_room_store.RoomStoreContract`, :class:`~contracts.test_replica_store.ReplicaStoreContract`,
:class:`~contracts.test_peer_store.PeerStoreContract`, :class:`~contracts.test_ledger_store.LedgerStoreContract`)
states, method by method, what the interface promises: what each method returns, what it writes and which lock it
takes, in short tests on a migrated, empty store (the ``engine`` fixture of ``tests/conftest.py``). The contract
classes are not collected (their names do not start with ``Test``); each is subclassed once per backend
(``TestRoomStoreSQLite``, ``TestRoomStorePostgreSQL``), which only names the backend (:class:`.support.OnBackend`).

**A new backend is done when it passes these**: add its ``Test...<Backend>`` subclass to each module. The service
tests beside them (``tests/services/test_rooms_contract.py`` and the like) prove the same behaviour end to end.
"""
