"""Hypothesis profiles for the property suite.

`HYPOTHESIS_PROFILE=ci` (set by .ci/run) runs at least 2,000 examples per
property; the default `dev` profile runs about 200 so a local run stays quick.
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
    print_blob=True,
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
