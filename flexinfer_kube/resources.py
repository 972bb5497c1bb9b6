"""Where each kind lives: API group, version and plural, for every resource we touch.

The one table the controller, the proxy and the command share; `Resource.path`
builds the REST path. Data only.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Resource:
    """One API resource: where it lives and what it is called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        return base


MODELS = Resource("ai.flexinfer", "v1alpha2", "models", "Model")
GPU_LEASES = Resource("ai.flexinfer", "v1alpha2", "gpuleases", "GPULease")
GPU_GROUPS = Resource("ai.flexinfer", "v1alpha1", "gpugroups", "GPUGroup")
MODEL_DEPLOYMENTS = Resource("ai.flexinfer", "v1alpha1", "modeldeployments", "ModelDeployment")
MODEL_CACHES = Resource("ai.flexinfer", "v1alpha1", "modelcaches", "ModelCache")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
PODS = Resource("", "v1", "pods", "Pod")
SERVICES = Resource("", "v1", "services", "Service")
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
JOBS = Resource("batch", "v1", "jobs", "Job")
EVENTS = Resource("", "v1", "events", "Event")
PERSISTENT_VOLUME_CLAIMS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
"""A budgeted group's one card (`flexinfer_k8s.render.gpu_claim`)."""
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
