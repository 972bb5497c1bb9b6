"""Read a `flexinfer simulate` scenario (YAML) into the core simulator's inputs.

A scenario names one shared group's models (with the same field names as a
Model's `spec.gpu` / `spec.serverless`), the requests that arrive and the GPU
leases that come and go, all at offsets from the start (`90s`, `5m`); optionally
the controller's election policy (`policy`, its `--demand-window` etc.), the
proxy's timing (`proxy`) and what clients do with a 503 (`clients`). Errors name
the field path and the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import yaml

from flexinfer_core import (
    DEFAULT_POLICY,
    GpuLease,
    InvalidFieldError,
    ModelState,
    Policy,
    Serverless,
    format_duration,
    parse_duration,
)
from flexinfer_core.simulate import (
    DEFAULT_CLIENTS,
    DEFAULT_PROXY,
    ClientSettings,
    LeaseWindow,
    ProxySettings,
    Request,
    Timeline,
    simulate,
)
from flexinfer_k8s.render.policy import quantity_bytes

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@attrs.frozen
class Scenario:
    models: tuple[ModelState, ...]
    requests: tuple[Request, ...]
    leases: tuple[LeaseWindow, ...]
    until: datetime
    load_time: timedelta
    termination_time: timedelta
    start: datetime = EPOCH
    policy: Policy = DEFAULT_POLICY
    proxy: ProxySettings = DEFAULT_PROXY
    clients: ClientSettings = DEFAULT_CLIENTS

    def simulate(self) -> Timeline:
        """The scenario played through the core's simulator."""
        return simulate(
            self.models,
            start=self.start,
            until=self.until,
            requests=self.requests,
            leases=self.leases,
            load_time=self.load_time,
            termination_time=self.termination_time,
            policy=self.policy,
            proxy=self.proxy,
            clients=self.clients,
        )


def load_scenario(path: Path) -> Scenario:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise InvalidFieldError(str(path), "<file>", f"is not valid YAML: {err}") from None
    if not isinstance(data, Mapping):
        raise InvalidFieldError(str(path), type(data).__name__, "must be a mapping")
    return scenario_from_dict(data)


def scenario_from_dict(data: Mapping[str, Any]) -> Scenario:
    group = _str(data, "group", default="shared")
    namespace = _str(data, "namespace", default="default")
    models = tuple(
        _model(item, f"models[{i}]", group=group, namespace=namespace)
        for i, item in enumerate(_list(data, "models"))
    )
    if not models:
        raise InvalidFieldError("models", [], "must list at least one model")
    requests = tuple(
        Request(
            EPOCH + _duration(item, "at", f"requests[{i}]"),
            _str(item, "model", where=f"requests[{i}]"),
        )
        for i, item in enumerate(_list(data, "requests"))
    )
    leases = tuple(
        _lease(item, f"leases[{i}]", group=group, namespace=namespace)
        for i, item in enumerate(_list(data, "leases"))
    )
    return Scenario(
        models=models,
        requests=requests,
        leases=leases,
        until=EPOCH + _duration(data, "until", "", default="30m"),
        load_time=_duration(data, "loadTime", "", default="30s"),
        termination_time=_duration(data, "terminationTime", "", default="5s"),
        policy=_policy(_mapping(data, "policy")),
        proxy=_proxy(_mapping(data, "proxy")),
        clients=_clients(_mapping(data, "clients")),
    )


def _policy(data: Mapping[str, Any]) -> Policy:
    """The controller's election flags (`--demand-window` etc.)."""
    _known(data, "policy", ("demandWindow", "recentWindow", "defaultSwapCooldown"))
    d = DEFAULT_POLICY
    return Policy(
        demand_window=_window(data, "demandWindow", "policy", d.demand_window),
        recent_window=_window(data, "recentWindow", "policy", d.recent_window),
        default_swap_cooldown=_window(
            data, "defaultSwapCooldown", "policy", d.default_swap_cooldown
        ),
    )


def _proxy(data: Mapping[str, Any]) -> ProxySettings:
    _known(data, "proxy", ("minQueueWait", "refreshInterval"))
    d = DEFAULT_PROXY
    return ProxySettings(
        min_queue_wait=_window(data, "minQueueWait", "proxy", d.min_queue_wait),
        refresh_interval=_window(data, "refreshInterval", "proxy", d.refresh_interval),
    )


