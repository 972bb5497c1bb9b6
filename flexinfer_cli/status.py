"""`flexinfer status [-w]`: groups, not objects.

Per shared group: the holder, its phase and reason, the queue in order, when the
swap cooldown ends, the lease, and the next change; per GPUGroup: the active model,
phase, queue and the anti-thrashing gate holding a swap back; per standalone
ModelDeployment (and Model sharing no card): replicas and when it scales to zero.
Everything is decided by the controller's own functions on the controller's own
snapshot (`flexinfer_k8s.observe`, `flexinfer_core`), from one listing, or, with
`-w`, from informers that follow the cluster; a new block is printed whenever what
it shows changes (ages aside) or a timer it shows passes. `-o json|yaml` also
carries `recorded`: the groups as the controller wrote them in status
(`flexinfer_kube.recorded_status`, the shaping the proxy's live page shares).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from flexinfer_cli.cluster import Target, add_cluster_flags, connect, list_cluster
from flexinfer_cli.explain import (
    add_policy_flags,
    device_class_from,
    policy_from,
    shared_card_from,
)
from flexinfer_cli.output import (
    FORMATS,
    OK,
    UsageError,
    age,
    clock,
    emit,
    no_resources,
    render_table,
    timestamp,
    until,
)
from flexinfer_cli.view import ClusterView
from flexinfer_core import (
    FlexinferError,
    GpuGroupDecision,
    GroupDecision,
    Membership,
    Policy,
    decide_standalone,
    reasons,
)
from flexinfer_core.election import Ballot, cooldown_ends_at
from flexinfer_core.explain import explain_group
from flexinfer_core.packing import format_gib
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s import observe
from flexinfer_k8s.cache import WATCHED
from flexinfer_k8s.convert_leases import GPU_LEASE_LABEL
from flexinfer_k8s.convert_models import model_state_group
from flexinfer_k8s.decide_gpugroup import decide_gpu_group_snapshot
from flexinfer_kube.clock import SystemClock
from flexinfer_kube.informers import Informer, wait_all
from flexinfer_kube.objects import name_of, namespace_of
from flexinfer_kube.recorded_status import recorded_groups
from flexinfer_kube.resources import CONFIG_MAPS, GPU_GROUPS, MODEL_DEPLOYMENTS, MODELS

# How often -w looks again with no event (ages and timers are recomputed; a block is
# printed only when what it shows changes).
WATCH_TICK = 1.0


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "status",
        help="per group: holder, phase, queue, cooldown, lease, next change",
        description="Groups, not objects: who holds each card, who waits, and what changes "
        "next; GPUGroups with their gates; standalone ModelDeployments with their timers.",
    )
    parser.add_argument(
        "-w", "--watch", action="store_true", help="keep following; print on every change"
    )
    parser.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_policy_flags(parser)
    add_cluster_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        policy = policy_from(args)
    except FlexinferError as error:
        raise UsageError(str(error)) from None
    target = connect(args)
    if args.watch:
        return watch(
            target,
            policy=policy,
            fmt=args.output,
            shared_card=shared_card_from(args),
            device_class=device_class_from(args),
        )
    view = list_cluster(target.api, target.namespace)
    now = SystemClock().now()
    data = status_data(
        view,
        now=now,
        policy=policy,
        shared_card=shared_card_from(args),
        device_class=device_class_from(args),
    )
    emit(data, fmt=args.output, table=status_text(data, now=now, namespace=target.namespace))
    return OK


# --- the data -----------------------------------------------------------------------


def status_data(
    view: ClusterView,
    *,
    now: datetime,
    policy: Policy,
    shared_card: bool = False,
    device_class: str = "",
) -> dict[str, Any]:
    """`shared_card`: a shared group of Models with a budget packs; `device_class`: the
    controller's `--gpu-device-class`, with which a budgeted GPUGroup packs."""
    groups, models = [], []
    for namespace in view.namespaces():
        for key in sorted({model_state_group(m) for m in view.objects(MODELS, namespace)}):
            if key:
                groups.append(
                    shared_group_row(
                        view, namespace, key, now=now, policy=policy, shared_card=shared_card
                    )
                )
        for model in view.objects(MODELS, namespace):
            if not model_state_group(model):
                models.append(standalone_model_row(view, model, now=now, policy=policy))
    return {
        "at": format_rfc3339(now),
        "sharedGroups": groups,
        "models": sorted(models, key=lambda m: (m["namespace"], m["name"])),
        "gpuGroups": [
            gpu_group_row(view, group, now=now, device_class=device_class)
            for group in sorted(view.objects(GPU_GROUPS), key=_key)
        ],
        "modelDeployments": [
            model_deployment_row(view, *found, now=now)
            for md in sorted(view.objects(MODEL_DEPLOYMENTS), key=_key)
            if (found := view.model_deployment_on_its_own(namespace_of(md), name_of(md)))
        ],
        # The groups as the controller last wrote them in status, shaped as the proxy's
        # live page shows them (`GET /status.json`): what the cluster says, beside what
        # the controller's functions decide now (above).
        "recorded": recorded_groups(
            models=view.objects(MODELS),
            gpu_groups=view.objects(GPU_GROUPS),
            model_deployments=view.objects(MODEL_DEPLOYMENTS),
        ),
    }


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return (namespace_of(obj), name_of(obj))


