"""``mypy --strict`` on a user's code (the installed mypy, in a subprocess): a realistic strict program of every
area passes (and runs), and the mistakes the types exist for -- a misspelt result key, a wrong argument type --
are reported, exactly where ``tests/typing_cases/strict_mistakes.py`` marks them."""

from __future__ import annotations

import os
import re
import runpy
import site
import subprocess
import sys
import sysconfig
from collections import Counter
from pathlib import Path

import pytest
from test_readme import readme_block

import hostedrooms
from hostedrooms import create_engine, migrate, rooms

CASES = Path(__file__).resolve().parents[1] / "typing_cases"
_ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: (?P<message>.*)  \[(?P<code>[a-z-]+)\]$")
_MARK = re.compile(r"# E: (?P<code>[a-z-]+)(?: x(?P<count>\d+))?$")


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for this module's runs (the second run of a worker reuses what the first analysed)."""
    return tmp_path_factory.mktemp("mypy-cache")


def _environment() -> dict[str, str]:
    """The environment of the mypy run: when hostedrooms is not in site-packages (a checkout, or an editable
    install, whose import hook mypy cannot follow), its folder goes on MYPYPATH, as a user of a checkout does."""
    root = Path(hostedrooms.__file__).resolve().parent.parent
    installed = {Path(path).resolve() for path in (*site.getsitepackages(), sysconfig.get_paths()["purelib"])}
    env = {name: value for name, value in os.environ.items() if name != "MYPYPATH"}
    if root not in installed:
        env["MYPYPATH"] = str(root)
    return env


def run_mypy(path: Path, tmp_path: Path, cache: Path) -> tuple[int, str]:
    """``mypy --strict`` of one file as a user runs it (in its own folder, no project configuration)."""
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n", encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir", str(cache),
         "--no-color-output", str(path)],
        cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=600, check=False)
    return completed.returncode, completed.stdout + completed.stderr


def test_mypy_strict_accepts_a_strict_users_code(tmp_path: Path, mypy_cache: Path) -> None:
    returncode, output = run_mypy(CASES / "strict_user.py", tmp_path, mypy_cache)
    assert returncode == 0, output
    assert output.strip() == "Success: no issues found in 1 source file"


def test_the_strict_users_code_runs(tmp_path: Path) -> None:
    directory = tmp_path / "app"
    directory.mkdir(mode=0o700)  # the ledger's folder must be owner-private
    runpy.run_path(str(CASES / "strict_user.py"))["main"](directory)


def _marked(path: Path) -> Counter[tuple[int, str]]:
    expected: Counter[tuple[int, str]] = Counter()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if mark := _MARK.search(line):
            expected[(number, mark["code"])] += int(mark["count"] or 1)
    return expected


def test_mypy_strict_reports_a_users_mistakes(tmp_path: Path, mypy_cache: Path) -> None:
    case = CASES / "strict_mistakes.py"
    returncode, output = run_mypy(case, tmp_path, mypy_cache)
    assert returncode == 1, output
    errors = [match for line in output.splitlines() if (match := _ERROR.match(line))]
    assert {Path(error["path"]).name for error in errors} == {case.name}, output
    found = Counter((int(error["line"]), error["code"]) for error in errors)
    assert found == _marked(case), output
    # The two mistakes of the issue, word for word.
    messages = {error["message"] for error in errors}
    assert 'TypedDict "EventPage" has no key "cursr"' in messages
    assert 'Argument "room_id" to "create_room" has incompatible type "int"; expected "str"' in messages
    # The README shows them as mypy prints them.
    reported = {f"error: {error['message']}  [{error['code']}]" for error in errors}
    shown = readme_block("has no key", language="text").splitlines()
    assert len(shown) == 2 and set(shown) <= reported, output


def test_the_readme_types_example_passes_mypy_strict_and_runs(tmp_path: Path, mypy_cache: Path) -> None:
    example = tmp_path / "readme_types.py"
    example.write_text(readme_block("hostedrooms.records import"), encoding="utf-8")
    returncode, output = run_mypy(example, tmp_path, mypy_cache)
    assert returncode == 0, output

    namespace = runpy.run_path(str(example))
    engine = create_engine(tmp_path / "state.db")
    try:
        migrate.upgrade(engine)
        gateway = "install:gw-a"
        rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=gateway)
        assert namespace["last_claim"](engine, "r1") is None
        for index in range(3):
            rooms.append_event(engine, room_id="r1", event_id=f"e{index}", kind="message.user",
                               actor={"kind": "user", "id": "u1"}, payload={"text": f"hello {index}"},
                               authority_gateway_id=gateway, authority_epoch=1)
        rooms.claim_authority(engine, room_id="r1", expected_gateway_id=gateway, expected_epoch=1,
                              new_gateway_id="install:gw-b", event_id="claim-2")
        assert namespace["user_messages"](engine, "r1") == ["hello 0", "hello 1", "hello 2"]
        assert namespace["last_claim"](engine, "r1") == "claim-2"
    finally:
        engine.dispose()
