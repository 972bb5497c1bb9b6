"""`flexinfer leases` and `flexinfer lease acquire|release GROUP`: GPU leases by hand.

A lease taken here is the same `GPULease` a finetune Job takes: while it is active
every Model of the shared group is parked (the controller scales them to zero), and
it lapses by itself at `expiresAt`. `acquire` always sets a TTL (default 30m; a
forgotten lease must not park a group for years) and, run again by the same owner,
refreshes it; a lease held by someone else is reported, not taken over. `release`
deletes the group's leases taken by that owner; a finetune's lease (owned by its
ModelCache) is released only with `--force`. The listing also shows the legacy
ConfigMap carrier (`gpu-lease-<group>`), which the controller still honours.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from typing import Any

from flexinfer_cli.cluster import add_cluster_flags, connect, list_cluster
from flexinfer_cli.output import (
    FAILED,
    FORMATS,
    OK,
    CommandError,
    UsageError,
    age,
    emit,
    no_resources,
    render_table,
    timestamp,
    until,
)
from flexinfer_core import FlexinferError, format_duration, lease_is_active, parse_duration
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s.convert_leases import gpu_lease_from_config_map, gpu_lease_from_k8s
from flexinfer_k8s.convert_models import model_state_group
from flexinfer_kube.clock import SystemClock
from flexinfer_kube.kubeapi import Conflict, KubeApi, NotFound
from flexinfer_kube.objects import name_of
from flexinfer_kube.resources import CONFIG_MAPS, GPU_LEASES, MODELS

MANAGED_BY = "app.kubernetes.io/managed-by"
CLI_MANAGER = "flexinfer-cli"
DEFAULT_TTL = "30m"
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def add_parsers(sub: Any) -> None:
    listing = sub.add_parser("leases", help="GPU leases: NAME GROUP OWNER NODE EXPIRES AGE")
    listing.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_cluster_flags(listing)
    listing.set_defaults(run=run_list)

    lease = sub.add_parser("lease", help="park a shared group by hand: acquire or release")
    verbs = lease.add_subparsers(dest="verb", required=True, metavar="acquire|release")
    acquire = verbs.add_parser(
        "acquire",
        help="take a GPU lease on GROUP: every Model of it is parked until it lapses",
    )
    acquire.add_argument("group", help="the shared group (spec.gpu.shared)")
    acquire.add_argument("--owner", required=True, help="who holds it (shown as gpu-lease/OWNER)")
    acquire.add_argument(
        "--ttl",
        default=DEFAULT_TTL,
        help=f"lapses after this long (Go duration, default {DEFAULT_TTL}); run again to refresh",
    )
    acquire.add_argument("--node", default="", help="the node whose card is held (informational)")
    acquire.add_argument("--name", default=None, help="the GPULease's name (default GROUP-OWNER)")
    acquire.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_cluster_flags(acquire, all_namespaces=False)
    acquire.set_defaults(run=run_acquire)

    release = verbs.add_parser("release", help="delete the GPU lease(s) OWNER holds on GROUP")
    release.add_argument("group")
    release.add_argument("--owner", default=None, help="only the leases this owner holds")
    release.add_argument("--name", default=None, help="only the GPULease of this name")
    release.add_argument(
        "--force",
        action="store_true",
        help="also release a finetune's lease (owned by a ModelCache)",
    )
    add_cluster_flags(release, all_namespaces=False)
    release.set_defaults(run=run_release)


# --- leases ---------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    target = connect(args)
    view = list_cluster(target.api, target.namespace, resources=(GPU_LEASES, CONFIG_MAPS))
    now = SystemClock().now()
    rows = lease_rows([*view.objects(GPU_LEASES), *view.objects(CONFIG_MAPS)], now=now)
    wide = args.output == "wide"
    headers = ["name", "group", "owner", "node", "expires", "age"]
    if target.namespace is None:
        headers.insert(0, "namespace")
    if wide:
        headers += ["state", "source"]
    table = [
        ([r["namespace"]] if target.namespace is None else [])
        + [
            r["name"],
            r["group"],
            r["owner"],
            r["node"],
            r["expiresAt"],
            age(parse_rfc3339(r["createdAt"]), now=now),
        ]
        + ([r["state"], r["source"]] if wide else [])
        for r in rows
    ]
    text = render_table(headers, table) if rows else no_resources(target.namespace, "GPU leases")
    if view.unreadable:
        text += f"\n(cannot list {', '.join(sorted(view.unreadable))}: not shown)"
    emit({"items": rows}, fmt=args.output, table=text)
    return OK


def lease_rows(objs: list[dict[str, Any]], *, now: datetime) -> list[dict[str, Any]]:
    rows = []
    for obj in objs:
        lease = (
            gpu_lease_from_config_map(obj)
            if obj.get("kind") == CONFIG_MAPS.kind
            else gpu_lease_from_k8s(obj)
        )
        if lease is None:
            continue
        active = lease_is_active(lease, now)
        state = "active" if active else "expired"
        if active and lease.expires_at is None:
            state = "active, no TTL"
        elif active:
            state = f"active, lapses {until(lease.expires_at, now=now)}"
        rows.append(
            {
                "namespace": lease.namespace,
                "name": lease.name,
                "group": lease.group,
                "owner": lease.owner,
                "node": lease.node,
                "expiresAt": timestamp(lease.expires_at),
                "createdAt": (obj.get("metadata") or {}).get("creationTimestamp"),
                "active": active,
                "state": state,
                "source": lease.source.value,
            }
        )
    return sorted(rows, key=lambda r: (r["namespace"], r["group"], r["name"]))


# --- lease acquire / release --------------------------------------------------------------


def lease_name(group: str, owner: str) -> str:
    name = _NOT_DNS.sub("-", f"{group}-{owner}".lower()).strip("-")
    return name[:253] or group


def run_acquire(args: argparse.Namespace) -> int:
    try:
        ttl = parse_duration(args.ttl, field="--ttl")
    except FlexinferError as error:
        raise UsageError(str(error)) from None
    if ttl.total_seconds() <= 0:
        raise UsageError(
            "--ttl: must be more than 0 (a lease without TTL parks the group until deleted)"
        )
    target = connect(args)
    namespace = target.write_namespace
    now = SystemClock().now()
    name = args.name or lease_name(args.group, args.owner)
    expires = format_rfc3339(now.replace(microsecond=0) + ttl)
    lease = _acquire(
        target.api,
        namespace,
        name,
        group=args.group,
        owner=args.owner,
        node=args.node,
        expires=expires,
    )
    parked = sorted(
        name_of(m)
        for m in (target.api.list(MODELS, namespace).get("items") or [])
        if model_state_group(m) == args.group
    )
    data = {
        "name": name,
        "namespace": namespace,
        "group": args.group,
        "owner": args.owner,
        "expiresAt": expires,
        "parks": parked,
        "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion"),
    }
    text = (
        f"gpulease/{name} held by {args.owner} on group {args.group} until {expires} "
        f"({format_duration(ttl)}); parks: {', '.join(parked) or 'no Model yet'}\n"
        f"release it: flexinfer lease release {args.group} --owner {args.owner} -n {namespace}"
    )
    emit(data, fmt=args.output, table=text)
    return OK


def _acquire(
    api: KubeApi, namespace: str, name: str, *, group: str, owner: str, node: str, expires: str
) -> dict[str, Any]:
    spec = {"group": group, "owner": owner, "expiresAt": expires}
    if node:
        spec["node"] = node
    body = {
        "apiVersion": GPU_LEASES.api_version,
        "kind": GPU_LEASES.kind,
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: CLI_MANAGER}},
        "spec": spec,
    }
    try:
        return api.create(GPU_LEASES, namespace, body)
    except Conflict:
        pass
    current = api.get(GPU_LEASES, namespace, name)
    held = current.get("spec") or {}
    if held.get("owner") != owner or held.get("group") != group:
        raise CommandError(
            f"gpulease/{name} already exists, held by {held.get('owner') or '-'} on group "
            f"{held.get('group')}; choose another --name or release it first"
        )
    # Same owner again: refresh the TTL (the update is conditional on what was read).
    current["spec"] = {**held, **spec}
    return api.request("PUT", GPU_LEASES.path(namespace, name), body=current)


def run_release(args: argparse.Namespace) -> int:
    target = connect(args)
    namespace = target.write_namespace
    leases = target.api.list(GPU_LEASES, namespace).get("items") or []
    chosen = [
        lease
        for lease in leases
        if (lease.get("spec") or {}).get("group") == args.group
        and (args.owner is None or (lease.get("spec") or {}).get("owner") == args.owner)
        and (args.name is None or name_of(lease) == args.name)
    ]
    if not chosen:
        who = f" held by {args.owner}" if args.owner else ""
        raise CommandError(f"no GPU lease on group {args.group}{who} in namespace {namespace}")
    owned = [lease for lease in chosen if (lease.get("metadata") or {}).get("ownerReferences")]
    if owned and not args.force:
        names = ", ".join(name_of(lease) for lease in owned)
        raise CommandError(
            f"{names}: owned by a ModelCache (a finetune Job's lease; the controller releases "
            "it when the Job ends); pass --force to release it anyway"
        )
    for lease in chosen:
        try:
            target.api.delete(GPU_LEASES, namespace, name_of(lease))
        except NotFound:
            continue
        print(f"gpulease/{name_of(lease)} released (group {args.group})")
    return OK if chosen else FAILED