def shared_group_row(
    view: ClusterView,
    namespace: str,
    group: str,
    *,
    now: datetime,
    policy: Policy,
    shared_card: bool = False,
) -> dict[str, Any]:
    objs = view.shared_group_models(namespace, group)
    members = {name_of(m) for m in objs}
    departed = observe.departed_members(view, namespace, group, members=members)
    snapshot = observe.shared_group_snapshot(view, namespace, group, objs, departed=departed)
    explanation = explain_group(
        snapshot.states,
        now=now,
        leases=snapshot.leases,
        unreadable_lease_sources=snapshot.unreadable_lease_sources,
        policy=policy,
        running=snapshot.running,
        limit=1,
        shared_card=shared_card,
    )
    decision = explanation.decision
    holder = next((s for s in snapshot.states if s.name == decision.leader), None)
    queue = sorted((m for m in decision.members if not m.is_leader), key=lambda m: m.queue_position)
    # The swap cooldown rule's own reading of when the running cooldown ends.
    cooldown_ends = cooldown_ends_at(Ballot.of(snapshot.states, now=now, policy=policy))
    lease = decision.election.lease
    change = explanation.next_change
    return {
        "namespace": namespace,
        "group": group,
        "holder": decision.leader,
        "phase": holder.phase.value if holder is not None else None,
        "reason": decision.reason,
        "message": decision.message,
        "queue": [
            {"name": m.name, "position": m.queue_position, "reason": m.reason} for m in queue
        ],
        "cooldownEndsAt": timestamp(cooldown_ends),
        "lease": None
        if lease is None
        else {"name": lease.name, "owner": lease.owner, "expiresAt": timestamp(lease.expires_at)},
        "leasesUnreadable": list(snapshot.unreadable_lease_sources),
        "next": None
        if change is None
        else {"at": format_rfc3339(change.at), "what": change.what, "when": change.when},
        # docs/election.md 1.7: every member holding the card (the leader first), and
        # the budget's use; None when no member sets a budget.
        "holders": [
            decision.leader,
            *(m.name for m in decision.members if m.is_leader and m.name != decision.leader),
        ]
        if decision.leader is not None
        else [],
        "vram": _shared_vram(decision),
    }


def _shared_vram(decision: GroupDecision) -> dict[str, Any] | None:
    told = next((p for p in decision.packed if p.vram is not None), None)
    if told is None or told.vram is None:
        return None
    conflict = told.condition.reason == reasons.VRAM_BUDGET_CONFLICT
    return {
        "budgetBytes": told.vram.budget,
        "usedBytes": told.vram.used,
        "conflict": told.condition.message if conflict else None,
        # False: the controller has no --gpu-device-class; one member at a time.
        "sharedCard": told.condition.reason != reasons.NO_SHARED_CARD,
    }


def standalone_model_row(
    view: ClusterView, model: dict[str, Any], *, now: datetime, policy: Policy
) -> dict[str, Any]:
    namespace = namespace_of(model)
    snapshot = observe.shared_group_snapshot(view, namespace, "", [model])
    explanation = explain_group(
        snapshot.states, now=now, policy=policy, running=snapshot.running, limit=1
    )
    (member,) = explanation.decision.members
    (state,) = snapshot.states
    change = explanation.next_change
    return {
        "namespace": namespace,
        "name": member.name,
        "phase": state.phase.value,
        "replicas": state.replicas,
        "desiredReplicas": member.desired_replicas,
        "reason": member.reason,
        "lastActiveTime": timestamp(state.last_active),
        "next": None
        if change is None
        else {"at": format_rfc3339(change.at), "what": change.what, "when": change.when},
    }


