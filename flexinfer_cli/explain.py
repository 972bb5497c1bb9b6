"""`flexinfer explain KIND/NAME`: who holds the card, why, and what happens next.

The view (a one-shot listing of the live cluster, or manifests from `-f`) goes
through the controller's own snapshot functions (`flexinfer_k8s.observe`) and the
core's decisions (`flexinfer_core.explain`, `decide_gpu_group`, `decide_standalone`),
so what this prints is what the controller decides on that view; nothing here
judges anything. What-ifs are written into the view as the writes that would cause
them: `--demand MODEL` as the proxy's demand signal (`status.lastActiveTime`, a
GPUGroup's demand report, a ModelDeployment's `status.lastAccessTime`), `--lease
GROUP` as a GPULease, `--at` as the instant to decide at.

A dump replayed with `-f` may carry no Deployments or Pods: a Model without a
Deployment in the view then keeps the phase its status records (the controller
would derive it from its pods).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from flexinfer_cli.cluster import add_cluster_flags, read_view
from flexinfer_cli.output import (
    FORMATS,
    OK,
    CommandError,
    UsageError,
    clock,
    emit,
    human_duration,
    render_table,
    timestamp,
    until,
)
from flexinfer_cli.view import ClusterView
from flexinfer_core import (
    FlexinferError,
    MembershipKind,
    ModelState,
    Phase,
    Policy,
    decide_standalone,
    format_duration,
    parse_duration,
    policy_flags,
    policy_from_flags,
)
from flexinfer_core.annotations import (
    DemandReport,
    demand_annotation_key,
    demand_is_stale,
    format_demand,
    parse_demand,
)
from flexinfer_core.election import RuleCheck
from flexinfer_core.explain import (
    GroupExplanation,
    NextChange,
    explain_gpu_group_ahead,
    explain_group,
)
from flexinfer_core.group import CONDITION_PACKED
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s import observe
from flexinfer_k8s.convert_gpugroups import gpu_group_status
from flexinfer_k8s.convert_models import model_state_group
from flexinfer_k8s.decide_gpugroup import packs, sharing_state
from flexinfer_kube.clock import SystemClock
from flexinfer_kube.objects import name_of, namespace_of
from flexinfer_kube.resources import DEPLOYMENTS, GPU_GROUPS, GPU_LEASES, MODEL_DEPLOYMENTS, MODELS

KINDS = {
    "model": "model",
    "models": "model",
    "mdl": "model",
    "group": "group",
    "shared": "group",
    "gpugroup": "gpugroup",
    "gpugroups": "gpugroup",
    "modeldeployment": "modeldeployment",
    "modeldeployments": "modeldeployment",
    "md": "modeldeployment",
}
WHAT_IF_LEASE = "what-if"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "explain",
        help="why a model holds the card or waits, and what happens next",
        description="Run the controller's decision on the cluster (or on manifests) and "
        "print every rule in order, the winner, each member and what changes next.",
    )
    parser.add_argument(
        "target", metavar="KIND/NAME", help="model/NAME, group/NAME, gpugroup/NAME or md/NAME"
    )
    parser.add_argument(
        "--at",
        default=None,
        metavar="+DURATION|TIME",
        help="decide at this instant instead of now: +5m, -30s or an RFC 3339 time",
    )
    parser.add_argument(
        "--demand",
        action="append",
        default=[],
        metavar="MODEL",
        help="what if MODEL (or ModelDeployment) were asked for at that instant (repeatable)",
    )
    parser.add_argument(
        "--lease",
        default=None,
        metavar="GROUP",
        help="what if a GPU lease were taken on GROUP (a shared group)",
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        help="read objects from these files or directories (`-` for stdin) instead of a "
        "cluster; status fields are replayed as given",
    )
    parser.add_argument(
        "--changes",
        type=int,
        default=3,
        metavar="N",
        help="how many changes ahead to show (3); the search stops at the first new holder",
    )
    parser.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_policy_flags(parser)
    add_cluster_flags(parser, all_namespaces=False)
    parser.set_defaults(run=run)


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """The controller's election policy flags: explain must decide with the same ones."""
    group = parser.add_argument_group("election policy (same flags and defaults as the controller)")
    for flag in policy_flags():
        group.add_argument(
            flag.flag,
            dest=f"policy_{flag.attribute}",
            default=flag.default,
            metavar="DURATION",
            help=f"{flag.help}; default {flag.default}",
        )

    # Not an election timing but a setting the decision depends on all the same
    # (docs/election.md 1.7): whether a group with a VRAM budget may pack.
    group.add_argument(
        "--gpu-device-class",
        default="",
        metavar="NAME",
        help="as the controller's flag: set (the cluster has a DRA driver for its GPUs), a "
        "group with a VRAM budget packs; default empty: it runs one member at a time",
    )


