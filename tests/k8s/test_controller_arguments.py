"""The controller's flags: bounded, and a bad value names the flag and the value."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flexinfer_core import DEFAULT_POLICY, Policy
from flexinfer_k8s.__main__ import parse_args
from flexinfer_k8s.reconcile_shared import later_steps_wait


def test_the_defaults_parse() -> None:
    args = parse_args([])
    assert args.workers == 8 and args.resync_seconds == 300.0
    # Minutes, not hours: a finetune stuck on a taint parks serving at most this long.
    assert args.finetune_unschedulable_timeout == 300 and args.cache_cleanup_timeout == 300
    assert args.status_coalesce_seconds == 5.0


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--workers", "0", "--workers must be 1..64; got 0"),
        ("--workers", "65", "--workers must be 1..64; got 65"),
        ("--resync-seconds", "1", "--resync-seconds must be 0 or 10..86400.0; got 1.0"),
        ("--resync-seconds", "1e9", "--resync-seconds must be 0 or 10..86400.0; got 1000000000.0"),
        ("--resync-seconds", "-5", "--resync-seconds must be 0 or 10..86400.0; got -5.0"),
        ("--finetune-unschedulable-timeout", "0",
         "--finetune-unschedulable-timeout must be 1..86400; got 0"),
        ("--cache-cleanup-timeout", "86401", "--cache-cleanup-timeout must be 1..86400; got 86401"),
        ("--status-coalesce-seconds", "-1", "--status-coalesce-seconds must be 0..60; got -1"),
        ("--status-coalesce-seconds", "61", "--status-coalesce-seconds must be 0..60; got 61"),
    ],
)
def test_a_value_out_of_bounds_is_refused_naming_it(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([flag, value])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--workers", "1"), ("--workers", "64"),
                                             ("--resync-seconds", "0"),
                                             ("--resync-seconds", "86400"),
                                             ("--finetune-unschedulable-timeout", "1"),
                                             ("--cache-cleanup-timeout", "86400"),
                                             ("--status-coalesce-seconds", "0"),
                                             ("--status-coalesce-seconds", "60")])
def test_the_bounds_themselves_are_accepted(flag: str, value: str) -> None:
    parse_args([flag, value])


def test_the_election_policy_flags_default_to_the_cores_policy() -> None:
    assert parse_args([]).election_policy == DEFAULT_POLICY
    assert parse_args(["--default-swap-cooldown", "90s"]).election_policy == Policy(
        default_swap_cooldown=timedelta(seconds=90)
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--default-swap-cooldown", "5 minutes"), ("--demand-window", "1x"), ("--recent-window", "")],
)
def test_a_bad_election_policy_flag_is_refused_naming_it(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([f"{flag}={value}"])
    assert exit_.value.code == 2
    assert f"{flag}: {value!r}" in capsys.readouterr().err


def test_the_gpu_device_class_is_empty_by_default_and_checked_when_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_args([]).render_settings.gpu_device_class == ""  # no DRA driver
    given = parse_args(["--gpu-device-class", "gpu.amd.com"])
    assert given.render_settings.gpu_device_class == "gpu.amd.com"
    with pytest.raises(SystemExit):
        parse_args(["--gpu-device-class", "GPU.AMD.com"])
    assert "--gpu-device-class 'GPU.AMD.com': must be a DeviceClass name" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("window", "later"),
    [(0, 0), (1.5, 9), (5, 30), (10, 60), (60, 60)],
)
def test_a_holder_s_later_steps_wait_six_windows_at_most_a_minute(
    window: float, later: float
) -> None:
    """`--status-coalesce-seconds` bounds the first step; a holder already shown
    `Active` waits six times as long for its later ones, never over 60 s nor under
    the window (0 still writes every step)."""
    wait = later_steps_wait(timedelta(seconds=window))
    assert wait == timedelta(seconds=later)