def gpu_group_row(
    view: ClusterView, group: dict[str, Any], *, now: datetime, device_class: str = ""
) -> dict[str, Any]:
    snapshot = observe.gpu_group_snapshot(view, group)
    # As the controller decides it: packed with `device_class` and a budget.
    state, outcome = decide_gpu_group_snapshot(snapshot, device_class=device_class, now=now)
    decision: GpuGroupDecision = outcome.decision
    packing = outcome.packing
    budget = state.vram_budget
    holder = state.member(decision.active_model) if decision.active_model else None
    queued = sorted(
        (m for m in state.members if m.queued > 0),
        key=lambda m: (-m.priority, m.oldest_waiting or now, m.name),
    )
    holders = (
        list(packing.holders) if packing is not None and packing.used else sorted(outcome.holders)
    )
    used = (
        packing.used
        if packing is not None and packing.used
        else (holder.vram_estimate if holder is not None else None)
    )
    return {
        "namespace": namespace_of(group),
        "name": name_of(group),
        "active": decision.active_model,
        "phase": decision.phase.value,
        "reason": decision.reason,
        "message": decision.message,
        "gate": decision.blocked_by,
        "queue": [{"name": m.name, "queued": m.queued} for m in queued],
        "swaps": decision.swap_count,
        "lastSwapTime": timestamp(decision.last_swap_time),
        "nextChangeAt": format_rfc3339(decision.next_change_at),
        # docs/election.md 3, "Packing": every member on the card, the leader first.
        "holders": holders,
        # The budget and what the holders' footprints take; None when it sets no budget.
        "vram": None
        if budget is None
        else {
            "budgetBytes": budget,
            "usedBytes": used,
            # False: the controller has no --gpu-device-class; one member at a time.
            "sharedCard": packing is not None,
        },
    }


def model_deployment_row(
    view: ClusterView, md: dict[str, Any], membership: Membership, *, now: datetime
) -> dict[str, Any]:
    snapshot = observe.standalone_snapshot(view, md, membership)
    decision = decide_standalone(snapshot.state, now=now)
    state = snapshot.state
    return {
        "namespace": state.namespace,
        "name": state.name,
        "replicas": state.current_replicas,
        "desiredReplicas": decision.desired_replicas,
        "readyReplicas": state.ready_replicas,
        "minReplicas": state.min_replicas,
        "reason": decision.reason,
        "lastAccessTime": timestamp(state.last_access_time),
        # While in use, the idle timeout lapse: where it scales to minReplicas.
        "scalesDownAt": format_rfc3339(decision.next_change_at),
    }


# --- the text -------------------------------------------------------------------------


def _queued(entry: dict[str, Any]) -> str:
    # A member that drains still holds its pods (docs/election.md 1.6): say so.
    return f"{entry['name']} (draining)" if entry["reason"] == reasons.DRAINING else entry["name"]


def status_text(data: dict[str, Any], *, now: datetime, namespace: str | None) -> str:
    wide_ns = namespace is None
    blocks = []
    if data["sharedGroups"]:
        rows = [
            [
                *_ns(g, wide_ns),
                g["group"],
                g["holder"] or "-",
                g["phase"] or "-",
                g["reason"],
                ",".join(_queued(q) for q in g["queue"]) or "-",
                _until(g["cooldownEndsAt"], now),
                _lease(g["lease"], now),
                _next(g["next"], now),
            ]
            for g in data["sharedGroups"]
        ]
        headers = ["group", "holder", "phase", "reason", "queue", "cooldown", "lease", "next"]
        if any(g["vram"] for g in data["sharedGroups"]):
            headers.insert(4, "vram")
            for row, g in zip(rows, data["sharedGroups"], strict=True):
                row.insert(len(_ns(g, wide_ns)) + 4, _vram(g["vram"], g["holders"]))
        blocks.append("Shared groups:\n" + render_table(_ns_head(wide_ns) + headers, rows))
    if data["models"]:
        rows = [
            [
                *_ns(m, wide_ns),
                m["name"],
                m["phase"],
                f"{_num(m['replicas'])}->{m['desiredReplicas']}",
                m["reason"],
                age(parse_rfc3339(m["lastActiveTime"]), now=now),
                _next(m["next"], now),
            ]
            for m in data["models"]
        ]
        headers = ["model", "phase", "replicas", "reason", "last active", "next"]
        blocks.append("Models sharing no card:\n" + render_table(_ns_head(wide_ns) + headers, rows))
    if data["gpuGroups"]:
        rows = [
            [
                *_ns(g, wide_ns),
                g["name"],
                g["active"] or "-",
                g["phase"],
                g["reason"],
                ",".join(f"{q['name']}({q['queued']})" for q in g["queue"]) or "-",
                g["gate"] or "-",
                g["swaps"],
                age(parse_rfc3339(g["lastSwapTime"]), now=now),
            ]
            for g in data["gpuGroups"]
        ]
        headers = ["gpugroup", "active", "phase", "reason", "queue", "gate", "swaps", "last swap"]
        if any(g["vram"] for g in data["gpuGroups"]):
            headers.insert(4, "vram")
            for row, g in zip(rows, data["gpuGroups"], strict=True):
                row.insert(len(_ns(g, wide_ns)) + 4, _vram(g["vram"], g["holders"]))
        blocks.append("GPUGroups:\n" + render_table(_ns_head(wide_ns) + headers, rows))
    if data["modelDeployments"]:
        rows = [
            [
                *_ns(m, wide_ns),
                m["name"],
                f"{_num(m['replicas'])}->{m['desiredReplicas']}",
                m["readyReplicas"],
                m["reason"],
                age(parse_rfc3339(m["lastAccessTime"]), now=now),
                _scales_down(m, now),
            ]
            for m in data["modelDeployments"]
        ]
        headers = ["modeldeployment", "replicas", "ready", "reason", "last request", "scales down"]
        blocks.append(
            "ModelDeployments (standalone):\n" + render_table(_ns_head(wide_ns) + headers, rows)
        )
    if not blocks:
        return no_resources(namespace, "flexinfer resources")
    return "\n\n".join(blocks)


