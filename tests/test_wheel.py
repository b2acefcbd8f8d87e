"""The wheel built from the checkout ships the package and its scripts, and nothing the tests
or the benchmarks use alone (test servers, the chaos harness)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .helpers import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("celery_dedupe-*.whl")
    return zipfile.ZipFile(built)


def _package_files(wheel: zipfile.ZipFile) -> set[str]:
    return {name for name in wheel.namelist() if ".dist-info/" not in name}


def test_the_wheel_holds_only_the_package(wheel: zipfile.ZipFile) -> None:
    assert {name.split("/")[0] for name in _package_files(wheel)} == {"dedupe"}


def test_the_wheel_ships_every_lua_script_and_the_type_marker(wheel: zipfile.ZipFile) -> None:
    scripts = {path.name for path in (ROOT / "dedupe" / "store" / "lua").glob("*.lua")}
    shipped = {Path(name).name for name in wheel.namelist() if name.startswith("dedupe/store/lua/")}
    assert scripts
    assert shipped == scripts
    assert "dedupe/py.typed" in wheel.namelist()


def test_the_wheel_ships_the_web_views_pages(wheel: zipfile.ZipFile) -> None:
    static = ROOT / "dedupe" / "webview" / "static"
    pages = {path.name for path in static.iterdir()}
    shipped = {
        Path(name).name for name in wheel.namelist() if name.startswith("dedupe/webview/static/")
    }
    assert {"index.html", "key.html", "view.js"} <= pages
    assert shipped == pages


def test_the_wheel_holds_no_test_server_and_no_chaos_code(wheel: zipfile.ZipFile) -> None:
    found = [
        name
        for name in _package_files(wheel)
        if "chaos" in name
        or (
            name.endswith(".py")
            and any(
                word in wheel.read(name).decode()
                for word in ("class SentinelSet", "class ClusterSet", "from tests", "import tests")
            )
        )
    ]
    assert found == []
