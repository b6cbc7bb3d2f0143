"""Profiles (SWE-smith registry and the demo's), the swebench shim, procedural bugs."""

import ast
import random

import pytest

from camg.errors import DatasetError
from environments.coding import profiles
from environments.coding.demo import bugs


def test_swesmith_profile_comes_from_the_registry_and_is_registered_on_swebench():
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    repo = "swesmith/marshmallow-code__apispec.8b421526"
    profile = profiles.for_repo(repo)
    assert profile.source == "swesmith"
    assert "pytest --disable-warnings --color=no --tb=no --verbose" in profile.test_cmd
    assert MAP_REPO_VERSION_TO_SPECS[repo][profiles.SWEBENCH_VERSION]["test_cmd"] == profile.test_cmd
    log = "tests/test_core.py::test_a PASSED\ntests/test_core.py::test_b FAILED\n"
    assert MAP_REPO_TO_PARSER[repo](log, None) == {"tests/test_core.py::test_a": "PASSED",
                                                    "tests/test_core.py::test_b": "FAILED"}


def test_unknown_repo_has_no_profile():
    with pytest.raises(DatasetError, match="no profile"):
        profiles.for_repo("swesmith/nobody__nothing.00000000")


def test_demo_profile_parser_matches_swesmith_rule():
    from swesmith.profiles import registry
    upstream = registry.get("marshmallow-code__apispec.8b421526")
    log = ("tests/a.py::t[x-1] PASSED  [ 10%]\ntests/a.py::u FAILED\ntests/a.py::v ERROR\n"
           "tests/a.py::w SKIPPED (why)\ntests/a.py::x XFAIL\nnoise line\n")
    assert profiles.parse_pytest_verbose(log) == upstream.log_parser(log)


def test_shim_refuses_to_override_native_swebench_repos():
    shim = profiles.import_shim()
    with pytest.raises(ValueError, match="already grades"):
        shim.register("django/django", "camg", "pytest", profiles.parse_pytest_verbose)
    shim.register("camg-demo/x__y.1", "camg", "cmd-a", profiles.parse_pytest_verbose)
    shim.register("camg-demo/x__y.1", "camg", "cmd-a", profiles.parse_pytest_verbose)
    with pytest.raises(ValueError, match="registered with"):
        shim.register("camg-demo/x__y.1", "camg", "cmd-b", profiles.parse_pytest_verbose)


SOURCE = '''
def f(a, b, items):
    total = 0
    if a < b:
        total = a - b
    else:
        total = b * 2
    for item in items:
        total += item
    if a == 3 and b:
        return total // 2
    x = 1
    y = 2
    return total + x + y
'''


@pytest.mark.parametrize("modifier", sorted(bugs.MODIFIERS))
def test_every_modifier_makes_a_valid_single_site_change(modifier):
    found = [m for m in bugs.mutations("m.py", SOURCE, random.Random(0)) if m.modifier == modifier]
    assert found, modifier
    for mutation in found:
        ast.parse(mutation.source)
        assert mutation.source != SOURCE and mutation.function == "f"
        changed = [i for i, (a, b) in enumerate(zip(SOURCE.splitlines(),
                                                    mutation.source.splitlines())) if a != b]
        assert changed, mutation


def test_mutations_are_deterministic_for_a_seed():
    one = [m.source for m in bugs.mutations("m.py", SOURCE, random.Random(5))]
    two = [m.source for m in bugs.mutations("m.py", SOURCE, random.Random(5))]
    assert one == two and len(set(one)) == len(one)


def test_swesmith_shaped_demo_runs_swesmiths_own_python_test_command():
    from swesmith.profiles.python import PythonProfile
    from environments.coding import profiles as p
    default = PythonProfile.__dataclass_fields__["test_cmd"].default
    assert p.SWESMITH_PYTHON_TEST_CMD == default
    assert p.for_repo("camg-demo-swesmith/x__y.12345678").test_cmd == default