def _vram(vram: dict[str, Any] | None, holders: list[str]) -> str:
    """The budget's use (docs/election.md 1.7): `9.5/24GiB:chat,embed`, `?/24GiB` when
    the holder's footprint is unknown, `conflict` when members disagree on the budget,
    `one-at-a-time` when the cluster's pods cannot share a card."""
    if vram is None:
        return "-"
    if vram.get("conflict"):
        return "conflict"
    if vram.get("sharedCard") is False:
        return "one-at-a-time"
    used = "?" if vram["usedBytes"] is None else format_gib(vram["usedBytes"])
    shown = f"{used}/{format_gib(vram['budgetBytes'])}GiB"
    return f"{shown}:{','.join(holders)}" if len(holders) > 1 else shown


def _ns(row: dict[str, Any], wide: bool) -> list[Any]:
    return [row["namespace"]] if wide else []


def _ns_head(wide: bool) -> list[str]:
    return ["namespace"] if wide else []


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _until(value: str | None, now: datetime) -> str:
    when = parse_rfc3339(value)
    return "-" if when is None else until(when, now=now)


def _lease(lease: dict[str, Any] | None, now: datetime) -> str:
    if lease is None:
        return "-"
    expires = parse_rfc3339(lease["expiresAt"])
    tail = "no-ttl" if expires is None else until(expires, now=now).replace(" ", "-")
    return f"{lease['name']}({lease['owner'] or '-'},{tail})"


def _next(change: dict[str, Any] | None, now: datetime) -> str:
    if change is None:
        return "-"
    when = parse_rfc3339(change["at"])
    assert when is not None
    return f"{until(when, now=now)}: {change['what']}"


def _scales_down(row: dict[str, Any], now: datetime) -> str:
    when = parse_rfc3339(row["scalesDownAt"])
    if when is None or not row["desiredReplicas"]:
        return "-"
    return f"{until(when, now=now)} to {row['minReplicas']}"


# --- -w -------------------------------------------------------------------------------


def watch(
    target: Target,
    *,
    policy: Policy,
    fmt: str,
    shared_card: bool = False,
    device_class: str = "",
) -> int:
    """Follow the cluster with informers; print a block whenever what it shows changes."""
    view = ClusterView(source="cluster")
    changed = threading.Event()
    stop = threading.Event()

    def on_change(old: Any, new: Any) -> None:
        changed.set()

    informers = [
        Informer(
            target.api,
            resource,
            view.store(resource),
            namespace=target.namespace,
            on_change=on_change,
            label_selector=GPU_LEASE_LABEL if resource is CONFIG_MAPS else None,
        )
        for resource in WATCHED
    ]
    view.informers = informers
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for informer in informers:
            informer.start()
        wait_all(informers, timeout=30, attempted_only=True)
        _follow(
            view,
            policy=policy,
            fmt=fmt,
            namespace=target.namespace,
            changed=changed,
            stop=stop,
            shared_card=shared_card,
            device_class=device_class,
        )
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        for informer in informers:
            informer.stop()
    return OK


def _follow(
    view: ClusterView,
    *,
    policy: Policy,
    fmt: str,
    namespace: str | None,
    changed: threading.Event,
    stop: threading.Event,
    clock_now: Callable[[], datetime] = lambda: SystemClock().now(),
    shared_card: bool = False,
    device_class: str = "",
) -> None:
    shown: Any = None
    while not stop.is_set():
        changed.clear()
        now = clock_now()
        data = status_data(
            view, now=now, policy=policy, shared_card=shared_card, device_class=device_class
        )
        # Ages move every second; only what the block says counts as a change (the
        # table does not show `recorded`, the JSON does).
        hidden = {"at"} if fmt in ("json", "yaml") else {"at", "recorded"}
        comparable = {k: v for k, v in data.items() if k not in hidden}
        if comparable != shown:
            shown = comparable
            if fmt in ("json", "yaml"):
                emit(data, fmt=fmt, table="")
            else:
                sys.stdout.write(f"--- {clock(now)}\n")
                emit(data, fmt=fmt, table=status_text(data, now=now, namespace=namespace))
            sys.stdout.flush()
        changed.wait(WATCH_TICK)