def shared_card_from(args: argparse.Namespace) -> bool:
    """Whether the controller these flags describe lets a budgeted group pack."""
    return bool(device_class_from(args))


def device_class_from(args: argparse.Namespace) -> str:
    """The controller's `--gpu-device-class` these flags describe ("" when none)."""
    return str(getattr(args, "gpu_device_class", "") or "")


def policy_from(args: argparse.Namespace) -> Policy:
    return policy_from_flags(
        {flag.attribute: getattr(args, f"policy_{flag.attribute}") for flag in policy_flags()}
    )


def instant(text: str | None, *, now: datetime) -> datetime:
    """`--at`: a signed Go duration from now, or an RFC 3339 time."""
    if text is None:
        return now
    if text[:1] in "+-":
        delta = parse_duration(text[1:], field="--at")
        return now + delta if text[0] == "+" else now - delta
    parsed = parse_rfc3339(text)
    if parsed is None:
        raise UsageError(f"--at: {text!r} is neither +DURATION/-DURATION nor an RFC 3339 time")
    return parsed


def run(args: argparse.Namespace) -> int:
    kind, _, name = args.target.partition("/")
    if kind.lower() not in KINDS or not name:
        raise UsageError(
            f"{args.target!r}: give KIND/NAME with KIND one of model, group, gpugroup, "
            "modeldeployment (md)"
        )
    kind = KINDS[kind.lower()]
    if args.changes < 1:
        raise UsageError("--changes: must be at least 1")
    try:
        policy = policy_from(args)
        at = instant(args.at, now=SystemClock().now())
    except FlexinferError as error:
        raise UsageError(str(error)) from None
    view, namespace = read_view(args)
    apply_what_ifs(view, namespace, demand=args.demand, lease_group=args.lease, at=at)
    if kind == "gpugroup":
        data = explain_gpu_group(
            view,
            namespace,
            name,
            at=at,
            changes=args.changes,
            device_class=device_class_from(args),
        )
        text = gpu_group_text(data)
    elif kind == "modeldeployment":
        data = explain_model_deployment(
            view,
            namespace,
            name,
            at=at,
            changes=args.changes,
            device_class=device_class_from(args),
        )
        text = model_deployment_text(data)
    else:
        group = name if kind == "group" else model_group(view, namespace, name)
        data = explain_shared(
            view,
            namespace,
            group,
            model=name if kind == "model" else None,
            at=at,
            policy=policy,
            changes=args.changes,
            shared_card=shared_card_from(args),
        )
        text = shared_text(data, at=at)
    data["whatIf"] = {"demand": list(args.demand), "lease": args.lease}
    emit(data, fmt=args.output, table=text)
    return OK


# --- what-ifs, written into the view as the writes that would cause them -------------


