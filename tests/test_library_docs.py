"""docs/library.md stays true: its `>>>` examples run as doctests, and its example test
file (the block that starts `# test_my_policy.py`) runs as a test module would."""

from __future__ import annotations

import doctest
import re
from pathlib import Path
from typing import Any

from hypothesis import settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "library.md"


def test_the_examples_print_what_the_page_says() -> None:
    result = doctest.testfile(
        str(PAGE),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        raise_on_error=False,
        verbose=False,
    )
    assert result.attempted >= 15, result
    assert result.failed == 0, result


def example_module(name: str) -> dict[str, Any]:
    blocks = re.findall(r"```python\n(# " + re.escape(name) + r"\n.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 1, f"docs/library.md has no single {name} block"
    namespace: dict[str, Any] = {"__name__": name.removesuffix(".py")}
    exec(compile(blocks[0], f"docs/library.md:{name}", "exec"), namespace)
    return namespace


def test_the_users_own_property_holds() -> None:
    module = example_module("test_my_policy.py")
    tests = [v for k, v in module.items() if k.startswith("test_") and callable(v)]
    assert [t.__name__ for t in tests] == ["test_chat_is_never_preempted_by_batch"]
    for test in tests:
        # No deadline: a loaded CI machine is not what the example checks.
        settings(deadline=None)(test)()


def test_the_users_own_property_catches_a_force_promoted_batch() -> None:
    """What the page says: forcePromotion set on batch while chat serves (a raw state,
    `settled=False`) makes the property fail."""
    import attrs
    import pytest
    from hypothesis import given

    from flexinfer_core.testing import GroupScenario, group_scenarios_for, oracle, preemptions

    module = example_module("test_my_policy.py")
    forced = attrs.evolve(module["BATCH"], force_promotion=True)

    # Derandomized: the same 300 draws every run, and a failure found among them.
    @settings(derandomize=True, max_examples=300, database=None, deadline=None)
    @given(group_scenarios_for([module["CHAT"], forced, module["CODER"]], settled=False))
    def property_(scenario: GroupScenario) -> None:
        if oracle.runnable(scenario.member("chat")):
            assert ("chat", "batch") not in preemptions(scenario, scenario.decide())

    with pytest.raises(AssertionError):
        property_()
