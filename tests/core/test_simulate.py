"""The discrete-event simulator: the core's decisions played out over time."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flexinfer_core import GpuLease, InvalidFieldError, Serverless, reasons
from flexinfer_core.simulate import (
    ClientSettings,
    LeaseWindow,
    ProxySettings,
    Request,
    Timeline,
    simulate,
)

from .builders import T0, member


def at(seconds: float) -> object:
    return T0 + timedelta(seconds=seconds)


def test_higher_priority_request_takes_the_card_break_before_make() -> None:
    models = [member("chat", priority=100), member("coder", priority=200)]
    timeline = simulate(
        models,
        start=T0,
        until=T0 + timedelta(minutes=3),
        requests=[Request(T0, "chat"), Request(T0 + timedelta(seconds=60), "coder")],
        load_time=timedelta(seconds=20),
        termination_time=timedelta(seconds=10),
    )
    leaders = [(s.at - T0, s.leader) for s in timeline.steps if s.leader]
    assert leaders[0] == (timedelta(0), "chat")
    assert (timedelta(seconds=60), "coder") in leaders
    assert timeline.max_members_with_pods == 1
    preempt = [e for s in timeline.steps for e in s.events if e.reason == reasons.PREEMPTED]
    assert [e.model for e in preempt] == ["chat"]
    # coder's pod exists only after chat's pod has gone (10 s termination).
    coder_up = next(s.at for s in timeline.steps if dict((n, p) for n, p, _ in s.pods)["coder"])
    assert coder_up - T0 >= timedelta(seconds=70)


def test_alternating_equal_priority_requests_do_not_storm() -> None:
    models = [member("a"), member("b")]
    requests = [
        Request(T0 + timedelta(seconds=30 * i), "a" if i % 2 == 0 else "b") for i in range(40)
    ]  # 20 minutes of ping-pong
    timeline = simulate(
        models,
        start=T0,
        until=T0 + timedelta(minutes=20),
        requests=requests,
        load_time=timedelta(seconds=10),
        termination_time=timedelta(seconds=2),
    )
    # Both stay busy, so equal priority never takes the card from a busy leader.
    assert timeline.swaps == 0


def ping_pong(cooldown: timedelta) -> int:
    """Two equal-priority models asked in turn every 2 minutes for 40 minutes."""
    models = [member("a", swap_cooldown=cooldown), member("b", swap_cooldown=cooldown)]
    requests = [
        Request(T0 + timedelta(minutes=2 * i), "a" if i % 2 == 0 else "b") for i in range(20)
    ]
    timeline = simulate(
        models,
        start=T0,
        until=T0 + timedelta(minutes=40),
        requests=requests,
        load_time=timedelta(seconds=10),
        termination_time=timedelta(seconds=2),
    )
    assert timeline.max_members_with_pods == 1
    return timeline.swaps


def test_swap_loop_prevented_by_cooldown() -> None:
    # Each leader is idle (2 minutes since its last request) when the other asks, so
    # equal priority may take the card; only the cooldown keeps that from looping.
    unguarded = ping_pong(timedelta(0))
    guarded = ping_pong(timedelta(minutes=5))
    assert unguarded >= 15
    assert guarded <= 40 // 5 + 1


def test_lease_parks_then_serving_returns() -> None:
    lease = GpuLease(name="ft", group="homelab-gpu", owner="trainer")
    timeline = simulate(
        [member("chat")],
        start=T0,
        until=T0 + timedelta(minutes=4),
        requests=[Request(T0, "chat"), Request(T0 + timedelta(seconds=150), "chat")],
        leases=[
            LeaseWindow(lease, start=T0 + timedelta(seconds=60), end=T0 + timedelta(seconds=120))
        ],
    )
    reasons_seen = [(s.at - T0, s.reason) for s in timeline.steps]
    assert (timedelta(seconds=60), reasons.GPU_LEASE_HELD) in reasons_seen
    after = [s for s in timeline.steps if s.at >= T0 + timedelta(seconds=120)]
    assert after and after[0].leader == "chat"


def test_unknown_model_in_requests_is_rejected() -> None:
    with pytest.raises(InvalidFieldError, match=r"requests\.model: 'ghost'"):
        simulate([member("a")], start=T0, until=T0, requests=[Request(T0, "ghost")])


# --- requests go through the proxy's queue ------------------------------------------

MINUTE = timedelta(minutes=1)


def swaps_of(timeline: Timeline) -> list[tuple[timedelta, str | None]]:
    return [(at - T0, leader) for at, leader in timeline.holders]


# coder is asked for at 0s, 1m10s and 2m30s: served at the last two, it writes its demand
# each time (more than a minute apart), so it is busy until 4m30s. chat, of equal
# priority, is asked for at 1m20s while coder is busy: its request waits in the queue.
BUSY_CODER_THEN_CHAT = [
    Request(T0, "coder"),
    Request(T0 + timedelta(seconds=70), "coder"),
    Request(T0 + timedelta(seconds=80), "chat"),
    Request(T0 + timedelta(seconds=150), "coder"),
]
CODER_IDLE = timedelta(seconds=270, microseconds=1)  # strictly past the 2m window


def coder_then_chat(*, cold_start: timedelta, **settings: object) -> Timeline:
    return simulate(
        [member("chat", serverless=Serverless(cold_start_timeout=cold_start)), member("coder")],
        start=T0,
        until=T0 + 10 * MINUTE,
        requests=BUSY_CODER_THEN_CHAT,
        load_time=timedelta(seconds=10),
        termination_time=timedelta(seconds=2),
        **settings,  # type: ignore[arg-type]
    )


def test_a_queued_request_keeps_its_model_demanded_every_refresh_interval() -> None:
    """chat's request may wait 5m (its coldStartTimeout); the proxy writes its demand again
    every minute, so chat is still demanded when coder goes idle at 4m30s."""
    timeline = coder_then_chat(cold_start=5 * MINUTE, clients=ClientSettings(retries=0))
    written = [(at - T0, model) for at, model in timeline.demand]
    assert [at for at, model in written if model == "chat"] == [
        timedelta(seconds=s) for s in (80, 140, 200, 260)
    ]  # queued at 1m20s, then every minute until it is served
    # coder's: queued at 0s; served at 10s (not written: 10s after), 1m10s and 2m30s.
    assert [at for at, model in written if model == "coder"] == [
        timedelta(seconds=s) for s in (0, 70, 150)
    ]
    assert swaps_of(timeline) == [(timedelta(0), "coder"), (CODER_IDLE, "chat")]
    chat = timeline.requests[2]
    assert chat.served_at is not None and chat.refusals == ()


def test_a_timed_out_request_is_asked_again_after_retry_after() -> None:
    """With a 60s queue wait chat's request gets a 503 at 2m20s and 3m35s; each retry
    (15s later) queues again and writes the demand, so chat is demanded when coder goes
    idle. A client that does not ask again leaves chat undemanded from 3m20s."""
    patient = coder_then_chat(
        cold_start=timedelta(0),
        clients=ClientSettings(retries=2, retry_after=timedelta(seconds=15)),
    )
    chat = patient.requests[2]
    assert [at - T0 for at in chat.refusals] == [timedelta(seconds=s) for s in (140, 215)]
    assert chat.served_at is not None and not chat.gave_up
    assert swaps_of(patient) == [(timedelta(0), "coder"), (CODER_IDLE, "chat")]
    impatient = coder_then_chat(cold_start=timedelta(0), clients=ClientSettings(retries=0))
    chat = impatient.requests[2]
    assert chat.gave_up and chat.served_at is None
    assert [at - T0 for at in chat.refusals] == [timedelta(seconds=140)]
    assert [leader for _, leader in swaps_of(impatient)] == ["coder"]


def test_served_requests_write_the_demand_at_most_once_per_interval() -> None:
    """coder is served at 1m10s (its demand written: 70s since the last) and 1m40s (not
    written: 30s since), so it is idle from 3m10s and chat, asked for at 3m20s, takes the
    card at once instead of at 3m40s."""
    timeline = simulate(
        [member("chat"), member("coder")],
        start=T0,
        until=T0 + 6 * MINUTE,
        requests=[
            Request(T0, "coder"),
            Request(T0 + timedelta(seconds=70), "coder"),
            Request(T0 + timedelta(seconds=100), "coder"),
            Request(T0 + timedelta(seconds=200), "chat"),
        ],
        load_time=timedelta(seconds=10),
        termination_time=timedelta(seconds=2),
    )
    assert swaps_of(timeline)[1] == (timedelta(seconds=200), "chat")
    served = [o.served_at - T0 for o in timeline.requests if o.served_at is not None]
    assert served[:3] == [timedelta(seconds=10), timedelta(seconds=70), timedelta(seconds=100)]


def test_proxy_and_client_settings_are_checked() -> None:
    with pytest.raises(InvalidFieldError, match=r"proxy.refreshInterval"):
        ProxySettings(refresh_interval=timedelta(0))
    with pytest.raises(InvalidFieldError, match=r"retries: -1"):
        ClientSettings(retries=-1)
