"""The migration steps hostedrooms builds from Alembic's public names (issue #37) are the ones Alembic's own
commands build (with a private helper), for every destination from every database revision, errors included; and
the SQLite-only index is left out of PostgreSQL's comparison through its public ``info``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from hostedrooms import migrate, models


@pytest.fixture(scope="module")
def script() -> ScriptDirectory:
    return ScriptDirectory.from_config(migrate.alembic_config())


def _outcome(build: Callable[..., Any], destination: str, heads: tuple[str, ...]) -> Any:
    try:
        steps: list[Any] = build(destination, heads)
        return [(step.from_revisions, step.to_revisions, step.is_upgrade, step.short_log) for step in steps]
    except CommandError as exc:
        return ("CommandError", str(exc))


def _revisions(script: ScriptDirectory) -> list[str]:
    return [each.revision for each in script.walk_revisions()]


def test_upgrade_steps_are_alembic_s_own(script: ScriptDirectory) -> None:
    alembic_s = getattr(script, "_upgrade_revs")  # noqa: B009 - the private helper is what is compared with
    revisions = _revisions(script)
    destinations = [*revisions, "head", "heads", "+1", "+2", "no-such-revision", "base"]
    outcomes = []
    for heads in [(), *((revision,) for revision in revisions)]:
        for destination in destinations:
            ours = _outcome(functools.partial(migrate._upgrade_steps, script), destination, heads)
            assert ours == _outcome(alembic_s, destination, heads), (destination, heads)
            outcomes.append(ours)
    errors = {outcome[1] for outcome in outcomes if isinstance(outcome, tuple)}
    assert len(outcomes) > 100 and [] in outcomes
    assert {"Can't locate revision identified by 'no-such-revision'", "Relative revision +2 didn't produce 2 migrations"
            } <= errors


def test_downgrade_steps_are_alembic_s_own(script: ScriptDirectory) -> None:
    alembic_s = getattr(script, "_downgrade_revs")  # noqa: B009
    revisions = _revisions(script)
    outcomes = []
    for heads in [(revision,) for revision in revisions]:
        for destination in [*revisions, "base", "-1", "-2", "no-such-revision", "head"]:
            ours = _outcome(functools.partial(migrate._downgrade_steps, script), destination, heads)
            assert ours == _outcome(alembic_s, destination, heads), (destination, heads)
            outcomes.append(ours)
    errors = {outcome[1] for outcome in outcomes if isinstance(outcome, tuple)}
    assert [] in outcomes and "Destination head is not a valid downgrade target from current head(s)" in errors


def test_steps_reach_the_destination(script: ScriptDirectory) -> None:
    """Not only equal to Alembic's: from nothing to head, every revision once, oldest first."""
    steps: list[Any] = migrate._upgrade_steps(script, "head", ())
    assert [step.to_revisions for step in steps] == [(revision,) for revision in reversed(_revisions(script))]


def test_the_sqlite_only_index_is_compared_on_sqlite_alone() -> None:
    index = next(index for index in models.metadata.tables["hosted_room_events"].indexes
                 if index.name == "idx_hosted_room_events_cursor")
    assert index.info[models.ONLY_ON] == "sqlite"
    args = (index, index.name, "index", False, None)
    assert migrate._created_on("sqlite")(*args)
    assert not migrate._created_on("postgresql")(*args)
    assert migrate._created_on("postgresql")(index, index.name, "index", True, None)  # reflected: compared
