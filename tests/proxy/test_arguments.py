"""The entry point's flags: defaults, repeatable ones, and messages for bad values."""

from __future__ import annotations

import resource

import pytest

from flexinfer_proxy.__main__ import SPARE_DESCRIPTORS, build_parser, config_from, fit_connections
from flexinfer_proxy.app import ProxyConfig


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


def test_every_bound_has_a_flag_whose_default_is_the_configs() -> None:
    config = config_from(build_parser().parse_args([]))
    assert config == ProxyConfig(max_connections=config.max_connections)
    assert (config.max_body_bytes, config.max_buffered_bytes) == (16 * 2**20, 256 * 2**20)
    assert (config.max_queue, config.max_queue_total) == (1000, 10000)
    assert (config.max_concurrent_per_client, config.max_queued_per_client) == (256, 128)
    assert (config.lingering_time, config.lingering_bytes) == (30.0, 128 * 2**20)
    assert config.backend_idle_timeout == 4.0
    assert (
        config.client_header_timeout,
        config.client_body_timeout,
        config.client_idle_timeout,
        config.backend_connect_timeout,
        config.backend_headers_timeout,
        config.backend_read_timeout,
    ) == (10.0, 60.0, 75.0, 10.0, 600.0, 300.0)
    assert not config.access_log
    assert (config.max_retry_after_seconds, config.swap_time_prior) == (300, 30.0)
    assert (config.swap_time_samples, config.wait_comment_interval) == (20, 5.0)
    flags = [
        "--max-body-bytes", "2048", "--max-buffered-bytes", "4096",
        "--max-queue", "3", "--max-queue-total", "4", "--max-connections", "5",
        "--client-header-timeout", "2s", "--client-body-timeout", "3s",
        "--client-idle-timeout", "4s", "--backend-connect-timeout", "5s",
        "--backend-headers-timeout", "1m", "--backend-read-timeout", "7s",
        "--access-log", "--retry-after", "3",
        "--max-concurrent-per-client", "6", "--max-queued-per-client", "0",
        "--lingering-time", "2s", "--lingering-bytes", "0", "--backend-idle-timeout", "1s",
        "--max-retry-after", "40", "--swap-time-prior", "2m", "--swap-time-samples", "7",
        "--wait-comment-interval", "15s",
        "--in-flight-interval", "2.5s",
    ]  # fmt: skip
    set_ = config_from(build_parser().parse_args(flags))
    assert (set_.max_body_bytes, set_.max_buffered_bytes, set_.max_queue) == (2048, 4096, 3)
    assert (set_.max_queue_total, set_.max_connections, set_.retry_after_seconds) == (4, 5, 3)
    assert (set_.client_header_timeout, set_.backend_headers_timeout) == (2.0, 60.0)
    assert set_.access_log
    assert (set_.max_concurrent_per_client, set_.max_queued_per_client) == (6, 0)
    assert (set_.lingering_time, set_.lingering_bytes, set_.backend_idle_timeout) == (2, 0, 1)
    assert (set_.max_retry_after_seconds, set_.swap_time_prior) == (40, 120.0)
    assert (set_.swap_time_samples, set_.wait_comment_interval) == (7, 15.0)
    assert set_.in_flight_interval.total_seconds() == 2.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-queue", "0"], "--max-queue must be at least 1, got 0"),
        (["--max-queued-per-client", "-1"], "--max-queued-per-client must be at least 0"),
        (["--lingering-time", "0s"], "--lingering-time must be longer than 0s"),
        (["--lingering-bytes", "-5"], "--lingering-bytes must be at least 0"),
        (["--backend-idle-timeout", "soon"], "'soon' is not a valid duration"),
        (["--max-concurrent-per-client", "x"], "--max-concurrent-per-client: 'x' is not a"),
        (["--max-body-bytes", "lots"], "--max-body-bytes: 'lots' is not a whole number"),
        (["--client-header-timeout", "0s"], "--client-header-timeout must be longer than 0s"),
        (["--backend-read-timeout", "soon"], "'soon' is not a valid duration"),
        (["--api-key-secret", "just-a-name"], "expected NAMESPACE/NAME, got 'just-a-name'"),
        (["--event-loop", "trio"], "invalid choice: 'trio'"),
        (["--max-retry-after", "0"], "--max-retry-after must be at least 1, got 0"),
        (["--swap-time-prior", "0s"], "--swap-time-prior must be longer than 0s"),
        (["--swap-time-prior", "2h"], "--swap-time-prior must be at most 3600s, got '2h'"),
        (["--swap-time-samples", "0"], "--swap-time-samples must be at least 1, got 0"),
        (["--swap-time-samples", "1001"], "--swap-time-samples must be at most 1000, got 1001"),
        (["--wait-comment-interval", "61s"], "--wait-comment-interval must be at most 60s"),
        (["--wait-comment-interval", "0s"], "--wait-comment-interval must be longer than 0s"),
        (["--in-flight-interval", "50ms"], "--in-flight-interval must be between 0.1s and 30s"),
        (["--in-flight-interval", "31s"], "--in-flight-interval must be between 0.1s and 30s"),
        (["--in-flight-interval", "0s"], "--in-flight-interval must be longer than 0s"),
    ],
)
def test_bad_bounds_are_refused_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_connection_cap_is_lowered_to_fit_the_open_files_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: None)
    # Two descriptors per client (its own and its backend's) plus spares must fit 1024.
    assert fit_connections(4096) == (1024 - SPARE_DESCRIPTORS) // 2
    assert fit_connections(100) == 100


def test_the_port_line_is_one_write_so_interleaved_logs_cannot_split_it() -> None:
    """Wrappers (the image test, the demo) match `listening on HOST:PORT` as a whole
    line of a file that also gets stderr's logs; `print` writes the newline separately,
    and with PYTHONUNBUFFERED a log line landed between the two."""
    import io

    from flexinfer_proxy.__main__ import announce

    class Writes(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def write(self, text: str) -> int:
            self.calls.append(text)
            return super().write(text)

    out = Writes()
    announce("listening on 127.0.0.1:8000", out)
    assert out.calls == ["listening on 127.0.0.1:8000\n"]
