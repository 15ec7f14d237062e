"""A test that starts the local control plane without the `controlplane` marker fails, naming itself
and the marker (tests/conftest.py): `make unit` runs from a clone without the control plane's
binaries. These tests are unmarked on purpose, so that `make unit` runs them."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from localcp.cluster import ControlPlane
from localcp.stack import LocalStack

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).with_name("conftest.py")
REPO = CONFTEST.parent.parent


@pytest.mark.parametrize("kind", [LocalStack, ControlPlane])
def test_an_unmarked_test_that_starts_the_control_plane_fails_naming_itself_and_the_marker(request, kind):
    with pytest.raises(pytest.fail.Exception) as refused:
        with kind():  # were the guard gone, what it started would be stopped here
            pass
    assert str(refused.value).startswith(f"{request.node.nodeid} starts the local control plane but is not marked `controlplane`")


def test_the_refusal_is_the_tests_outcome_and_a_marked_test_is_let_through(pytester, monkeypatch):
    """A run of its own: the unmarked test is reported failed with the message and no traceback;
    the marked one gets past the guard (it checks itself, not to start a control plane here)."""
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(test_starts=textwrap.dedent("""
        import pytest
        from conftest import require_controlplane_marker
        from localcp.stack import LocalStack

        def test_unmarked():
            with LocalStack():
                pass

        @pytest.mark.controlplane
        def test_marked(request):
            require_controlplane_marker(request.node)
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_starts.py::test_unmarked starts the local control plane but is not"
                                 " marked `controlplane`: add @pytest.mark.controlplane*"])
    result.stdout.no_fnmatch_line("*Traceback*")
