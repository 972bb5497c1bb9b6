"""`python -m flexinfer_k8s`: run the controller.

Reads a kubeconfig (`--kubeconfig`), else the in-cluster config, else
~/.kube/config; watches the given namespaces (`--namespace`, repeatable; default
all); serves /metrics and /healthz + /readyz; with `--leader-elect` only the replica
holding the coordination.k8s.io Lease acts, and losing it ends the process.
Logs are JSON lines. This module parses arguments and wires; nothing else.
"""

from __future__ import annotations

# Before anything of the extra is imported: without it, say what to install.
from flexinfer_kube.extras import require_extra

require_extra("controller", what="the controller (python -m flexinfer_k8s)")

import argparse
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta
from types import FrameType

import attrs

from flexinfer_core import InvalidFieldError, policy_flags, policy_from_flags
from flexinfer_k8s.controller import Controller
from flexinfer_k8s.leader import Leadership, run_leader_election
from flexinfer_k8s.metrics import ControllerMetrics, HttpEndpoints
from flexinfer_k8s.reconcile_cache import CacheTimeouts
from flexinfer_k8s.reconcile_shared import DEFAULT_COALESCE
from flexinfer_k8s.render.cache import CacheImages
from flexinfer_k8s.render.policy import AdminPolicy, admin_policy_from_yaml
from flexinfer_k8s.render.workload import Vendor
from flexinfer_k8s.render.workloads import BACKENDS, RenderSettings
from flexinfer_kube import logs
from flexinfer_kube.kubeapi import KubeApi, new_api_client

log = logging.getLogger("flexinfer.main")


