"""A host application with its own tables and its own Alembic history, in hostedrooms' database.

End to end with the real ``alembic`` command (a subprocess, as a deploy runs it) on SQLite and PostgreSQL:
the host's ``env.py`` is docs/host-alembic.md's, as written. Both deploy shapes: two commands (the host's
``alembic upgrade head``, then ``hostedrooms upgrade``) and one command (the host's env.py upgrades hostedrooms
too). In-process tests cover the filters, transactions and several upgraders at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from factories import RACER_START, race
from test_readme import readme_block

from hostedrooms import migrate, rooms, verify
from hostedrooms.db import create_engine
from hostedrooms.models import metadata as hostedrooms_metadata

BIN = Path(sys.executable).parent
HOOK_LINE = ("        hostedrooms_migrate.upgrade_with_host(context, connection)"
             "  # hostedrooms first: the one-command shape\n")

HOST_MODELS = '''
import sqlalchemy as sa

metadata = sa.MetaData()
orders = sa.Table(
    "host_orders", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("note", sa.Text, nullable=False),
    sa.Index("ix_host_orders_note", "note"),
)
'''

HOST_REVISION = '''"""host orders"""
import sqlalchemy as sa
from alembic import op

revision = "host_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("host_orders", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("note", sa.Text, nullable=False))
    op.create_index("ix_host_orders_note", "host_orders", ["note"])


def downgrade():
    op.drop_index("ix_host_orders_note", table_name="host_orders")
    op.drop_table("host_orders")
'''

SCRIPT_MAKO = '''"""${message}"""
import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade():
    ${upgrades if upgrades else "pass"}


def downgrade():
    ${downgrades if downgrades else "pass"}
'''

# The host's own configuration: it logs Alembic's progress (the tests read it) and nothing else.
HOST_INI = """[alembic]
script_location = %(here)s/migrations
prepend_sys_path = .
path_separator = os
sqlalchemy.url = {url}

[loggers]
keys = root,alembic

[handlers]
keys = console

[formatters]
keys = plain

[handler_console]
class = StreamHandler
args = (sys.stderr,)
formatter = plain

[formatter_plain]
format = %(name)s: %(message)s

[logger_root]
level = WARNING
handlers = console

