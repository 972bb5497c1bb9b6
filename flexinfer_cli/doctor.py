"""`flexinfer doctor`: the troubleshooting cases of the docs, as checks on the cluster.

Each check reads one listing of the cluster (the controller's own view and
snapshot functions, the core's decisions) and reports findings, each with the
object, what is wrong and the fix in one sentence:

- runnable-member: a shared group (or GPUGroup) in which no member can run;
- priority-gate: a model that can never take the card, because a higher-priority
  member of its group runs without demand (`minReplicas` ≥ 1 or serverless off);
- swap-loop: a group that swapped again and again in the recent Events;
- lease-owner: a GPU lease whose finetune Job is gone or finished, one that expired
  without being released, or a hand-made one with no TTL;
- memory-cache: a Memory ModelCache that nothing uses (its RAM copy stays on the
  node) or whose copy failed;
- demand-reaches-controller: Models whose status the controller never wrote, demand
  it has not acted on, or a proxy that is not allowed to record demand;
- gpu-node-label: a node with `amd.com/gpu` or `nvidia.com/gpu` capacity without the
  `flexinfer.ai/gpu.vendor` label the docs' manifests select on (a fail when a resource
  here selects on it, since its pods then match no node).

A `fail` finding makes the exit code 1; a `warn` does not. Reads only (the proxy
check asks the API server with a SubjectAccessReview, which writes nothing).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import attrs

from flexinfer_cli.cluster import Target, add_cluster_flags, connect, list_cluster
from flexinfer_cli.explain import (
    add_policy_flags,
    device_class_from,
    policy_from,
    shared_card_from,
)
from flexinfer_cli.nodes import VENDOR_LABEL, plan_labels
from flexinfer_cli.output import FAILED, FORMATS, OK, UsageError, emit, timestamp
from flexinfer_cli.view import ClusterView
from flexinfer_core import (
    FlexinferError,
    ModelState,
    Phase,
    Policy,
    decide_group,
    format_duration,
    parse_duration,
)
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s import observe
from flexinfer_k8s.convert_leases import gpu_lease_from_k8s
from flexinfer_k8s.convert_models import model_cache_ref, model_state_group
from flexinfer_k8s.decide_gpugroup import decide_gpu_group_snapshot
from flexinfer_k8s.reconcile_cache import job_phase
from flexinfer_k8s.render.finetune import job_name
from flexinfer_kube.clock import SystemClock
from flexinfer_kube.kubeapi import KubeApi, KubeError
from flexinfer_kube.objects import get_path, name_of
from flexinfer_kube.resources import (
    EVENTS,
    GPU_GROUPS,
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    NODES,
    SERVICE_ACCOUNTS,
    SUBJECT_ACCESS_REVIEWS,
    Resource,
)

CONTROLLER = "flexinfer-controller"
# A shared group's handover has one Event: `Preempted` on the Model that was serving,
# or `Promoted` on the new holder when none was; a GPUGroup's is `Swap` or `Start`.
MODEL_SWAP_REASONS = frozenset({"Promoted", "Preempted"})
SWAP_REASONS = MODEL_SWAP_REASONS | {"Swap", "Start"}


@attrs.frozen
class Finding:
    check: str
    severity: str  # "fail" or "warn"
    object: str
    namespace: str
    message: str
    fix: str


@attrs.frozen
class Settings:
    now: datetime
    policy: Policy
    grace: timedelta
    swap_window: timedelta
    max_swaps: int
    proxy_account: str
    # As the controller's --gpu-device-class: a group with a VRAM budget may pack.
    shared_card: bool = False
    # The controller's --gpu-device-class itself: with it a budgeted GPUGroup packs.
    device_class: str = ""


CHECKS: tuple[tuple[str, str], ...] = (
    ("runnable-member", "every group has a member that can run"),
    ("priority-gate", "every model can win its group's card"),
    ("swap-loop", "no group swaps over and over"),
    ("lease-owner", "every GPU lease has a running owner and a TTL"),
    ("memory-cache", "every Memory cache is used and complete"),
    ("demand-reaches-controller", "demand reaches the controller and it acts on it"),
    ("gpu-node-label", "every GPU node carries flexinfer.ai/gpu.vendor"),
)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "doctor",
        help="the troubleshooting cases as checks, each finding with its fix",
        description="Check the cluster for the troubleshooting cases of the docs; exit 1 "
        "when a check fails.",
    )
    parser.add_argument(
        "--grace",
        default="30s",
        help="how long the controller may take to act before it counts as not acting (30s)",
    )
    parser.add_argument(
        "--swap-window", default="30m", help="how far back swap-loop counts swaps (30m)"
    )
    parser.add_argument(
        "--max-swaps", type=int, default=6, help="swaps in that window that make a loop (6)"
    )
    parser.add_argument(
        "--proxy-service-account",
        default="flexinfer-system/flexinfer-proxy",
        metavar="NAMESPACE/NAME",
        help="the proxy's ServiceAccount, whose right to record demand is checked",
    )
    parser.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_policy_flags(parser)
    add_cluster_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = Settings(
            now=SystemClock().now(),
            policy=policy_from(args),
            grace=parse_duration(args.grace, field="--grace"),
            swap_window=parse_duration(args.swap_window, field="--swap-window"),
            max_swaps=args.max_swaps,
            proxy_account=args.proxy_service_account,
            shared_card=shared_card_from(args),
            device_class=device_class_from(args),
        )
    except FlexinferError as error:
        raise UsageError(str(error)) from None
    if "/" not in settings.proxy_account:
        raise UsageError("--proxy-service-account: give NAMESPACE/NAME")
    if settings.max_swaps < 1:
        raise UsageError("--max-swaps: must be at least 1")
    target = connect(args)
    view = list_cluster(target.api, target.namespace)
    events = _list(target.api, EVENTS, target.namespace)
    findings = diagnose(view, events, target=target, settings=settings)
    data = report(findings)
    emit(data, fmt=args.output, table=report_text(data))
    return FAILED if data["failed"] else OK


def _list(api: KubeApi, resource: Resource, namespace: str | None) -> list[dict[str, Any]]:
    try:
        return list(api.list(resource, namespace).get("items") or [])
    except KubeError:
        return []


def diagnose(
    view: ClusterView, events: list[dict[str, Any]], *, target: Target, settings: Settings
) -> list[Finding]:
    findings: list[Finding] = []
    for namespace in view.namespaces():
        groups = _shared_groups(view, namespace, settings=settings)
        findings += runnable_member(view, namespace, groups, settings=settings)
        findings += priority_gate(namespace, groups)
        findings += swap_loop(view, namespace, events, settings=settings)
        findings += lease_owner(view, namespace, settings=settings)
        findings += memory_cache(view, namespace)
        findings += demand_reaches_controller(view, namespace, groups, settings=settings)
        findings += proxy_can_record_demand(target.api, namespace, settings=settings)
    findings += gpu_node_label(view, _list(target.api, NODES, None))
    return findings


def report(findings: Iterable[Finding]) -> dict[str, Any]:
    findings = list(findings)
    checks = []
    for name, ok_text in CHECKS:
        mine = [f for f in findings if f.check == name]
        status = "fail" if any(f.severity == "fail" for f in mine) else "warn" if mine else "ok"
        checks.append(
            {
                "check": name,
                "status": status,
                "summary": ok_text,
                "findings": [attrs.asdict(f) for f in mine],
            }
        )
    return {
        "checks": checks,
        "failed": sum(1 for f in findings if f.severity == "fail"),
        "warnings": sum(1 for f in findings if f.severity == "warn"),
    }


def report_text(data: dict[str, Any]) -> str:
    lines = []
    for check in data["checks"]:
        if check["status"] == "ok":
            lines.append(f"ok    {check['check']}: {check['summary']}")
            continue
        for finding in check["findings"]:
            label = "FAIL" if finding["severity"] == "fail" else "warn"
            lines.append(
                f"{label:<5} {check['check']}: {finding['namespace']}/{finding['object']}: "
                f"{finding['message']}"
            )
            lines.append(f"      fix: {finding['fix']}")
    lines.append("")
    lines.append(f"{data['failed']} failed, {data['warnings']} warning(s)")
    return "\n".join(lines)


# --- the shared groups as the controller sees them -------------------------------------


@attrs.frozen
class GroupView:
    namespace: str
    group: str
    snapshot: observe.SharedGroupSnapshot

    @property
    def states(self) -> tuple[ModelState, ...]:
        return self.snapshot.states


def _shared_groups(view: ClusterView, namespace: str, *, settings: Settings) -> list[GroupView]:
    out = []
    names = sorted({model_state_group(m) for m in view.objects(MODELS, namespace)})
    for group in names:
        if not group:
            continue
        objs = view.shared_group_models(namespace, group)
        members = {name_of(m) for m in objs}
        departed = observe.departed_members(view, namespace, group, members=members)
        try:
            snapshot = observe.shared_group_snapshot(
                view, namespace, group, objs, departed=departed
            )
        except FlexinferError:
            continue  # a Model the core refuses shows in its own status, not here
        out.append(GroupView(namespace, group, snapshot))
    return out


# --- the checks ---------------------------------------------------------------------------


def runnable_member(
    view: ClusterView, namespace: str, groups: list[GroupView], *, settings: Settings
) -> list[Finding]:
    findings = []
    for group in groups:
        if any(state.runnable for state in group.states):
            continue
        why = ", ".join(
            f"{s.name} ({'Failed' if s.phase is Phase.FAILED else 'cache not ready'})"
            for s in group.states
        )
        findings.append(
            Finding(
                "runnable-member",
                "fail",
                f"group/{group.group}",
                namespace,
                f"no member can run: {why}; nothing in the group serves",
                "Fix the failed member (kubectl describe model NAME; its pod's logs) or make its "
                "ModelCache ready (flexinfer cache status).",
            )
        )
    for obj in view.objects(GPU_GROUPS, namespace):
        snapshot = observe.gpu_group_snapshot(view, obj)
        if not any(m.exists for m in snapshot.state.members):
            listed = ", ".join(snapshot.members) or "none"
            findings.append(
                Finding(
                    "runnable-member",
                    "fail",
                    f"gpugroup/{name_of(obj)}",
                    namespace,
                    f"no member ModelDeployment exists (listed: {listed})",
                    "Create the ModelDeployments spec.models names, or fix the names in the "
                    "GPUGroup.",
                )
            )
    return findings


def priority_gate(namespace: str, groups: list[GroupView]) -> list[Finding]:
    findings = []
    for group in groups:
        always_on = [
            s
            for s in group.states
            if s.runnable and (s.serverless.min_replicas >= 1 or not s.serverless.enabled)
        ]
        for model in group.states:
            blockers = [h for h in always_on if h.priority > model.priority]
            if not blockers:
                continue
            top = max(blockers, key=lambda h: (h.priority, h.name))
            why = (
                "serverless.enabled is false"
                if not top.serverless.enabled
                else f"minReplicas {top.serverless.min_replicas}"
            )
            findings.append(
                Finding(
                    "priority-gate",
                    "fail",
                    f"model/{model.name}",
                    namespace,
                    f"{model.name} (priority {model.priority}) can never take the card of group "
                    f"{group.group}: {top.name} (priority {top.priority}) runs without demand "
                    f"({why}) and a lower priority never preempts a Ready leader",
                    f"Raise {model.name}'s spec.gpu.priority above {top.priority}, or set "
                    f"{top.name}'s spec.serverless.minReplicas to 0 so it yields when idle.",
                )
            )
    return findings


def swap_loop(
    view: ClusterView, namespace: str, events: list[dict[str, Any]], *, settings: Settings
) -> list[Finding]:
    since = settings.now - settings.swap_window
    counts: Counter[tuple[str, str]] = Counter()
    for event in events:
        if get_path(event, "source", "component") != CONTROLLER:
            continue
        if event.get("reason") not in SWAP_REASONS:
            continue
        when = parse_rfc3339(event.get("lastTimestamp") or event.get("eventTime"))
        involved = event.get("involvedObject") or {}
        if when is None or when < since or involved.get("namespace") != namespace:
            continue
        name = str(involved.get("name") or "")
        if involved.get("kind") == MODELS.kind and event.get("reason") in MODEL_SWAP_REASONS:
            model = view.get(MODELS, namespace, name)
            group = model_state_group(model) if model is not None else ""
            if group:
                counts[("group", group)] += int(event.get("count") or 1)
        elif involved.get("kind") == GPU_GROUPS.kind:
            counts[("gpugroup", name)] += int(event.get("count") or 1)
    findings = []
    window = _duration(settings.swap_window)
    for (kind, name), swaps in sorted(counts.items()):
        if swaps < settings.max_swaps:
            continue
        fix = (
            "Raise spec.gpu.swapCooldown (the group's largest applies) so a swap holds the "
            "group longer, or give the models different priorities so one yields."
            if kind == "group"
            else "Raise spec.antiThrashing.cooldownAfterPreemptionSeconds and "
            "minimumRunDurationSeconds (or requestQueueThreshold) so a swap holds longer."
        )
        findings.append(
            Finding(
                "swap-loop",
                "fail",
                f"{kind}/{name}",
                namespace,
                f"swapped {swaps} times in the last {window}",
                fix,
            )
        )
    return findings


def lease_owner(view: ClusterView, namespace: str, *, settings: Settings) -> list[Finding]:
    findings = []
    for obj in view.objects(GPU_LEASES, namespace):
        lease = gpu_lease_from_k8s(obj)
        if lease is None:
            continue
        name = f"gpulease/{lease.name}"
        expired = lease.expires_at is not None and lease.expires_at <= settings.now
        owners = [
            r
            for r in get_path(obj, "metadata", "ownerReferences") or []
            if r.get("kind") == MODEL_CACHES.kind
        ]
        if expired:
            findings.append(
                Finding(
                    "lease-owner",
                    "warn",
                    name,
                    namespace,
                    f"expired at {timestamp(lease.expires_at)} and was never released (it parks "
                    f"nothing now, but hides whether group {lease.group} is meant to be free)",
                    f"Delete it: flexinfer lease release {lease.group} --name {lease.name} "
                    f"--force -n {namespace}.",
                )
            )
            continue
        for owner in owners:
            cache_name = str(owner.get("name") or "")
            job = view.get(JOBS, namespace, job_name(cache_name))
            phase = job_phase(job)
            if not phase.terminal and job is not None:
                continue
            state = "does not exist" if job is None else phase.value.lower()
            findings.append(
                Finding(
                    "lease-owner",
                    "fail",
                    name,
                    namespace,
                    f"parks group {lease.group}, but its finetune Job {job_name(cache_name)} "
                    f"(ModelCache {cache_name}) {state}",
                    f"The controller releases it when it reconciles ModelCache {cache_name}; if "
                    f"it stays, check the controller, or run flexinfer lease release {lease.group} "
                    f"--name {lease.name} --force -n {namespace}.",
                )
            )
        if not owners and lease.expires_at is None:
            findings.append(
                Finding(
                    "lease-owner",
                    "warn",
                    name,
                    namespace,
                    f"held by {lease.owner or '-'} with no expiresAt and no owner: it parks group "
                    f"{lease.group} until someone deletes it",
                    f"Give it a TTL (flexinfer lease acquire {lease.group} --owner "
                    f"{lease.owner or 'NAME'} --ttl 1h) or delete it when done.",
                )
            )
    return findings


def memory_cache(view: ClusterView, namespace: str) -> list[Finding]:
    used = {model_cache_ref(m) for m in view.objects(MODELS, namespace)} | {
        str(get_path(md, "spec", "modelCacheRef") or "")
        for md in view.objects(MODEL_DEPLOYMENTS, namespace)
    }
    findings = []
    for obj in view.objects(MODEL_CACHES, namespace):
        if get_path(obj, "spec", "storageStrategy") != "Memory":
            continue
        name = name_of(obj)
        path = get_path(obj, "status", "path") or f"/dev/shm/flexinfer/{namespace}/{name}"
        node = (get_path(obj, "spec", "nodeSelector") or {}).get("kubernetes.io/hostname")
        where = f" on node {node}" if node else " on the nodes that served it"
        if get_path(obj, "status", "phase") == "Failed":
            findings.append(
                Finding(
                    "memory-cache",
                    "fail",
                    f"modelcache/{name}",
                    namespace,
                    f"its copy failed: {get_path(obj, 'status', 'message') or 'no message'}",
                    f"Read kubectl describe modelcache {name} and its Job's logs, fix the source "
                    "or node, then delete and re-create the ModelCache to copy again.",
                )
            )
        elif name not in used:
            findings.append(
                Finding(
                    "memory-cache",
                    "warn",
                    f"modelcache/{name}",
                    namespace,
                    f"no Model or ModelDeployment uses it; its RAM copy ({path}){where} holds "
                    "memory for nothing",
                    f"Reference it (spec.cache.modelCacheRef) or delete it and, on the node, "
                    f"rm -rf {path} (the controller never deletes host files).",
                )
            )
    return findings


def demand_reaches_controller(
    view: ClusterView, namespace: str, groups: list[GroupView], *, settings: Settings
) -> list[Finding]:
    findings = []
    late = settings.now - settings.grace
    for obj in view.objects(MODELS, namespace):
        created = parse_rfc3339(get_path(obj, "metadata", "creationTimestamp"))
        if get_path(obj, "status", "observedGeneration") is None and (
            created is None or created <= late
        ):
            findings.append(
                Finding(
                    "demand-reaches-controller",
                    "fail",
                    f"model/{name_of(obj)}",
                    namespace,
                    "the controller has never written this Model's status",
                    "Start the controller, or let it watch this namespace (--namespace), and "
                    "read its log: kubectl -n flexinfer-system logs deploy/flexinfer-controller.",
                )
            )
    for group in groups:
        snapshot = group.snapshot
        decision = decide_group(
            snapshot.states,
            now=settings.now,
            leases=snapshot.leases,
            unreadable_lease_sources=snapshot.unreadable_lease_sources,
            policy=settings.policy,
            running=snapshot.running,
            shared_card=settings.shared_card,
        )
        # A holder's progress toward serving is the controller's to hold back a while.
        pending = {
            c.name
            for c in decision.changes(group.states)
            if (c.status and not c.progress) or c.replicas
        }
        for state in group.states:
            if (
                state.name in pending
                and state.last_active is not None
                and state.last_active <= late
                and state.last_active >= settings.now - settings.policy.demand_window
            ):
                member = decision.member(state.name)
                findings.append(
                    Finding(
                        "demand-reaches-controller",
                        "fail",
                        f"model/{state.name}",
                        namespace,
                        f"demanded at {format_rfc3339(state.last_active)}, but the controller "
                        f"has not acted: it should be {member.state.value} with "
                        f"{member.desired_replicas} replica(s) ({member.reason})",
                        "Check the controller is running and leading (kubectl -n flexinfer-system "
                        "logs deploy/flexinfer-controller) and that it runs with the same "
                        "--demand-window as given here.",
                    )
                )
    for obj in view.objects(GPU_GROUPS, namespace):
        gpu_group = observe.gpu_group_snapshot(view, obj)
        # As the controller decides it: a packed group may keep a seated member as its
        # leader where section 3 alone would idle it (docs/election.md 3, "Packing").
        _, outcome = decide_gpu_group_snapshot(
            gpu_group, device_class=settings.device_class, now=settings.now
        )
        wanted = outcome.decision
        oldest = [m.oldest_waiting for m in gpu_group.state.members if m.oldest_waiting]
        recorded = get_path(obj, "status", "activeModel") or None
        if oldest and min(oldest) <= late and wanted.active_model != recorded:
            findings.append(
                Finding(
                    "demand-reaches-controller",
                    "fail",
                    f"gpugroup/{name_of(obj)}",
                    namespace,
                    f"requests queued since {timestamp(min(oldest))}, but the controller has not "
                    f"acted: the active model should be {wanted.active_model or 'none'}",
                    "Check the controller is running and watching this namespace (kubectl -n "
                    "flexinfer-system logs deploy/flexinfer-controller).",
                )
            )
    return findings


def proxy_can_record_demand(api: KubeApi, namespace: str, *, settings: Settings) -> list[Finding]:
    account_namespace, _, account = settings.proxy_account.partition("/")
    try:
        api.get(SERVICE_ACCOUNTS, account_namespace, account)
    except KubeError:
        return []  # no proxy installed (or we may not look): nothing to check
    user = f"system:serviceaccount:{account_namespace}:{account}"
    findings = []
    for resource, kind in (("models", "Models"), ("modeldeployments", "ModelDeployments")):
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{account_namespace}"],
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": "patch",
                    "group": "ai.flexinfer",
                    "resource": resource,
                    "subresource": "status",
                },
            },
        }
        try:
            answer = api.request("POST", SUBJECT_ACCESS_REVIEWS.path(), body=review)
        except KubeError:
            return []  # we may not ask: the check cannot run
        if not get_path(answer, "status", "allowed"):
            findings.append(
                Finding(
                    "demand-reaches-controller",
                    "fail",
                    f"serviceaccount/{account}",
                    account_namespace,
                    f"the proxy ({user}) may not patch {resource}/status in {namespace}: requests "
                    f"for parked {kind} there never reach the controller",
                    "Apply the proxy's RBAC (kubectl apply -k deploy/) or bind its ClusterRole "
                    f"flexinfer-proxy to it in {namespace}.",
                )
            )
    return findings


def _duration(value: timedelta) -> str:
    return format_duration(value)


def _selectors_of_vendor(view: ClusterView) -> list[str]:
    """`kind/name` of every resource whose pods select on the vendor label."""
    found = []
    for resource in (MODELS, MODEL_DEPLOYMENTS, MODEL_CACHES):
        for obj in view.objects(resource):
            if VENDOR_LABEL in (get_path(obj, "spec", "nodeSelector") or {}):
                found.append(f"{resource.kind.lower()}/{name_of(obj)}")
    return found


def gpu_node_label(view: ClusterView, nodes: list[dict[str, Any]]) -> list[Finding]:
    """GPU nodes without the vendor label (nodes unreadable: no finding, as no nodes)."""
    users = _selectors_of_vendor(view)
    findings = []
    for plan in plan_labels(nodes):
        if plan.current == plan.wanted:
            continue
        said = f"{VENDOR_LABEL}={plan.current}" if plan.current else f"no {VENDOR_LABEL} label"
        message = f"has {plan.resource} capacity but {said} (wanted {plan.wanted})"
        if users:
            message += f"; {', '.join(sorted(users)[:5])} select on it and match no such node"
        findings.append(
            Finding(
                "gpu-node-label",
                "fail" if users else "warn",
                f"node/{plan.node}",
                "",
                message,
                f"flexinfer nodes label --apply (or kubectl label node {plan.node} "
                f"{VENDOR_LABEL}={plan.wanted}{' --overwrite' if plan.current else ''})",
            )
        )
    return findings
