"""A property-test harness for the election: strategies that draw groups, and invariants.

    pip install 'flexinfer[testing]'     # hypothesis

`strategies` draws inputs (`group_scenarios_for(your_members)`: your own group in every
observed state; `group_scenarios()`, `contested_scenarios()`: any group), `invariants`
checks a decision (`check_invariants`: one holder, break-before-make, leases park,
priority, cooldown, a fixed point; `preemptions` for your own rules), and `oracle`
holds the election's definitions written out independently of the core. The project's
own property suite uses exactly these. docs/library.md shows a user's property.
"""

from flexinfer_core.testing import oracle
from flexinfer_core.testing.invariants import (
    GroupScenario,
    check_break_before_make,
    check_cooldown,
    check_fixed_point,
    check_invariants,
    check_lease_parks_the_group,
    check_one_holder,
    check_priority,
    lease_parks,
    preemptions,
)
from flexinfer_core.testing.strategies import (
    contested_scenarios,
    durations,
    gpu_group_states,
    group_scenarios,
    group_scenarios_for,
    instants,
    leases,
    model_states,
)

__all__ = [
    "GroupScenario",
    "check_break_before_make",
    "check_cooldown",
    "check_fixed_point",
    "check_invariants",
    "check_lease_parks_the_group",
    "check_one_holder",
    "check_priority",
    "contested_scenarios",
    "durations",
    "gpu_group_states",
    "group_scenarios",
    "group_scenarios_for",
    "instants",
    "lease_parks",
    "leases",
    "model_states",
    "oracle",
    "preemptions",
]
