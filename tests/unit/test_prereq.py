"""The tests' one rule for a missing prerequisite (tests/prereq.py): skip locally, fail under CI."""

import prereq
import pytest
from prereq import missing, require, require_sandbox


@pytest.mark.parametrize("ci, outcome", [("", pytest.skip.Exception),
                                         ("true", pytest.fail.Exception),
                                         ("false", pytest.skip.Exception)])
def test_a_missing_package_skips_locally_and_fails_under_ci(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="needs the nope extra"):
        require("traingym_no_such_module.sub", "needs the nope extra")
    assert require("json", "always there").dumps(1) == "1"


def test_a_legitimate_skip_stays_a_skip_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.skip.Exception, match="not a boundary"):
        missing("not a boundary", ci_must_run=False)


def test_a_broken_dependency_is_an_error_not_a_skip(tmp_path, monkeypatch):
    (tmp_path / "tg_broken_pkg.py").write_text("import traingym_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="traingym_missing_dependency"):
        require("tg_broken_pkg", "never")


@pytest.fixture
def fresh_probe():
    """The probe is cached per session: keep this test's broken bwrap out of the others'."""
    prereq._sandbox_problem.cache_clear()
    yield
    prereq._sandbox_problem.cache_clear()


def test_an_unavailable_default_sandbox_fails_under_ci(monkeypatch, fresh_probe):
    monkeypatch.setenv("TRAINGYM_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="bwrap sandbox backend is unavailable here"):
        require_sandbox("bwrap")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="/nonexistent/bwrap is missing"):
        require_sandbox("bwrap")
