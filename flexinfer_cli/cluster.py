"""How the command reaches a cluster, and the view of it every verb reads.

kubectl's flags (`--kubeconfig`, `--context`, `-n/--namespace`, `-A`) pick the
cluster and the namespace; without `-n` the kubeconfig context's namespace is used,
as kubectl does. `list_cluster` lists once, into a `ClusterView` (`view`), every
resource the controller watches, with the controller's label selectors; the
controller's lookups and snapshot functions (`flexinfer_k8s.observe`) then read it
unchanged, so the command sees what the controller sees. A lease source that cannot
be listed is recorded, not fatal: the controller fails open on it, and so do the
command's decisions. `read_view` takes manifests (`-f`, `manifests`) instead when
given. Reads only.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
from kubernetes import config as k8s_config

from flexinfer_cli.manifests import load_manifests
from flexinfer_cli.output import CommandError, UsageError
from flexinfer_cli.view import FLEXINFER_GROUP, ClusterView
from flexinfer_k8s.cache import LEASE_SOURCES, WATCHED
from flexinfer_k8s.convert_leases import GPU_LEASE_LABEL
from flexinfer_kube.kubeapi import KubeApi, KubeError, NotFound, Rejected, new_api_client
from flexinfer_kube.resources import CONFIG_MAPS, Resource

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def add_cluster_flags(parser: argparse.ArgumentParser, *, all_namespaces: bool = True) -> None:
    """kubectl's connection and namespace flags."""
    group = parser.add_argument_group("cluster (as kubectl)")
    group.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, the in-cluster config, ~/.kube/config)",
    )
    group.add_argument("--context", default=None, help="the kubeconfig context to use")
    group.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace (default: the context's namespace, else `default`)",
    )
    if all_namespaces:
        group.add_argument(
            "-A",
            "--all-namespaces",
            action="store_true",
            help="every namespace",
        )


@attrs.frozen
class Target:
    """Where a verb acts: the API, and the namespace (None with `-A`)."""

    api: KubeApi
    namespace: str | None

    @property
    def write_namespace(self) -> str:
        if self.namespace is None:
            raise UsageError("this verb acts in one namespace: give -n NAMESPACE, not -A")
        return self.namespace


def connect(args: argparse.Namespace) -> Target:
    """The API client and namespace the flags name (an error says what to fix)."""
    try:
        api_client = new_api_client(
            args.kubeconfig, context=args.context, user_agent="flexinfer-cli"
        )
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as error:
        raise CommandError(
            f"no cluster to talk to ({error}); pass --kubeconfig, set KUBECONFIG, or give "
            "manifests with -f"
        ) from None
    if getattr(args, "all_namespaces", False):
        namespace: str | None = None
    else:
        namespace = args.namespace or context_namespace(args.kubeconfig, args.context)
    return Target(KubeApi(api_client), namespace)


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace kubectl would use: the context's, the pod's own in a cluster, else
    `default`."""
    try:
        list_contexts: Any = k8s_config.list_kube_config_contexts
        contexts, active = list_contexts(config_file=kubeconfig)
    except (k8s_config.ConfigException, OSError, TypeError, ValueError):
        contexts, active = [], None
    chosen: Any = active
    if context:
        chosen = next((c for c in contexts or [] if c.get("name") == context), None)
    if isinstance(chosen, dict):
        namespace = (chosen.get("context") or {}).get("namespace")
        if namespace:
            return str(namespace)
    elif (
        not kubeconfig and not os.environ.get("KUBECONFIG") and SERVICE_ACCOUNT_NAMESPACE.is_file()
    ):
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    return "default"


def list_cluster(
    api: KubeApi, namespace: str | None, *, resources: Iterable[Resource] = WATCHED
) -> ClusterView:
    """One list of each resource the controller watches, into a `ClusterView`."""
    view = ClusterView(source="cluster")
    for resource in resources:
        selector = GPU_LEASE_LABEL if resource is CONFIG_MAPS else None
        try:
            body = api.list(resource, namespace, label_selector=selector)
        except NotFound:
            if resource.group == FLEXINFER_GROUP:
                raise CommandError(
                    f"the API server does not know {resource.plural}.{resource.group}: the "
                    "flexinfer CRDs are not installed (kubectl apply -k crds/)"
                ) from None
            raise
        except Rejected as error:
            if resource in LEASE_SOURCES:
                view.unreadable.add(resource.plural)
                continue
            raise CommandError(f"cannot list {resource.plural}: {error.message}") from None
        except KubeError as error:
            raise CommandError(f"cannot list {resource.plural}: {error}") from None
        view.add(resource, body.get("items") or [], namespace=namespace)
    return view


def read_view(args: argparse.Namespace) -> tuple[ClusterView, str]:
    """The view a verb decides on, and its namespace: manifests given with `-f`
    (no cluster needed), else one listing of the cluster."""
    if getattr(args, "filename", None):
        namespace = args.namespace or "default"
        return load_manifests(args.filename, namespace=namespace), namespace
    target = connect(args)
    return list_cluster(target.api, target.namespace), target.write_namespace