def _clients(data: Mapping[str, Any]) -> ClientSettings:
    _known(data, "clients", ("retries", "retryAfter"))
    d = DEFAULT_CLIENTS
    retries = _int(data, "retries", "clients", default=d.retries)
    if retries < 0:
        raise InvalidFieldError("clients.retries", retries, "must be 0 or more")
    return ClientSettings(
        retries=retries, retry_after=_window(data, "retryAfter", "clients", d.retry_after)
    )


def _window(data: Mapping[str, Any], key: str, where: str, default: timedelta) -> timedelta:
    return _duration(data, key, where, default=format_duration(default))


def _mapping(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping):
        raise InvalidFieldError(key, value, "must be a mapping")
    return value


def _known(data: Mapping[str, Any], where: str, keys: Sequence[str]) -> None:
    # A misspelt setting would otherwise be ignored and its default used in silence.
    for key in data:
        if key not in keys:
            raise InvalidFieldError(
                f"{where}.{key}", data[key], f"is not a setting here (known: {', '.join(keys)})"
            )


def _model(item: Any, where: str, *, group: str, namespace: str) -> ModelState:
    if not isinstance(item, Mapping):
        raise InvalidFieldError(where, item, "must be a mapping")
    serverless = item.get("serverless") or {}
    return ModelState(
        name=_str(item, "name", where=where),
        namespace=namespace,
        group=group,
        priority=_int(item, "priority", where, default=Policy.PRIORITY),
        swap_cooldown=_duration(item, "swapCooldown", where) if "swapCooldown" in item else None,
        force_promotion=bool(item.get("forcePromotion", Policy.FORCE_PROMOTION)),
        default_member=bool(item.get("default", Policy.DEFAULT_MEMBER)),
        serverless=Serverless(
            enabled=bool(serverless.get("enabled", Policy.SERVERLESS_ENABLED)),
            min_replicas=_int(
                serverless, "minReplicas", f"{where}.serverless", default=Policy.MIN_REPLICAS
            ),
            idle_timeout=_duration(
                serverless,
                "idleTimeout",
                f"{where}.serverless",
                default=format_duration(Policy.IDLE_TIMEOUT),
            ),
            cold_start_timeout=_duration(
                serverless,
                "coldStartTimeout",
                f"{where}.serverless",
                default=format_duration(Policy.COLD_START_TIMEOUT),
            ),
        ),
        service_labels=tuple(str(s) for s in item.get("serviceLabels", ())),
        # docs/election.md 1.7, as a Model's spec.gpu.vramBudget and .vramEstimate.
        vram_budget=_bytes(item, "vramBudget", where),
        vram_estimate=_bytes(item, "vramEstimate", where),
    )


def _bytes(data: Mapping[str, Any], key: str, where: str) -> int | None:
    if data.get(key) is None:
        return None
    return quantity_bytes(str(data[key]), field=_field(where, key))


def _lease(item: Any, where: str, *, group: str, namespace: str) -> LeaseWindow:
    if not isinstance(item, Mapping):
        raise InvalidFieldError(where, item, "must be a mapping")
    start = EPOCH + _duration(item, "start", where, default="0s")
    end = EPOCH + _duration(item, "end", where) if "end" in item else None
    expires = EPOCH + _duration(item, "expiresAt", where) if "expiresAt" in item else None
    lease = GpuLease(
        name=_str(item, "name", where=where, default="lease"),
        group=group,
        namespace=namespace,
        owner=_str(item, "owner", where=where, default=""),
        expires_at=expires,
    )
    return LeaseWindow(lease, start=start, end=end)


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _list(data: Mapping[str, Any], key: str) -> Sequence[Any]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise InvalidFieldError(key, value, "must be a list")
    return value


def _str(data: Mapping[str, Any], key: str, *, where: str = "", default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or (default is None and not value):
        raise InvalidFieldError(_field(where, key), value, "must be a non-empty string")
    return value


def _int(data: Mapping[str, Any], key: str, where: str, *, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFieldError(_field(where, key), value, "must be an integer")
    return value


def _duration(
    data: Mapping[str, Any], key: str, where: str, *, default: str | None = None
) -> timedelta:
    value = data.get(key, default)
    if value is None:
        raise InvalidFieldError(_field(where, key), value, "is required")
    return parse_duration(str(value), field=_field(where, key))