[logger_alembic]
level = INFO
handlers =
qualname = alembic
"""


def _sa_url(target: str) -> str:
    """The SQLAlchemy URL of a test target (a SQLite path or a PostgreSQL URL)."""
    return target if "://" in target else f"sqlite:///{target}"


def _write_host_app(directory: Path, url: str, *, one_command: bool) -> Path:
    env_py = readme_block("def run_migrations_online")
    assert HOOK_LINE in env_py, "the env.py of docs/host-alembic.md changed: update HOOK_LINE"
    if not one_command:
        env_py = env_py.replace(HOOK_LINE, "")
    (directory / "myapp").mkdir(parents=True)
    (directory / "myapp" / "__init__.py").write_text("")
    (directory / "myapp" / "models.py").write_text(HOST_MODELS)
    (directory / "migrations" / "versions").mkdir(parents=True)
    (directory / "migrations" / "env.py").write_text(env_py)
    (directory / "migrations" / "script.py.mako").write_text(SCRIPT_MAKO)
    (directory / "migrations" / "versions" / "host_0001.py").write_text(HOST_REVISION)
    (directory / "alembic.ini").write_text(HOST_INI.format(url=url.replace("%", "%%")))
    return directory


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{argv}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def _alembic(app: Path, *args: str) -> str:
    return _run([str(BIN / "alembic"), *args], cwd=app)


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()


def _host_versions(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            if not sa.inspect(connection).has_table("alembic_version"):
                return []
            return list(connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalars())
    finally:
        engine.dispose()


def _body(source: str, function: str) -> list[str]:
    """The statements of ``function`` in a generated revision, comments dropped."""
    match = re.search(rf"^def {function}\(\):\n((?:    .*\n|\n)*)", source, flags=re.M)
    assert match is not None, source
    return [line.strip() for line in match.group(1).splitlines() if line.strip() and not line.strip().startswith("#")]


HOSTEDROOMS = set(hostedrooms_metadata.tables) | {migrate.VERSION_TABLE}

pytest_plugins = ["pytester"]


@pytest.fixture
def host_url(empty_target: str) -> str:
    return _sa_url(empty_target)


def test_one_command_upgrades_both_histories_and_other_commands_leave_hostedrooms_alone(
        host_url: str, tmp_path: Path) -> None:
    app = _write_host_app(tmp_path / "app", host_url, one_command=True)

    _alembic(app, "current")  # env.py runs, but not under `upgrade`: hostedrooms is not installed
    assert not _tables(host_url) & HOSTEDROOMS

    out = _alembic(app, "upgrade", "head")
    assert "Running upgrade  -> host_0001" in out and "Running upgrade  -> 0001_baseline" in out, out
    assert f"-> {migrate.head_revision()}" in out
    assert _host_versions(host_url) == ["host_0001"]
    assert migrate.current_revision(host_url) == migrate.head_revision()
    assert {"host_orders"} | HOSTEDROOMS <= _tables(host_url)

    engine = create_engine(host_url)
    try:
        rooms.create_room(engine, room_id="r1", name="kept", members=[], authority_gateway_id="install:gw")
        before = rooms.room_state(engine, room_id="r1")

        out = _alembic(app, "check")
        assert "No new upgrade operations detected" in out, out

        out = _alembic(app, "revision", "--autogenerate", "-m", "nothing to do")
        (generated,) = (app / "migrations" / "versions").glob("*nothing_to_do*.py")
        source = generated.read_text()
        assert _body(source, "upgrade") == ["pass"] and _body(source, "downgrade") == ["pass"], source

        _alembic(app, "downgrade", "base")
        assert _host_versions(host_url) == []
        assert "host_orders" not in _tables(host_url)
        assert HOSTEDROOMS <= _tables(host_url)
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert rooms.room_state(engine, room_id="r1") == before
        assert verify(engine) == []
    finally:
        engine.dispose()


def test_two_commands_host_alembic_then_hostedrooms_upgrade(host_url: str, tmp_path: Path) -> None:
    app = _write_host_app(tmp_path / "app", host_url, one_command=False)
    commands = readme_block("hostedrooms upgrade --url \"$DATABASE_URL\"", language="sh")
    commands = "\n".join(line.strip() for line in commands.splitlines())  # the block is indented in a list item
    env = dict(os.environ, DATABASE_URL=host_url, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")

    out = _run(["bash", "-euo", "pipefail", "-c", commands], cwd=app, env=env)
    assert "Running upgrade  -> host_0001" in out and "0001_baseline" not in out, out
    assert _host_versions(host_url) == ["host_0001"]
    assert migrate.current_revision(host_url) == migrate.head_revision()

    out = _alembic(app, "check")
    assert "No new upgrade operations detected" in out, out


# --- in process: the filters -------------------------------------------------------------------------------


def _host_metadata(*, with_hostedrooms: bool) -> sa.MetaData:
    host = sa.MetaData()
    sa.Table("host_orders", host, sa.Column("id", sa.Integer, primary_key=True),
             sa.Column("note", sa.Text, nullable=False), sa.Index("ix_host_orders_note", "note"))
    if with_hostedrooms:  # a host that declares foreign keys to hostedrooms' tables holds them in its metadata
        for table in hostedrooms_metadata.tables.values():
            table.to_metadata(host)
    return host


def _diffs(engine: sa.Engine, host: sa.MetaData, **filters: object) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"target_metadata": host, **filters})
        found = compare_metadata(context, host)
    kinds = []
    for diff in found:
        first = diff[0] if isinstance(diff, list) else diff
        name = getattr(first[1], "name", "")
        kinds.append((str(first[0]), str(name)))
    return kinds


@pytest.fixture
def shared_engine(empty_target: str) -> Iterator[sa.Engine]:
    """hostedrooms at head next to a host table of the shape the host's metadata declares."""
    engine = create_engine(empty_target)
    migrate.upgrade(engine)
    _host_metadata(with_hostedrooms=False).create_all(engine)
    yield engine
    engine.dispose()


def test_without_the_filters_the_host_sees_every_hostedrooms_table_as_removed(shared_engine: sa.Engine) -> None:
    removed = {name for kind, name in _diffs(shared_engine, _host_metadata(with_hostedrooms=False))
               if kind == "remove_table"}
    assert removed == HOSTEDROOMS


def test_include_name_alone_hides_hostedrooms_from_a_host_comparison(shared_engine: sa.Engine) -> None:
    host = _host_metadata(with_hostedrooms=False)
    assert _diffs(shared_engine, host, include_name=migrate.host_include_name) == []


def test_include_object_is_needed_when_the_host_metadata_holds_hostedrooms_tables(shared_engine: sa.Engine) -> None:
    host = _host_metadata(with_hostedrooms=True)
    only_names = _diffs(shared_engine, host, include_name=migrate.host_include_name)
    assert {name for kind, name in only_names if kind == "add_table"} == set(hostedrooms_metadata.tables)
    both = _diffs(shared_engine, host, include_name=migrate.host_include_name,
                  include_object=migrate.host_include_object)
    assert both == []


