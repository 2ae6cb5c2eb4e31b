"""How ``make unit`` splits the suite over two pytest-xdist workers (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.conftest import RAY_MODULES, pytest_collection_modifyitems, work_unit


def test_a_module_is_one_unit_and_every_ray_module_is_one_unit_together() -> None:
    here = "tests/test_suite_split.py"
    assert work_unit(f"{here}::test_a_module_is_one_unit") == here
    assert work_unit("tests/cluster/test_ray_train.py::test_two_nodes[x::y]") == "ray"
    assert {work_unit(f"{module}::test") for module in RAY_MODULES} == {"ray"}
    assert {"tests/cluster/test_ray_train.py", "tests/test_docs_ray_commands.py"} <= RAY_MODULES
    assert "tests/test_docs_commands.py" not in RAY_MODULES  # its Ray commands moved out


def test_a_ray_test_outside_the_ray_modules_is_refused(request: pytest.FixtureRequest) -> None:
    pytest_collection_modifyitems([request.node])  # unmarked: nothing to say
    request.node.add_marker("ray")  # (this module's text does not name the mark)
    with pytest.raises(pytest.UsageError, match=r"ray-marked tests in \['tests/test_suite_sp"):
        pytest_collection_modifyitems([request.node])
