"""Offline checks of crds/, examples/ and deploy/: no API server needed.

The real API server is the authority (tests/k8s/test_crds.py); these checks catch,
in milliseconds, the mistakes it would only report as a failed install or a silently
pruned field: a schema that is not structural, a default that violates its own
bounds, an example field the schema does not know, printer columns that point
nowhere, blocks that drifted apart between kinds, RBAC that grants too much.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_devcluster import image
from flexinfer_k8s.__main__ import parse_args
from flexinfer_k8s.render import mlc_llm
from flexinfer_k8s.render.workload import Vendor
from flexinfer_proxy.__main__ import build_parser

ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = ROOT / "crds"
EXAMPLES_DIR = ROOT / "examples"
DEPLOY_DIR = ROOT / "deploy"

GROUP = "ai.flexinfer"
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"

# kind -> (plural, version, short names, printer column names after NAME)
EXPECTED_KINDS: dict[str, tuple[str, str, list[str], list[str]]] = {
    "Model": (
        "models",
        "v1alpha2",
        ["mdl"],
        ["Backend", "Shared", "Priority", "Phase", "State", "Queue", "Reason", "LastActive", "Age"],
    ),
    "GPULease": (
        "gpuleases",
        "v1alpha2",
        ["gpulease"],
        ["Group", "Owner", "Node", "Expires", "Age"],
    ),
    "GPUGroup": ("gpugroups", "v1alpha1", [], ["Phase", "Active", "Reason", "Swaps", "Age"]),
    "ModelCache": ("modelcaches", "v1alpha1", [], ["Strategy", "Path", "Ready", "Source"]),
    "ModelDeployment": (
        "modeldeployments",
        "v1alpha1",
        [],
        ["Backend", "Model", "Group", "Phase", "Reason", "LastAccess", "Age"],
    ),
}
# The REASON column: the Ready condition's reason, as cert-manager shows READY.
READY_REASON = '.status.conditions[?(@.type=="Ready")].reason'

Schema = dict[str, Any]


def load_documents(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def crd_files() -> list[Path]:
    return sorted(CRD_DIR.glob("ai.flexinfer_*.yaml"))


def example_files() -> list[Path]:
    """Every manifest under examples/ (scenarios/ are simulator inputs, not manifests)."""
    return sorted(p for p in EXAMPLES_DIR.rglob("*.yaml") if "scenarios" not in p.parts)


def crds_by_kind() -> dict[str, dict[str, Any]]:
    crds: dict[str, dict[str, Any]] = {}
    for path in crd_files():
        (crd,) = load_documents(path)
        crds[crd["spec"]["names"]["kind"]] = crd
    return crds


def served_schema(crd: dict[str, Any]) -> Schema:
    (version,) = crd["spec"]["versions"]
    schema: Schema = version["schema"]["openAPIV3Schema"]
    return schema


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node with its dotted path (`[]` for list items, `{}` for map values)."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}.{{}}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")


def is_int_or_string(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-int-or-string"))


def validate(schema: Schema, value: Any, path: str) -> list[str]:
    """A small subset of the API server's validation: enough for our own schemas.

    Unknown fields are errors here, because the API server would silently prune them.
    """
    errors: list[str] = []
    if is_int_or_string(schema):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{path}: {value!r} is neither an integer nor a string"]
        if (
            isinstance(value, str)
            and "pattern" in schema
            and not re.search(schema["pattern"], value)
        ):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        return errors
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {value!r}"]
        errors.extend(
            f"{path}.{name}: required" for name in schema.get("required", []) if name not in value
        )
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append(f"{path}: more than {schema['maxProperties']} properties")
        for name, item in value.items():
            if properties is not None and name in properties:
                errors.extend(validate(properties[name], item, f"{path}.{name}"))
            elif isinstance(extra, dict):
                errors.extend(validate(extra, item, f"{path}.{name}"))
            elif properties is not None and path != ".metadata":
                errors.append(f"{path}.{name}: unknown field (would be pruned)")
        return errors
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {value!r}"]
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        for index, item in enumerate(value):
            errors.extend(validate(schema["items"], item, f"{path}[{index}]"))
        return errors
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{path}: expected an integer, got {value!r}"]
    elif kind == "boolean":
        if not isinstance(value, bool):
            return [f"{path}: expected a boolean, got {value!r}"]
    elif kind == "string":
        if not isinstance(value, str):
            return [f"{path}: expected a string, got {value!r}"]
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: {value!r} below {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{path}: {value!r} above {schema['maximum']}")
    return errors


def structural_errors(schema: Schema) -> list[str]:
    errors: list[str] = []
    for path, node in walk(schema):
        if is_int_or_string(node):
            branches = node.get("anyOf", [])
            if sorted(branch.get("type") for branch in branches) != ["integer", "string"]:
                errors.append(f"{path}: int-or-string needs anyOf integer|string")
            if any(set(branch) != {"type"} for branch in branches):
                errors.append(f"{path}: anyOf branches may only carry a type")
        elif "type" not in node:
            errors.append(f"{path}: no type")
        elif "anyOf" in node or "oneOf" in node or "allOf" in node:
            errors.append(f"{path}: combinators are only used for int-or-string")
        if "properties" in node and "additionalProperties" in node:
            errors.append(f"{path}: both properties and additionalProperties")
        if "default" in node:
            if path.startswith(".metadata"):
                errors.append(f"{path}: defaults are not allowed under metadata")
            errors.extend(f"default: {error}" for error in validate(node, node["default"], path))
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                if key not in item.get("required", []) and "default" not in item["properties"][key]:
                    errors.append(f"{path}: list-map key {key} must be required")
        if node.get("type") == "array" and "items" not in node:
            errors.append(f"{path}: array without items")
    return errors


def schema_at(schema: Schema, json_path: str) -> Schema | None:
    node: Schema | None = schema
    for part in json_path.strip(".").split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    return node


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    return crds_by_kind()


def test_there_is_one_crd_per_kind(crds: dict[str, dict[str, Any]]) -> None:
    assert set(crds) == set(EXPECTED_KINDS)


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_crd_identity(crds: dict[str, dict[str, Any]], kind: str) -> None:
    plural, version, short_names, _ = EXPECTED_KINDS[kind]
    crd = crds[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{plural}.{GROUP}"
    spec = crd["spec"]
    assert spec["group"] == GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == plural
    assert spec["names"].get("shortNames", []) == short_names
    (served,) = spec["versions"]
    assert served["name"] == version
    assert served["served"] is True
    assert served["storage"] is True
    assert served["subresources"] == {"status": {}}


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_schema_is_structural(crds: dict[str, dict[str, Any]], kind: str) -> None:
    assert structural_errors(served_schema(crds[kind])) == []


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_printer_columns_point_at_schema_fields(crds: dict[str, dict[str, Any]], kind: str) -> None:
    (served,) = crds[kind]["spec"]["versions"]
    columns = served["additionalPrinterColumns"]
    assert [column["name"] for column in columns] == EXPECTED_KINDS[kind][3]
    schema = served_schema(crds[kind])
    for column in columns:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        if column["name"] == "Reason":
            assert (column["jsonPath"], column["type"]) == (READY_REASON, "string")
            reason = schema_at(schema, "status.conditions")
            assert reason is not None
            assert reason["items"]["properties"]["reason"]["type"] == "string"
            continue
        node = schema_at(schema, column["jsonPath"])
        assert node is not None, column
        expected_type = {"date": "string", "string": "string"}.get(column["type"], column["type"])
        assert node["type"] == expected_type, column
        if column["type"] == "date":
            assert node.get("format") == "date-time", column


def test_durations_share_one_pattern(crds: dict[str, dict[str, Any]]) -> None:
    model = served_schema(crds["Model"])
    durations = [
        "spec.gpu.swapCooldown",
        "spec.serverless.idleTimeout",
        "spec.serverless.coldStartTimeout",
    ]
    for field in durations:
        node = schema_at(model, field)
        assert node is not None
        assert node["pattern"] == DURATION_PATTERN, field
    pattern = re.compile(DURATION_PATTERN)
    for good in ["5m", "90s", "1h30m", "1.5h", "300ms", "2µs"]:
        assert pattern.match(good), good
    for bad in ["3x", "5", "", "m5", "-5m", "5 m"]:
        assert not pattern.match(bad), bad


def test_shared_blocks_are_identical_across_kinds(crds: dict[str, dict[str, Any]]) -> None:
    """One definition of conditions, mlcllm and quantities, copied verbatim."""
    schemas = {kind: served_schema(crd) for kind, crd in crds.items()}
    conditions = [
        schema_at(schema, "status.conditions")
        for kind, schema in schemas.items()
        if kind != "GPULease"  # a lease has no conditions, only acquiredAt/active
    ]
    assert len(conditions) == 4
    assert all(c is not None and c == conditions[0] for c in conditions)
    model_mlc = schema_at(schemas["Model"], "spec.mlcllm")
    deployment_mlc = schema_at(schemas["ModelDeployment"], "spec.mlcllm")
    assert model_mlc is not None
    assert model_mlc == deployment_mlc
    quantities = [
        node for schema in schemas.values() for _, node in walk(schema) if is_int_or_string(node)
    ]
    assert quantities
    assert len({node["pattern"] for node in quantities}) == 1


def test_crds_kustomization_lists_every_crd() -> None:
    (kustomization,) = load_documents(CRD_DIR / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in crd_files())


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_example_is_valid_against_its_crd(path: Path) -> None:
    crds = crds_by_kind()
    documents = load_documents(path)
    assert documents
    for document in documents:
        kind = document["kind"]
        assert kind in crds, f"{path.name}: no CRD for {kind}"
        assert document["apiVersion"] == f"{GROUP}/{EXPECTED_KINDS[kind][1]}"
        # Examples are applied with -n; a namespace in the file would fight it.
        assert "namespace" not in document["metadata"]
        assert validate(served_schema(crds[kind]), document, "") == []


def test_examples_cover_the_documented_scenarios() -> None:
    documents = [doc for path in example_files() for doc in load_documents(path)]
    shared = [
        doc
        for doc in documents
        if doc["kind"] == "Model" and doc["spec"].get("gpu", {}).get("shared") == "homelab-gpu"
    ]
    assert len(shared) == 2
    assert len({doc["spec"]["gpu"].get("priority", 100) for doc in shared}) == 2
    groups = {doc["metadata"]["name"]: doc for doc in documents if doc["kind"] == "GPUGroup"}
    assert len(groups["homelab-rx7900xt"]["spec"]["models"]) == 2
    # A packed GPUGroup (docs/election.md 3): two members fit the budget together, the
    # third (more important) fits only in place of one of them.
    packed = groups["small-card-gg"]["spec"]
    budget = int(packed["vramBudget"].removesuffix("Gi"))
    sizes = sorted(int(m["vramEstimate"].removesuffix("Gi")) for m in packed["models"])
    assert sum(sizes[:2]) <= budget < sum(sizes)
    assert sizes[0] + sizes[2] <= budget
    leases = [
        doc["spec"]["finetune"]["gpuLease"]
        for doc in documents
        if doc["kind"] == "ModelCache" and "finetune" in doc["spec"]
    ]
    assert leases == [{"group": "5930k-textgen", "ttlSeconds": 3600}]
    memory_caches = {
        doc["metadata"]["name"]
        for doc in documents
        if doc["kind"] == "ModelCache" and doc["spec"].get("storageStrategy") == "Memory"
    }
    scale_to_zero = [
        doc
        for doc in documents
        if doc["kind"] == "ModelDeployment"
        and doc["spec"].get("modelCacheRef") in memory_caches
        and doc["spec"].get("minReplicas", 0) == 0
    ]
    assert scale_to_zero
    overrides = [
        doc["spec"]["mlcllm"]["overrides"]
        for doc in documents
        if doc["kind"] == "ModelDeployment"
        and doc["spec"].get("mlcllm", {}).get("mode") == "server"
    ]
    assert {"maxNumSequence": 2, "maxTotalSeqLength": 131072} in [
        {k: o[k] for k in ("maxNumSequence", "maxTotalSeqLength") if k in o} for o in overrides
    ]
    assert any(doc["kind"] == "GPULease" for doc in documents)


def deploy_documents() -> list[dict[str, Any]]:
    (kustomization,) = load_documents(DEPLOY_DIR / "kustomization.yaml")
    assert "../crds" in kustomization["resources"]
    return [
        doc
        for name in kustomization["resources"]
        if name.endswith(".yaml")
        for doc in load_documents(DEPLOY_DIR / name)
    ]


CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def test_deploy_objects_live_in_flexinfer_system() -> None:
    for document in deploy_documents():
        metadata = document["metadata"]
        if document["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in metadata, metadata["name"]
        else:
            assert metadata.get("namespace") == "flexinfer-system", metadata["name"]
        for subject in document.get("subjects", []):
            assert subject["namespace"] == "flexinfer-system"


def rules_of(documents: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    (role,) = [
        doc for doc in documents if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == name
    ]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


# The one Secret anything may read: the proxy's API keys (--api-key-secret).
API_KEY_SECRET_ROLE = "flexinfer-proxy-api-keys"


def test_rbac_grants_no_wildcards_and_no_secrets() -> None:
    documents = deploy_documents()
    for document in documents:
        for rule in document.get("rules", []):
            assert "*" not in rule["verbs"], document["metadata"]["name"]
            assert "*" not in rule["resources"], document["metadata"]["name"]
            if "secrets" not in rule["resources"]:
                continue
            # Only the proxy's API keys, in its namespace: the proxy reads that one
            # Secret; the Job that generates it once reads it and may create Secrets.
            assert document["kind"] == "Role", document["metadata"]["name"]
            assert document["metadata"]["namespace"] == "flexinfer-system"
            assert document["metadata"]["name"] in (API_KEY_SECRET_ROLE, "flexinfer-proxy-keys")
            assert rule in (
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": [API_KEY_SECRET_ROLE],
                    "verbs": ["get"],
                },
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            ), rule
            if "resourceNames" not in rule:
                assert document["metadata"]["name"] == "flexinfer-proxy-keys"


def test_proxy_may_not_delete_or_scale() -> None:
    rules = rules_of(deploy_documents(), "flexinfer-proxy")
    verbs = {verb for rule in rules for verb in rule["verbs"]}
    assert verbs <= {"get", "list", "watch", "patch"}
    patched = {
        resource for rule in rules if "patch" in rule["verbs"] for resource in rule["resources"]
    }
    assert patched == {"models/status", "modeldeployments/status", "gpugroups"}


def test_workloads_are_hardened() -> None:
    deployments = {
        doc["metadata"]["name"]: doc for doc in deploy_documents() if doc["kind"] == "Deployment"
    }
    assert set(deployments) == {"flexinfer-controller", "flexinfer-proxy"}
    controller = deployments["flexinfer-controller"]["spec"]
    assert controller["replicas"] == 2
    (container,) = controller["template"]["spec"]["containers"]
    assert container["command"] == [
        "python", "-m", "flexinfer_k8s", "--leader-elect",
        "--metrics-port", "8080", "--health-port", "8081",
        "--policy", "/etc/flexinfer/policy.yaml",
    ]  # fmt: skip
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    proxy = deployments["flexinfer-proxy"]["spec"]
    (proxy_container,) = proxy["template"]["spec"]["containers"]
    assert proxy_container["command"] == [
        "python", "-m", "flexinfer_proxy", "--port", "8000",
        "--api-key-secret", "flexinfer-system/flexinfer-proxy-api-keys",
    ]  # fmt: skip
    assert proxy_container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert proxy_container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for deployment in deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for each in pod["containers"]:
            assert each["securityContext"]["readOnlyRootFilesystem"] is True
            assert each["securityContext"]["allowPrivilegeEscalation"] is False
            assert each["resources"]["requests"]


def test_dockerfile_context_holds_every_packaged_module_and_runs_as_non_root() -> None:
    """deploy/Dockerfile copies the context its ignore file allows: the wheel's packages
    and metadata, never the dev control plane. The base Docker pulls by default is the
    Debian suite `make image` bootstraps, so the two builds stay one recipe. (The image
    itself is checked in tests/image.)"""
    with (ROOT / "pyproject.toml").open("rb") as stream:
        project = tomllib.load(stream)
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    packages = [*wheel["packages"], *wheel.get("force-include", {})]
    ignored = (DEPLOY_DIR / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line for line in ignored if line and not line.startswith("#")]
    assert patterns[0] == "*"  # an allowlist: a new file stays out until listed
    allowed = {line[1:] for line in ignored if line.startswith("!")}
    assert allowed == {"pyproject.toml", project["project"]["readme"], *packages}
    assert "flexinfer_devcluster" not in allowed
    lines = (DEPLOY_DIR / "Dockerfile").read_text(encoding="utf-8").splitlines()
    instructions = [line.split(None, 1) for line in lines if line and not line.startswith("#")]
    assert ["COPY", ". /src/"] in instructions
    assert [args for op, *args in instructions if op == "FROM"] == [["${BASE}"]]
    assert ["ARG", f"BASE=debian:{image.SUITE}-slim"] in instructions
    (user,) = [args[0] for op, *args in instructions if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it
    assert instructions[-1][0] == "USER"  # every RUN before it has root


def test_deployment_commands_parse_with_the_real_entry_points() -> None:
    """A renamed flag must fail here, not in a crash-looping pod."""
    commands = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]["containers"][0]["command"]
        for doc in deploy_documents()
        if doc["kind"] == "Deployment"
    }
    controller = commands["flexinfer-controller"]
    assert controller[:3] == ["python", "-m", "flexinfer_k8s"]
    # The policy file is the ConfigMap mounted at /etc/flexinfer: here, deploy/'s own.
    policy = controller.index("--policy") + 1
    assert controller[policy] == "/etc/flexinfer/policy.yaml"
    arguments = [*controller[3:policy], str(ROOT / "deploy" / "policy.yaml"),
                 *controller[policy + 1:]]
    args = parse_args(arguments)
    assert (args.leader_elect, args.metrics_port, args.health_port) == (True, 8080, 8081)
    proxy = commands["flexinfer-proxy"]
    assert proxy[:3] == ["python", "-m", "flexinfer_proxy"]
    assert build_parser().parse_args(proxy[3:]).port == 8000


def test_the_mlc_llm_recipe_builds_the_default_images_and_checks_the_rendered_command() -> None:
    """No upstream mlc-llm server image exists, so the defaults are what
    deploy/mlc-llm/Dockerfile builds: its build must fail unless the command the renderer
    runs exists there, and its documented tags must be the controller's defaults."""
    text = (DEPLOY_DIR / "mlc-llm" / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line.split(None, 1) for line in text.splitlines()
                    if line and not line.startswith("#")]
    last_op, last_args = instructions[-1]
    assert last_op == "RUN"
    assert last_args.startswith(" ".join(mlc_llm.COMMAND) + " serve --help")
    assert "git lfs version" in last_args  # HF:// downloads need git-lfs
    assert ["ARG", "BASE=rocm/dev-ubuntu-22.04:6.2"] in instructions
    assert ["ARG", 'WHEELS="mlc-llm-nightly-rocm62 mlc-ai-nightly-rocm62"'] in instructions
    for vendor, tag in mlc_llm.DEFAULT_IMAGES.items():
        assert f"docker build -t {tag}" in text, vendor
    assert "mlc-ai-nightly-cu124" in text and "cuda12.4" in mlc_llm.DEFAULT_IMAGES[Vendor.NVIDIA]


def test_the_admission_policy_allows_the_host_paths_of_the_shipped_policy() -> None:
    """controller-policy.yaml cannot read the ConfigMap: its list is kept in step."""
    import re

    policy = yaml.safe_load((ROOT / "deploy" / "policy.yaml").read_text())
    admissions = [
        doc for doc in yaml.safe_load_all((ROOT / "deploy" / "controller-policy.yaml").read_text())
        if doc and doc["metadata"]["name"] in ("flexinfer-controller-pods",
                                               "flexinfer-controller-volumes")
        and doc["kind"] == "ValidatingAdmissionPolicy"
    ]
    assert len(admissions) == 2
    for admission in admissions:
        (variable,) = [v for v in admission["spec"]["variables"]
                       if v["name"] == "hostPathPrefixes"]
        assert re.findall(r"'([^']+)'", variable["expression"]) == policy["hostPathPrefixes"]