def apply_what_ifs(
    view: ClusterView,
    namespace: str,
    *,
    demand: Sequence[str],
    lease_group: str | None,
    at: datetime,
) -> None:
    stamp = format_rfc3339(at)
    for name in demand:
        model = view.get(MODELS, namespace, name)
        md = view.get(MODEL_DEPLOYMENTS, namespace, name)
        if model is not None:
            _evolve(view, MODELS, model, status={"lastActiveTime": stamp})
        elif md is not None:
            # A GPUGroup member's demand is the proxy's report on the group.
            # Read afresh: an earlier --demand may have written this group's report.
            listed = [g for g in view.objects(GPU_GROUPS, namespace) if name in _members_of(g)]
            key = demand_annotation_key(name)
            for group in listed:
                # One more queued request on top of the proxy's last report.
                annotations = (group.get("metadata") or {}).get("annotations") or {}
                last = parse_demand(annotations.get(key))
                if last is None or demand_is_stale(last.reported_at, now=at):
                    last = DemandReport(queued=0)
                report = DemandReport(
                    queued=last.queued + 1,
                    oldest_waiting=last.oldest_waiting or at,
                    reported_at=at,
                )
                _evolve(view, GPU_GROUPS, group, annotations={key: format_demand(report)})
            _evolve(view, MODEL_DEPLOYMENTS, md, status={"lastAccessTime": stamp})
        else:
            raise UsageError(f"--demand: no Model or ModelDeployment {name!r} in {namespace}")
    if lease_group:
        lease = {
            "apiVersion": GPU_LEASES.api_version,
            "kind": GPU_LEASES.kind,
            "metadata": {"name": WHAT_IF_LEASE, "namespace": namespace},
            "spec": {"group": lease_group, "owner": WHAT_IF_LEASE},
        }
        view.store(GPU_LEASES).write_through(lease)


def _members_of(group: dict[str, Any]) -> list[str]:
    return [str(e.get("name")) for e in (group.get("spec") or {}).get("models") or []]