def test_filters_keep_the_host_own_differences(shared_engine: sa.Engine) -> None:
    host = _host_metadata(with_hostedrooms=False)
    sa.Table("host_new", host, sa.Column("id", sa.Integer, primary_key=True))
    with shared_engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE host_stale (id INTEGER PRIMARY KEY)")
        connection.exec_driver_sql("DROP INDEX ix_host_orders_note")
    found = set(_diffs(shared_engine, host, include_name=migrate.host_include_name,
                       include_object=migrate.host_include_object))
    assert found == {("add_table", "host_new"), ("remove_table", "host_stale"), ("add_index", "ix_host_orders_note")}


# --- in process: transactions on a host's own connection --------------------------------------------------


def test_upgrade_inside_the_host_transaction_rolls_back_with_it(empty_target: str, backend: str) -> None:
    """A host engine without hostedrooms' hooks (pysqlite runs DDL outside transactions by default)."""
    plain = sa.create_engine(_sa_url(empty_target))
    try:
        with plain.connect() as connection:
            transaction = connection.begin()
            connection.exec_driver_sql("CREATE TABLE host_side (id INTEGER PRIMARY KEY)")
            migrate.upgrade(connection)
            assert migrate.current_revision(connection) == migrate.head_revision()
            transaction.rollback()
        assert not _tables(_sa_url(empty_target)) & HOSTEDROOMS
        if backend == "postgresql":  # transactional DDL: the host's table went with it
            assert "host_side" not in _tables(_sa_url(empty_target))
    finally:
        plain.dispose()


def test_upgrade_on_a_host_connection_outside_a_transaction_commits_its_own(empty_target: str) -> None:
    plain = sa.create_engine(_sa_url(empty_target))
    try:
        with plain.connect() as connection:
            migrate.upgrade(connection)
            assert not connection.in_transaction()
            connection.exec_driver_sql("SELECT 1")  # still usable by the host
        assert migrate.current_revision(_sa_url(empty_target)) == migrate.head_revision()
    finally:
        plain.dispose()


RACER = RACER_START + """
import sqlalchemy as sa
engine = sa.create_engine(sys.argv[1], connect_args={"timeout": 120} if sys.argv[1].startswith("sqlite") else {})
with engine.connect() as connection:  # the host's own engine, as in its env.py
    migrate.upgrade(connection)
with engine.connect() as connection:  # read back on the host's engine too (its generous lock timeout)
    print("DONE", migrate.current_revision(connection))
"""


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # PostgreSQL: test_legacy_concurrency.py
def test_several_hosts_upgrading_at_once_on_their_own_engines(empty_target: str, tmp_path: Path) -> None:
    """Without hostedrooms' hooks pysqlite would run each DDL statement on its own and the upgraders would
    interleave; the migration's BEGIN IMMEDIATE makes one migrate while the others wait and then find head."""
    outputs = []
    for code, out in race(RACER, _sa_url(empty_target), tmp_path, processes=4, timeout=180):
        assert code == 0, out
        outputs.append(out)
    assert sum("Running upgrade  -> 0001_baseline" in out for out in outputs) == 1, outputs
    assert all(f"DONE {migrate.head_revision()}" in out for out in outputs), outputs


HOST_PYTEST_ALEMBIC = '''
import alembic.config
import pytest
from pytest_alembic.tests import (  # noqa: F401
    test_model_definitions_match_ddl, test_single_head_revision, test_up_down_consistency, test_upgrade)
from hostedrooms import migrate

@pytest.fixture
def alembic_config():
    return alembic.config.Config("alembic.ini")  # the host's own history

@pytest.fixture
def alembic_engine(tmp_path):
    import sqlalchemy as sa
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'host.db'}")
    yield engine
    engine.dispose()

def test_hostedrooms_rides_along(alembic_runner, alembic_engine):
    alembic_runner.migrate_up_to("heads")
    assert migrate.current_revision(alembic_engine) == migrate.head_revision()  # the one-command env.py
'''


def test_pytest_alembic_on_the_host_history_with_the_readme_env_py(pytester: pytest.Pytester) -> None:
    _write_host_app(pytester.path, "sqlite:///unused.db", one_command=True)
    pytester.makepyfile(test_host_migrations=HOST_PYTEST_ALEMBIC)
    pytester.makeini("[pytest]\npytest_alembic_tests_path = tests/pytest_alembic_autoregistration_disabled.py\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=5)
