"""Hypothesis profiles for the property suite.

`HYPOTHESIS_PROFILE=ci` (set by .ci/run) runs 2,000 examples per property, the same
ones every run (derandomized): a gate that lands work must give the same verdict on
the same commit, so a red CI run always means a change, never a lucky draw.
`HYPOTHESIS_PROFILE=explore` runs 2,000 new random examples each time and prints the
`@reproduce_failure` blob of whatever it finds: run it before a stop, and turn each
find into a unit test beside the fix (two real bugs were found that way). The default
`dev` profile runs about 200 random examples so a local run stays quick.
No deadline: timing on a shared 2-core CI machine is not what these tests check.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
    print_blob=True,
)
settings.register_profile(
    "explore",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
