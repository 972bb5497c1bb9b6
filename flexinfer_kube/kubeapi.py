"""A thin JSON client for the Kubernetes API, with a small error taxonomy.

Everything the controller reads and writes goes through `KubeApi`: plain dicts in
and out (the same shape `kubectl get -o json` prints), one request per call, the
HTTP status mapped to `NotFound`, `Conflict`, `Gone`, `Rejected` or `Transient`
(kopf's taxonomy, narrowed). It rides on a `kubernetes.client.ApiClient` for the
connection pool, TLS and authentication, so kubeconfig, in-cluster config and
token/impersonation setups all work unchanged. It makes no decisions and keeps no
state beyond the client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.watch import watch as k8s_watch

from flexinfer_kube.resources import Resource

JSON = dict[str, Any]


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0 when there was no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeError):
    """409: a stale resourceVersion, or create of an existing object."""


class Gone(KubeError):
    """410: the resourceVersion is too old to watch from; re-list."""


class Rejected(KubeError):
    """400/401/403/422 and other 4xx: retrying the same request will not help."""


class Transient(KubeError):
    """429, 5xx, timeouts and connection errors: retry later."""


class NotLeading(KubeError):
    """A write refused before it was sent: this replica's leadership is not fresh."""


def error_for(status: int, message: str) -> KubeError:
    if status == 404:
        return NotFound(status, message)
    if status == 409:
        return Conflict(status, message)
    if status == 410:
        return Gone(status, message)
    if status == 429 or status >= 500 or status == 0:
        return Transient(status, message)
    return Rejected(status, message)


MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

RequestHook = Callable[[str, str], None]
"""Called with (method, path) before every request (the write counter uses it)."""

WriteGuard = Callable[[str, str], None]
"""Called with (method, path) before every write; raises (`NotLeading`) to refuse it."""


def new_api_client(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    impersonate: str | None = None,
    pool_size: int = 32,
    user_agent: str | None = None,
) -> Any:
    """An ApiClient from a kubeconfig, else the in-cluster config, else ~/.kube/config.

    The pool is sized for one watch per resource plus the writers (urllib3's
    default of 4 would make every watch past the fourth open a fresh connection).
    `impersonate` sends `Impersonate-User` (tests run as a less privileged user);
    `user_agent` names the caller in the API server's audit log.
    """
    configuration = k8s_client.Configuration()
    load_kube_config: Any = k8s_config.load_kube_config
    load_incluster_config: Any = k8s_config.load_incluster_config
    if kubeconfig:
        load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    else:
        try:
            load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            load_kube_config(context=context, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    api_client: Any = k8s_client.ApiClient(configuration)
    if impersonate:
        api_client.set_default_header("Impersonate-User", impersonate)
    if user_agent:
        api_client.user_agent = user_agent
    return api_client


class KubeApi:
    """JSON requests over an ApiClient; see the module docstring."""

    def __init__(
        self,
        api_client: Any,
        *,
        on_request: RequestHook | None = None,
        write_guard: WriteGuard | None = None,
    ) -> None:
        self.api_client = api_client
        self._on_request = on_request
        self._write_guard = write_guard

    # -- plumbing -----------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = 30.0,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self._write_guard is not None and method != "GET":
            self._write_guard(method, path)
        if self._on_request is not None:
            self._on_request(method, path)
        serialized = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api_client.call_api(*serialized, _request_timeout=timeout)
        except k8s_client.ApiException as error:
            raise error_for(int(error.status or 0), str(error.reason)) from error
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise Transient(0, f"{method} {path}: {error}") from error
        return response

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = 30.0,
    ) -> JSON:
        response = self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise Transient(0, f"{method} {path}: {error}") from error
        text = data.decode("utf-8", errors="replace") if data else ""
        if not 200 <= response.status <= 299:
            raise error_for(response.status, _status_message(text) or f"{method} {path}")
        return json.loads(text) if text else {}

    # -- verbs --------------------------------------------------------------------

    def get(
        self, resource: Resource, namespace: str, name: str, *, subresource: str | None = None
    ) -> JSON:
        path = resource.path(namespace, name)
        if subresource:
            path += f"/{subresource}"
        return self.request("GET", path)

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> JSON:
        return self.request(
            "GET", resource.path(namespace), query={"labelSelector": label_selector}
        )

    def create(self, resource: Resource, namespace: str, body: JSON) -> JSON:
        return self.request("POST", resource.path(namespace), body=body)

    def delete(self, resource: Resource, namespace: str, name: str) -> JSON:
        return self.request(
            "DELETE",
            resource.path(namespace, name),
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
        )

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: JSON,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        """A JSON merge patch, optionally on a subresource (`status`, `scale`)."""
        path = resource.path(namespace, name)
        if subresource:
            path += f"/{subresource}"
        return self.request(
            "PATCH",
            path,
            body=body,
            content_type=MERGE_PATCH,
            query={"fieldManager": field_manager},
        )

    def apply(
        self, resource: Resource, namespace: str, name: str, body: JSON, *, field_manager: str
    ) -> JSON:
        """Server-side apply of `body` (JSON is YAML) as `field_manager`, forcing conflicts:
        the manager owns exactly the fields `body` sets; fields others own are kept."""
        return self.request(
            "PATCH",
            resource.path(namespace, name),
            body=body,
            content_type=APPLY_PATCH,
            query={"fieldManager": field_manager, "force": "true"},
        )

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 60,
        on_open: Callable[[Any], None] | None = None,
    ) -> Iterator[JSON]:
        """Stream watch events from `resource_version`, with bookmarks.

        `on_open` receives the live urllib3 response so another thread can shut
        it down (that is how an informer stops promptly).
        """
        response = self._send(
            "GET",
            resource.path(namespace),
            query={
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": timeout_seconds,
                "labelSelector": label_selector,
            },
            timeout=(10.0, timeout_seconds + 15.0),
        )
        raw = response.response
        if not 200 <= response.status <= 299:
            text = response.read().decode("utf-8", errors="replace")
            raise error_for(response.status, _status_message(text) or "watch")
        if on_open is not None:
            on_open(raw)
        try:
            lines: Iterator[str] = k8s_watch.iter_resp_lines(raw)  # type: ignore[no-untyped-call]
            for line in lines:
                if line:
                    yield json.loads(line)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            raise Transient(0, f"watch {resource.plural}: {error}") from error
        finally:
            raw.release_conn()


def _status_message(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or "")
    return ""
