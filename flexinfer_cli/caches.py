"""`flexinfer cache status`: ModelCaches as NAME STRATEGY PATH READY SOURCE.

`-o wide` adds the phase, the Job and the message; `-o json|yaml` carries every
column and the users (Models and ModelDeployments that reference each cache).
Reads only.
"""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer_cli.cluster import add_cluster_flags, connect, list_cluster
from flexinfer_cli.output import FORMATS, OK, emit, no_resources, render_table
from flexinfer_k8s.convert_models import model_cache_ref
from flexinfer_kube.objects import get_path, name_of, namespace_of
from flexinfer_kube.resources import MODEL_CACHES, MODEL_DEPLOYMENTS, MODELS


def add_parser(sub: Any) -> None:
    cache = sub.add_parser("cache", help="ModelCaches: `flexinfer cache status`")
    verbs = cache.add_subparsers(dest="verb", required=True, metavar="status")
    status = verbs.add_parser("status", help="NAME STRATEGY PATH READY SOURCE of each ModelCache")
    status.add_argument("-o", "--output", choices=FORMATS, default="table")
    add_cluster_flags(status)
    status.set_defaults(run=run)


def cache_users(
    models: list[dict[str, Any]], deployments: list[dict[str, Any]]
) -> dict[tuple[str, str], list[str]]:
    """(namespace, cache) -> the Models and ModelDeployments that read it."""
    users: dict[tuple[str, str], list[str]] = {}
    for model in models:
        ref = model_cache_ref(model)
        if ref:
            users.setdefault((namespace_of(model), ref), []).append(f"model/{name_of(model)}")
    for md in deployments:
        ref = str(get_path(md, "spec", "modelCacheRef") or "")
        if ref:
            users.setdefault((namespace_of(md), ref), []).append(f"modeldeployment/{name_of(md)}")
    return users


def cache_rows(
    caches: list[dict[str, Any]], users: dict[tuple[str, str], list[str]]
) -> list[dict[str, Any]]:
    rows = []
    for obj in sorted(caches, key=lambda c: (namespace_of(c), name_of(c))):
        key = (namespace_of(obj), name_of(obj))
        rows.append(
            {
                "namespace": key[0],
                "name": key[1],
                "strategy": get_path(obj, "spec", "storageStrategy"),
                "path": get_path(obj, "status", "path"),
                "ready": bool(get_path(obj, "status", "ready")),
                "source": get_path(obj, "spec", "source"),
                "phase": get_path(obj, "status", "phase"),
                "job": get_path(obj, "status", "jobName"),
                "message": get_path(obj, "status", "message"),
                "usedBy": sorted(users.get(key, [])),
            }
        )
    return rows


def run(args: argparse.Namespace) -> int:
    target = connect(args)
    view = list_cluster(
        target.api, target.namespace, resources=(MODEL_CACHES, MODELS, MODEL_DEPLOYMENTS)
    )
    rows = cache_rows(
        view.objects(MODEL_CACHES),
        cache_users(view.objects(MODELS), view.objects(MODEL_DEPLOYMENTS)),
    )
    wide = args.output == "wide"
    headers = ["name", "strategy", "path", "ready", "source"]
    if target.namespace is None:
        headers.insert(0, "namespace")
    if wide:
        headers += ["phase", "job", "used by", "message"]
    table = [
        ([r["namespace"]] if target.namespace is None else [])
        + [r["name"], r["strategy"], r["path"], str(r["ready"]).lower(), r["source"]]
        + ([r["phase"], r["job"], ",".join(r["usedBy"]), r["message"]] if wide else [])
        for r in rows
    ]
    text = render_table(headers, table) if rows else no_resources(target.namespace, "ModelCaches")
    emit({"items": rows}, fmt=args.output, table=text)
    return OK
