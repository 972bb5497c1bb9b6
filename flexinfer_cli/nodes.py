"""`flexinfer nodes label`: the GPU vendor label the manifests select on, from each node's
GPU capacity.

The docs' manifests pick "any AMD GPU node" with `nodeSelector:
{flexinfer.ai/gpu.vendor: AMD}`, and nothing in Kubernetes sets that label: a node with
`amd.com/gpu` capacity gets `AMD`, one with `nvidia.com/gpu` gets `NVIDIA`. A dry run by
default (it prints what it would change: node labels are the administrator's);
`--apply` writes; a label that already says another vendor is left alone unless
`--overwrite`. `doctor` (check gpu-node-label) finds the nodes this would fix.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import attrs

from flexinfer_cli.cluster import add_cluster_flags, connect
from flexinfer_cli.output import FORMATS, OK, emit, render_table
from flexinfer_kube.objects import JSON, get_path, name_of
from flexinfer_kube.resources import NODES

VENDOR_LABEL = "flexinfer.ai/gpu.vendor"
GPU_VENDORS = (("amd.com/gpu", "AMD"), ("nvidia.com/gpu", "NVIDIA"))
"""Extended resource → label value, in the order a node with both is read."""


def gpu_vendor(node: Mapping[str, Any]) -> tuple[str, str] | None:
    """(resource, label value) of the GPUs the node advertises, or None."""
    capacity = get_path(node, "status", "capacity") or {}
    for resource, vendor in GPU_VENDORS:
        try:
            count = int(str(capacity.get(resource, "0")))
        except ValueError:
            continue
        if count > 0:
            return resource, vendor
    return None


@attrs.frozen
class NodeLabel:
    node: str
    resource: str
    current: str
    wanted: str

    @property
    def action(self) -> str:
        if self.current == self.wanted:
            return "ok"
        return "label" if not self.current else "differs"


def plan_labels(nodes: list[JSON]) -> list[NodeLabel]:
    """Every GPU node and what its vendor label is and should be."""
    plans = []
    for node in sorted(nodes, key=name_of):
        found = gpu_vendor(node)
        if found is None:
            continue
        current = str((get_path(node, "metadata", "labels") or {}).get(VENDOR_LABEL) or "")
        plans.append(NodeLabel(name_of(node), found[0], current, found[1]))
    return plans


def add_parser(sub: Any) -> None:
    nodes = sub.add_parser("nodes", help="nodes: `flexinfer nodes label`")
    verbs = nodes.add_subparsers(dest="verb", required=True, metavar="label")
    label = verbs.add_parser(
        "label",
        help=f"set {VENDOR_LABEL} on GPU nodes from their amd.com/gpu or nvidia.com/gpu "
        "capacity (a dry run unless --apply)",
    )
    label.add_argument("--apply", action="store_true", help="write the labels (default: show)")
    label.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace a {VENDOR_LABEL} that names another vendor (default: leave it)",
    )
    label.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_cluster_flags(label, all_namespaces=False)
    label.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target = connect(args)
    plans = plan_labels(list(target.api.list(NODES).get("items") or []))
    rows = []
    for plan in plans:
        action = plan.action
        if action == "label" or (action == "differs" and args.overwrite):
            if args.apply:
                target.api.patch(
                    NODES, "", plan.node, {"metadata": {"labels": {VENDOR_LABEL: plan.wanted}}}
                )
                action = "labelled"
            else:
                action = "would label"
        elif action == "differs":
            action = "left (differs; --overwrite replaces it)"
        rows.append(
            {
                "node": plan.node,
                "gpu": plan.resource,
                "label": plan.current,
                "wanted": plan.wanted,
                "action": action,
            }
        )
    table = (
        render_table(
            ["NODE", "GPU", VENDOR_LABEL, "WANTED", "ACTION"], [list(r.values()) for r in rows]
        )
        if rows
        else "No node advertises amd.com/gpu or nvidia.com/gpu."
    )
    if rows and not args.apply and any(r["action"] == "would label" for r in rows):
        table += "\n(dry run: --apply writes the labels)"
    emit({"nodes": rows, "applied": bool(args.apply)}, fmt=args.output, table=table)
    return OK