def _evolve(
    view: ClusterView,
    resource: Any,
    obj: dict[str, Any],
    *,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> None:
    changed = json.loads(json.dumps(obj))
    if status:
        changed.setdefault("status", {}).update(status)
    if annotations:
        changed.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
    # Replace, not write_through: the view's resourceVersions are the listing's.
    view.store(resource).forget(namespace_of(obj), name_of(obj))
    view.store(resource).write_through(changed)


# --- shared groups (and a Model that shares no card) ---------------------------------


def model_group(view: ClusterView, namespace: str, name: str) -> str:
    model = view.get(MODELS, namespace, name)
    if model is None:
        raise CommandError(f"Model {name!r} not found in namespace {namespace}")
    return model_state_group(model)


def explain_shared(
    view: ClusterView,
    namespace: str,
    group: str,
    *,
    model: str | None,
    at: datetime,
    policy: Policy,
    changes: int = 3,
    shared_card: bool = False,
) -> dict[str, Any]:
    if group:
        objs = view.shared_group_models(namespace, group)
        if not objs and model is None:
            raise CommandError(f"no Model of shared group {group!r} in namespace {namespace}")
    else:
        found = view.get(MODELS, namespace, model or "")
        objs = [found] if found is not None else []
    members = {name_of(m) for m in objs}
    departed = observe.departed_members(view, namespace, group, members=members) if group else set()
    snapshot = observe.shared_group_snapshot(view, namespace, group, objs, departed=departed)
    states = replay_recorded_phases(view, namespace, snapshot.states, objs)
    running = set(snapshot.running)
    if view.source == "manifests":
        running |= {s.name for s in states if s.phase in (Phase.READY, Phase.LOADING)}
    try:
        explanation = explain_group(
            states,
            now=at,
            leases=snapshot.leases,
            unreadable_lease_sources=snapshot.unreadable_lease_sources,
            policy=policy,
            running=running,
            limit=changes,
            shared_card=shared_card,
        )
    except FlexinferError as error:
        raise CommandError(str(error)) from None
    return shared_data(explanation, states, snapshot=snapshot, at=at, source=view.source)


def replay_recorded_phases(
    view: ClusterView, namespace: str, states: Sequence[ModelState], objs: Sequence[dict[str, Any]]
) -> list[ModelState]:
    """From manifests, a Model with no Deployment in the view keeps its recorded phase."""
    if view.source != "manifests":
        return list(states)
    recorded = {name_of(o): (o.get("status") or {}).get("phase") for o in objs}
    out = []
    for state in states:
        phase = recorded.get(state.name)
        if view.get(DEPLOYMENTS, namespace, state.name) is None and phase in set(Phase):
            state = attrs.evolve(state, phase=Phase(phase))
        out.append(state)
    return out


def shared_data(
    explanation: GroupExplanation,
    states: Sequence[ModelState],
    *,
    snapshot: observe.SharedGroupSnapshot,
    at: datetime,
    source: str,
) -> dict[str, Any]:
    decision = explanation.decision
    observed = {s.name: s for s in states}
    lease = decision.election.lease
    pending = {c.name: c for c in decision.changes(states)}
    members = []
    for member in decision.members:
        model = observed[member.name]
        ready = next((c for c in member.conditions if c.type == "Ready"), None)
        change = pending.get(member.name)
        members.append(
            {
                "name": member.name,
                "priority": model.priority,
                "phase": member.phase.value,
                "state": member.state.value,
                "queuePosition": member.queue_position,
                "preemptedBy": member.preempted_by,
                "desiredReplicas": member.desired_replicas,
                "replicas": model.replicas,
                "reason": member.reason,
                "message": member.message,
                "readyReason": ready.reason if ready is not None else None,
                "lastActiveTime": timestamp(model.last_active),
                "preemptedAt": timestamp(member.preempted_at),
                "runnable": model.runnable,
                "pendingWrites": [
                    what
                    for what, due in (
                        # A holder's progress toward serving waits to be written
                        # (the controller's --status-coalesce-seconds).
                        (
                            "progress" if change is not None and change.progress else "status",
                            change is not None and change.status,
                        ),
                        ("replicas", change is not None and change.replicas),
                    )
                    if due
                ],
            }
        )
    return {
        "kind": "SharedGroup" if decision.group else "Model",
        "source": source,
        "namespace": snapshot.namespace,
        "group": decision.group or None,
        "at": format_rfc3339(at),
        "leader": decision.leader,
        "reason": decision.reason,
        "message": decision.message,
        "rules": rules_json(explanation.rules),
        "drain": explanation.drain,
        "packing": explanation.packing,
        "members": members,
        "lease": None
        if lease is None
        else {
            "name": lease.name,
            "owner": lease.owner,
            "node": lease.node,
            "source": lease.source.value,
            "expiresAt": timestamp(lease.expires_at),
        },
        "leasesUnreadable": list(snapshot.unreadable_lease_sources),
        "next_change_at": format_rfc3339(decision.next_change_at),
        "next": changes_json(explanation.upcoming),
    }


def rules_json(rules: Sequence[RuleCheck]) -> list[dict[str, Any]]:
    return [{"number": r.number, "rule": r.name, "applied": r.applied, "why": r.why} for r in rules]


def changes_json(upcoming: Sequence[NextChange]) -> list[dict[str, Any]]:
    return [
        {
            "at": format_rfc3339(change.at),
            "what": change.what,
            "when": change.when,
            "leader": change.leader,
            "reason": change.reason,
            "message": change.message,
            "assumesDemand": list(change.assumes_demand),
        }
        for change in upcoming
    ]


def shared_text(data: dict[str, Any], *, at: datetime) -> str:
    title = (
        f"Group {data['group']} (namespace {data['namespace']})"
        if data["group"]
        else f"Model {data['members'][0]['name'] if data['members'] else '?'} "
        f"(namespace {data['namespace']}, shares no card)"
    )
    lines = [f"{title}, at {clock(at)}"]
    leader = data["leader"] or "none"
    lines.append(f"Holder: {leader} ({data['reason']}): {data['message']}")
    if data.get("drain"):
        lines.append(f"Drain (docs/election.md 1.6): {data['drain']}")
    if data.get("packing"):
        lines.append(f"Packing (docs/election.md 1.7): {data['packing']}")
    lease = data["lease"]
    if lease is not None:
        expires = parse_rfc3339(lease["expiresAt"])
        ends = (
            "no expiry"
            if expires is None
            else f"expires {clock(expires)} ({until(expires, now=at)})"
        )
        lines.append(
            f"Lease: {lease['name']} ({lease['source']}) held by {lease['owner'] or '-'}"
            f" on {lease['node'] or '-'}, {ends}"
        )
    elif data["group"]:
        lines.append("Lease: none")
    if data["leasesUnreadable"]:
        lines.append(f"Leases unreadable: {', '.join(data['leasesUnreadable'])} (failing open)")
    lines += ["", "Rules (docs/election.md 1.2, in order):"]
    rules = [
        [r["number"], r["rule"], "DECIDED" if r["applied"] else "-", r["why"]]
        for r in data["rules"]
    ]
    lines.append(render_table(["#", "rule", "applied", "why"], rules))
    lines += ["", "Members:"]
    rows = [
        [
            m["name"],
            m["priority"],
            m["phase"],
            m["state"],
            m["queuePosition"],
            _replicas(m),
            m["reason"],
            _ago(m["lastActiveTime"], at),
            m["message"],
        ]
        for m in data["members"]
    ]
    lines.append(
        render_table(
            [
                "name",
                "priority",
                "phase",
                "state",
                "queue",
                "replicas",
                "reason",
                "last active",
                "message",
            ],
            rows,
        )
    )
    pending = [
        f"{m['name']} ({', '.join(m['pendingWrites'])})"
        for m in data["members"]
        if m["pendingWrites"]
    ]
    if pending and data["source"] == "cluster":
        lines.append(
            "Not written yet: " + "; ".join(pending) + " (the controller applies this on its "
            "next reconcile; if it stays, see `flexinfer doctor`)"
        )
    lines += ["", "Next:"]
    lines += _next_lines(data, at=at)
    return "\n".join(lines)


def _next_lines(data: dict[str, Any], *, at: datetime) -> list[str]:
    out = []
    for change in data["next"]:
        when = parse_rfc3339(change["at"])
        assert when is not None
        out.append(
            f"  {clock(when)} ({until(when, now=at)}): {change['what']}, when {change['when']}"
        )
        out.append(f"    then {change['reason']}: {change['message']}")
    assumed = sorted({name for c in data["next"] for name in c["assumesDemand"]})
    if not data["next"]:
        out.append("  nothing changes on its own; the next request, pod or lease decides")
    if assumed:
        out.append(f"  (assuming requests for {', '.join(assumed)} keep coming)")
    timer = parse_rfc3339(data["next_change_at"])
    if timer is not None:
        out.append(f"Controller timer (next_change_at): {clock(timer)} ({until(timer, now=at)})")
    return out


def _replicas(member: dict[str, Any]) -> str:
    """`1->0`: the Deployment's replicas now and what the decision wants (one number when
    they agree, or when there is no Deployment yet)."""
    have, want = member["replicas"], member["desiredReplicas"]
    return str(want) if have is None or have == want else f"{have}->{want}"


def _ago(value: str | None, at: datetime) -> str:
    when = parse_rfc3339(value)
    return "-" if when is None else human_duration(at - when) + " ago"


# --- GPUGroups and standalone ModelDeployments ---------------------------------------


def explain_gpu_group(
    view: ClusterView,
    namespace: str,
    name: str,
    *,
    at: datetime,
    changes: int = 3,
    device_class: str = "",
) -> dict[str, Any]:
    """The GPUGroup decided as the controller decides it (`decide_gpu_group_snapshot`:
    packed with `device_class` and a budget), section 3's steps, each member's seat
    and the changes ahead."""
    group = view.get(GPU_GROUPS, namespace, name)
    if group is None:
        raise CommandError(f"GPUGroup {name!r} not found in namespace {namespace}")
    snapshot = observe.gpu_group_snapshot(view, group)
    state = sharing_state(snapshot, device_class)
    explanation = explain_gpu_group_ahead(
        state, now=at, limit=changes, shared_card=packs(snapshot, device_class)
    )
    decision = explanation.decision
    packing = explanation.packing
    # The condition `Packed` the controller writes for this decision, in its words.
    written = gpu_group_status(group, decision, now=at, state=state, packing=packing)
    packed = next((c for c in written["conditions"] if c.get("type") == CONDITION_PACKED), None)
    return {
        "kind": "GPUGroup",
        "namespace": namespace,
        "group": name,
        "at": format_rfc3339(at),
        "leader": decision.active_model,
        # Every member on the card, the leader first (as the controller scales them).
        "holders": list(packing.holders)
        if packing is not None and packing.used
        else sorted(explanation.holders),
        "reason": decision.reason,
        "message": decision.message,
        "action": decision.action.value,
        "phase": decision.phase.value,
        "blockedBy": decision.blocked_by,
        "packed": None
        if packed is None
        else {
            "status": packed["status"],
            "reason": packed["reason"],
            "message": packed["message"],
        },
        "vram": written.get("vram"),
        "rules": rules_json(explanation.rules),
        "members": [
            {
                "name": s.name,
                "state": s.state.value,
                "queuedRequests": s.queued_requests,
                "queuedSince": timestamp(s.queued_since),
                "desiredReplicas": decision.replicas_for(s.name),
                "replicas": snapshot.replicas.get(s.name),
                "preemptedAt": timestamp(s.preempted_at),
                "preemptedBy": s.preempted_by or None,
                # Why it is or is not on the card beside the leader (docs/election.md 3,
                # "Packing"); None when the members take turns.
                "seat": None
                if packing is None
                else {
                    "admitted": packing.seat(s.name).admitted,
                    "reason": packing.seat(s.name).reason,
                    "message": packing.seat(s.name).message,
                },
            }
            for s in decision.member_statuses
        ],
        "next_change_at": format_rfc3339(decision.next_change_at),
        "next": changes_json(explanation.upcoming),
    }


def gpu_group_text(data: dict[str, Any]) -> str:
    at = parse_rfc3339(data["at"])
    assert at is not None
    # The card column only when the group packs (its members then have seats).
    seats = any(m["seat"] is not None for m in data["members"])
    lines = [
        f"GPUGroup {data['group']} (namespace {data['namespace']}), at {clock(at)}",
        f"Holder: {data['leader'] or 'none'} ({data['reason']}, {data['action']}, phase "
        f"{data['phase']}): {data['message']}",
        *_packed_lines(data),
        "",
        "Steps (docs/election.md 3, in order):",
        render_table(
            ["#", "step", "applied", "why"],
            [
                [r["number"], r["rule"], "DECIDED" if r["applied"] else "-", r["why"]]
                for r in data["rules"]
            ],
        ),
        "",
        "Members:",
        render_table(
            ["name", "state", "queued", "queued since", "replicas", "preempted by"]
            + (["card"] if seats else []),
            [
                [
                    m["name"],
                    m["state"],
                    m["queuedRequests"],
                    _ago(m["queuedSince"], at),
                    _replicas(m),
                    m["preemptedBy"],
                    *([_seat_words(m["seat"])] if seats else []),
                ]
                for m in data["members"]
            ],
        ),
    ]
    lines += ["", "Next (with no new request):"]
    for change in data["next"]:
        when = parse_rfc3339(change["at"])
        assert when is not None
        lines.append(f"  {clock(when)} ({until(when, now=at)}): {change['what']}: {change['when']}")
    if not data["next"]:
        lines.append("  nothing changes on its own; the next request or pod decides")
    timer = parse_rfc3339(data["next_change_at"])
    if timer is not None:
        lines.append(f"Controller timer (next_change_at): {clock(timer)} ({until(timer, now=at)})")
    return "\n".join(lines)


def _packed_lines(data: dict[str, Any]) -> list[str]:
    """The condition `Packed` the controller writes (a group that sets a budget)."""
    packed = data.get("packed")
    if not packed:
        return []
    holders = ", ".join(data.get("holders") or []) or "none"
    return [
        f"Packing (docs/election.md 3): {packed['reason']}: {packed['message']}",
        f"On the card: {holders}",
    ]


def _seat_words(seat: dict[str, Any] | None) -> str:
    """A member's seat: `on (CoResident): fits: 9.5 of 24 GiB used`, or why not."""
    if seat is None:
        return "-"
    where = "on" if seat["admitted"] else "off"
    return f"{where} ({seat['reason']}): {seat['message']}" if seat["message"] else where


def explain_model_deployment(
    view: ClusterView,
    namespace: str,
    name: str,
    *,
    at: datetime,
    changes: int = 3,
    device_class: str = "",
) -> dict[str, Any]:
    md = view.get(MODEL_DEPLOYMENTS, namespace, name)
    if md is None:
        raise CommandError(f"ModelDeployment {name!r} not found in namespace {namespace}")
    membership = view.membership(md)
    if membership.kind is MembershipKind.MEMBER and membership.group:
        data = explain_gpu_group(
            view, namespace, membership.group, at=at, changes=changes, device_class=device_class
        )
        data["member"] = name
        return data
    # Standalone, or held at zero by a membership conflict (its reason says which).
    snapshot = observe.standalone_snapshot(view, md, membership)
    decision = decide_standalone(snapshot.state, now=at)
    state = snapshot.state
    return {
        "kind": "ModelDeployment",
        "namespace": namespace,
        "name": name,
        "at": format_rfc3339(at),
        "reason": decision.reason,
        "message": decision.message,
        "desiredReplicas": decision.desired_replicas,
        "replicas": state.current_replicas,
        "readyReplicas": state.ready_replicas,
        "lastAccessTime": timestamp(state.last_access_time),
        "idleTimeout": format_duration(state.idle_timeout),
        "next_change_at": format_rfc3339(decision.next_change_at),
        "next": [],
    }


def model_deployment_text(data: dict[str, Any]) -> str:
    if data["kind"] == "GPUGroup":
        member = next((m for m in data["members"] if m["name"] == data["member"]), None)
        seat = member["seat"] if member is not None else None
        card = "" if seat is None else f"\nOn the card beside the leader: {_seat_words(seat)}"
        return (
            f"ModelDeployment {data['member']} is a member of GPUGroup {data['group']}{card}\n\n"
            + gpu_group_text(data)
        )
    at = parse_rfc3339(data["at"])
    assert at is not None
    replicas = data["replicas"] if data["replicas"] is not None else "-"
    lines = [
        f"ModelDeployment {data['name']} (namespace {data['namespace']}, standalone), "
        f"at {clock(at)}",
        f"Replicas: {replicas} -> {data['desiredReplicas']} ({data['reason']}): {data['message']}",
        f"Last request: {_ago(data['lastAccessTime'], at)} (idle timeout {data['idleTimeout']})",
    ]
    timer = parse_rfc3339(data["next_change_at"])
    lines += ["", "Next:"]
    lines.append(
        f"  {clock(timer)} ({until(timer, now=at)}): the idle timeout lapses"
        if timer is not None
        else "  nothing changes on its own; the next request decides"
    )
    return "\n".join(lines)