MAX_WORKERS = 64
MAX_RESYNC = 86_400.0  # a day
# A status lagging its pods by longer than a minute would mislead more than it saves.
MAX_STATUS_COALESCE = 60.0
MAX_CACHE_TIMEOUT = 86_400  # a day


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flexinfer_k8s", description="The flexinfer controller."
    )
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None)
    parser.add_argument("--context", default=None)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (repeatable; default: all namespaces)",
    )
    parser.add_argument("--metrics-port", type=int, default=8080)
    parser.add_argument("--health-port", type=int, default=8081)
    parser.add_argument("--bind-address", default="0.0.0.0")
    parser.add_argument("--leader-elect", action="store_true")
    parser.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE") or "flexinfer-system",
    )
    parser.add_argument("--leader-election-id", default="flexinfer-controller")
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=15,
        help="seconds a standby waits after the last renew before taking the Lease",
    )
    parser.add_argument(
        "--renew-deadline",
        type=int,
        default=10,
        help="seconds after its last successful renew at which the leader stops writing "
        "and exits (must be below --lease-duration)",
    )
    parser.add_argument(
        "--retry-period",
        type=int,
        default=2,
        help="seconds between lease attempts (must be below --renew-deadline)",
    )
    parser.add_argument("--identity", default=None)
    parser.add_argument(
        "--workers",
        type=int,
        default=8,
        help=f"keys reconciled in parallel, 1..{MAX_WORKERS} (a reconcile mostly waits on "
        "the API server, so a burst of swaps wants several)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=300.0,
        help=f"seconds between full passes over every key, 0 (never) or 10..{MAX_RESYNC}",
    )
    parser.add_argument(
        "--status-coalesce-seconds",
        type=float,
        default=DEFAULT_COALESCE.total_seconds(),
        help="how long a shared-group holder's progress toward serving (taking the card "
        "from a member it evicts, its phase among Idle, Pending and Loading, and the reason "
        "with it) may wait to be written, so a quick swap writes Ready alone; once its "
        "status says it holds the card, its later steps wait six times as long (at most "
        f"60 s); 0 (every step) .. {MAX_STATUS_COALESCE:g}",
    )
    for policy_flag in policy_flags():
        parser.add_argument(
            policy_flag.flag,
            dest=f"policy_{policy_flag.attribute}",
            default=policy_flag.default,
            metavar="DURATION",
            help=f"election policy: {policy_flag.help}; default {policy_flag.default}",
        )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="BACKEND[:VENDOR]=IMAGE",
        help="default image of a backend (mlc-llm has none built in), for one GPU vendor "
        "or (no VENDOR) every vendor, e.g. mlc-llm=registry.local/mlc-llm:rocm or "
        "vllm:nvidia=vllm/vllm-openai:v0.9 (repeatable; spec.image still wins)",
    )
    parser.add_argument(
        "--render-group-id",
        type=int,
        default=109,
        help="gid of the host's `render` group, added to AMD GPU pods (getent group render)",
    )
    parser.add_argument(
        "--video-group-id", type=int, default=44, help="gid of the host's `video` group"
    )
    parser.add_argument(
        "--gpu-device-class",
        default="",
        metavar="NAME",
        help="the DeviceClass of the cluster's Dynamic Resource Allocation driver for its AMD "
        "GPUs (gpu.amd.com with AMD's driver): the members of a shared group with a VRAM "
        "budget, and of a GPUGroup with spec.vramBudget, then share one card through the "
        "group's ResourceClaim and are packed while their footprints fit (docs/election.md "
        "1.7 and 3); empty (the default): no such driver, and a budgeted group runs one "
        "member at a time",
    )
    parser.add_argument(
        "--cache-image",
        action="append",
        default=[],
        metavar="KIND=IMAGE",
        help="image of a ModelCache helper: huggingface, copy, ollama (downloads) or "
        "loader (the Memory flash loader) (repeatable)",
    )
    parser.add_argument(
        "--finetune-image",
        default="",
        help="trainer image for ModelCaches whose spec.finetune.image is empty",
    )
    parser.add_argument(
        "--finetune-unschedulable-timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="how long a finetune pod may stay unschedulable for a reason other than the GPU "
        "(a taint, a selector, no such node) before its Job is suspended and its GPU lease "
        f"released, 1..{MAX_CACHE_TIMEOUT} (default 300)",
    )
    parser.add_argument(
        "--cache-cleanup-timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="deadline of the Job that removes a deleted NodeLocal or Memory cache's node "
        "directories; the cache's deletion waits at most this plus 30 s, 1.."
        f"{MAX_CACHE_TIMEOUT} (default 300)",
    )
    parser.add_argument(
        "--policy",
        default="",
        metavar="FILE",
        help="the administrator's policy, a YAML file (GPU-node taints, allowed host paths, "
        "images, node selector and pod label keys); default: the built-in policy "
        "(docs/security.md)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    args = parser.parse_args(argv)
    try:
        args.render_settings = render_settings(args.image, args.cache_image, args)
    except ValueError as error:
        parser.error(str(error))
    for flag in ("finetune_unschedulable_timeout", "cache_cleanup_timeout"):
        value = getattr(args, flag)
        if not 1 <= value <= MAX_CACHE_TIMEOUT:
            parser.error(f"--{flag.replace('_', '-')} must be 1..{MAX_CACHE_TIMEOUT}; got {value}")
    try:
        args.election_policy = policy_from_flags(
            {f.attribute: getattr(args, f"policy_{f.attribute}") for f in policy_flags()}
        )
    except InvalidFieldError as error:
        parser.error(str(error))
    if not 1 <= args.workers <= MAX_WORKERS:
        parser.error(f"--workers must be 1..{MAX_WORKERS}; got {args.workers}")
    if args.resync_seconds != 0 and not 10 <= args.resync_seconds <= MAX_RESYNC:
        parser.error(f"--resync-seconds must be 0 or 10..{MAX_RESYNC}; got {args.resync_seconds}")
    if not 0 <= args.status_coalesce_seconds <= MAX_STATUS_COALESCE:
        parser.error(
            f"--status-coalesce-seconds must be 0..{MAX_STATUS_COALESCE:g}; "
            f"got {args.status_coalesce_seconds:g}"
        )
    if not 0 < args.retry_period < args.renew_deadline < args.lease_duration:
        parser.error(
            "leader election needs 0 < --retry-period < --renew-deadline < --lease-duration; "
            f"got {args.retry_period} < {args.renew_deadline} < {args.lease_duration}"
        )
    return args


DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
"""A Kubernetes object name such as a DeviceClass's."""


def render_settings(
    images: Sequence[str], cache_images: Sequence[str], args: argparse.Namespace
) -> RenderSettings:
    """`--image`, `--cache-image` and the group ids as the renderer's settings."""
    by_backend: dict[tuple[str, Vendor | None], str] = {}
    for text in images:
        key, sep, image = text.partition("=")
        backend, _, vendor = key.partition(":")
        if not sep or not image or backend not in BACKENDS:
            raise ValueError(
                f"--image {text!r}: expected BACKEND[:VENDOR]=IMAGE with BACKEND one of "
                f"{', '.join(sorted(BACKENDS))}"
            )
        try:
            by_backend[(backend, Vendor(vendor) if vendor else None)] = image
        except ValueError:
            raise ValueError(f"--image {text!r}: VENDOR must be amd, nvidia or cpu") from None
    helpers = {}
    for text in cache_images:
        kind, sep, image = text.partition("=")
        if not sep or not image or kind not in attrs.fields_dict(CacheImages):
            raise ValueError(
                f"--cache-image {text!r}: expected KIND=IMAGE with KIND one of "
                f"{', '.join(attrs.fields_dict(CacheImages))}"
            )
        helpers[kind] = image
    policy = AdminPolicy()
    if args.policy:
        try:
            with open(args.policy, encoding="utf-8") as handle:
                policy = admin_policy_from_yaml(handle.read())
        except OSError as error:
            raise ValueError(f"--policy {args.policy}: {error.strerror}") from None
        except InvalidFieldError as error:
            raise ValueError(f"--policy {args.policy}: {error}") from None
    device_class = args.gpu_device_class
    if device_class and not DNS_SUBDOMAIN.fullmatch(device_class):
        raise ValueError(
            f"--gpu-device-class {device_class!r}: must be a DeviceClass name (a DNS "
            "subdomain: lowercase letters, digits, '-' and '.', at most 253 characters), "
            "e.g. gpu.amd.com"
        )
    return RenderSettings(
        gpu_device_class=device_class,
        policy=policy,
        images=by_backend,
        video_gid=args.video_group_id,
        render_gid=args.render_group_id,
        cache_images=CacheImages(**helpers),
        controller_namespace=args.leader_election_namespace,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level)
    if args.gpu_device_class:
        log.info(
            "budgeted shared groups share one card through a ResourceClaim",
            extra={"fields": {"gpu_device_class": args.gpu_device_class}},
        )
    identity = (
        args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    )

    metrics = ControllerMetrics()
    registry = metrics.registry
    user_agent = f"flexinfer-controller/{identity}"
    leadership: Leadership | None = None
    if args.leader_elect:

        def lost(why: str) -> None:
            # Another replica may already be acting: stop at once, never overlap.
            metrics.leading.set(0)
            log.error(
                "lost leadership; exiting", extra={"fields": {"identity": identity, "why": why}}
            )
            os._exit(1)

        leadership = Leadership(renew_deadline=args.renew_deadline, on_lost=lost)
    api = KubeApi(
        new_api_client(args.kubeconfig, context=args.context, user_agent=user_agent),
        on_request=metrics.count_request,
        write_guard=leadership.guard_write if leadership is not None else None,
    )
    controller = Controller(
        api,
        metrics=metrics,
        namespaces=args.namespace,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        status_coalesce=timedelta(seconds=args.status_coalesce_seconds),
        identity=identity,
        render_settings=args.render_settings,
        finetune_image=args.finetune_image,
        cache_timeouts=CacheTimeouts(
            finetune_unschedulable=timedelta(seconds=args.finetune_unschedulable_timeout),
            cleanup=timedelta(seconds=args.cache_cleanup_timeout),
        ),
        policy=args.election_policy,
        events_in_background=True,
    )
    leading = threading.Event()

    def ready() -> tuple[bool, str]:
        if args.leader_elect and not leading.is_set():
            return True, "standby"
        return controller.ready()

    def healthy() -> tuple[bool, str]:
        if leadership is not None:
            ok, detail = leadership.healthy()
            if not ok:
                return ok, detail
        return controller.healthy()

    endpoints = [
        HttpEndpoints(args.metrics_port, registry=registry, host=args.bind_address).start()
    ]
    if args.health_port != args.metrics_port or args.health_port == 0:  # 0: one port each
        endpoints.append(
            HttpEndpoints(
                args.health_port, healthz=healthy, readyz=ready, host=args.bind_address
            ).start()
        )
    log.info(
        "listening",
        extra={"fields": {"ports": [e.port for e in endpoints], "identity": identity}},
    )

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if leadership is not None:

        def started() -> None:
            log.info("became leader", extra={"fields": {"identity": identity}})
            leading.set()
            controller.start()
            stop.wait()

        run_leader_election(
            new_api_client(
                args.kubeconfig, context=args.context, user_agent=f"{user_agent}/leader-election"
            ),
            name=args.leader_election_id,
            namespace=args.leader_election_namespace,
            identity=identity,
            leadership=leadership,
            on_started=started,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
    else:
        leading.set()
        controller.start()

    stop.wait()
    log.info("shutting down")
    controller.stop()
    for endpoint in endpoints:
        endpoint.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
