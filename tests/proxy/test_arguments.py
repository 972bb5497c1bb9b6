"""The entry point's flags: defaults, repeatable ones, and messages for bad values."""

from __future__ import annotations

import pytest

from flexinfer_proxy.__main__ import build_parser


def test_defaults_and_repeatable_flags() -> None:
    args = build_parser().parse_args(
        ["--namespace", "a", "--namespace", "b", "--endpoint", "m=http://127.0.0.1:1/v1"]
    )
    assert (args.port, args.namespace, args.kubeconfig, args.log_level) == (
        8000,
        ["a", "b"],
        None,
        "INFO",
    )
    assert args.endpoint == [("m", "http://127.0.0.1:1/v1")]
    assert (args.min_queue_wait, args.retry_after, args.max_per_backend) == (60.0, 10, 0)


def test_durations_and_log_levels_are_read_like_the_controllers() -> None:
    args = build_parser().parse_args(["--min-queue-wait", "1m30s", "--log-level", "debug"])
    assert (args.min_queue_wait, args.log_level) == (90.0, "DEBUG")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--min-queue-wait", "soon"], "'soon' is not a valid duration"),
        (["--endpoint", "m"], "expected NAME=http://host:port/v1"),
        (["--endpoint", "m=ftp://x"], "expected NAME=http://host:port/v1"),
    ],
)
def test_bad_values_are_refused_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert message in capsys.readouterr().err
