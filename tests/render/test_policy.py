"""The administrator's policy file: defaults, parsing, and errors that name the field."""

from __future__ import annotations

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.__main__ import parse_args
from flexinfer_k8s.render.policy import AdminPolicy, Taint, admin_policy_from_yaml, key_allowed


def test_the_default_tolerates_the_usual_gpu_node_taint_and_nothing_wider() -> None:
    tolerations = AdminPolicy().gpu_node_tolerations()
    assert tolerations == [
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    ]


def test_a_taint_without_a_value_is_tolerated_by_key_only() -> None:
    policy = admin_policy_from_yaml(
        "gpuNodeTaints:\n  - {key: amd.com/gpu, effect: NoExecute}\n"
        "  - {key: dedicated, value: gpu}\n"
    )
    assert policy.gpu_node_taints == (
        Taint("amd.com/gpu", "", "NoExecute"),
        Taint("dedicated", "gpu", "NoSchedule"),
    )
    assert policy.gpu_node_tolerations()[0] == {
        "key": "amd.com/gpu",
        "operator": "Exists",
        "effect": "NoExecute",
    }


def test_an_empty_document_is_the_default_policy() -> None:
    assert admin_policy_from_yaml("") == AdminPolicy()
    assert admin_policy_from_yaml("# nothing\n") == AdminPolicy()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("gpuNodeTaints: [{value: gpu}]", "gpuNodeTaints[0]"),
        ("gpuNodeTaints: [{key: a, effect: Sometimes}]", "gpuNodeTaints[0].effect"),
        ("hostPathPrefixes: [/]", "hostPathPrefixes"),
        ("hostPathPrefixes: [relative/dir]", "hostPathPrefixes"),
        ("hostPathPrefixes: [/srv/../etc]", "hostPathPrefixes"),
        ("imagePrefixes: registry.local/", "imagePrefixes"),
        ('podLabelKeys: [""]', "podLabelKeys"),
        ("gpuNodeTaint: []", "gpuNodeTaint"),
        ("[a, b]", "policy"),
        ("a: [", "policy"),
    ],
)
def test_a_bad_policy_names_its_field(text: str, field: str) -> None:
    with pytest.raises(InvalidFieldError) as raised:
        admin_policy_from_yaml(text)
    assert raised.value.field == field


def test_keys_match_exactly_or_by_prefix_glob() -> None:
    patterns = ("kubernetes.io/hostname", "flexinfer.ai/*")
    assert key_allowed("kubernetes.io/hostname", patterns)
    assert key_allowed("flexinfer.ai/gpu.vendor", patterns)
    assert not key_allowed("node-role.kubernetes.io/control-plane", patterns)
    assert not key_allowed("type", patterns)


def test_the_controller_reads_its_policy_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "policy.yaml"
    path.write_text("gpuNodeTaints: [{key: gpu, value: amd, effect: NoSchedule}]\n")
    args = parse_args(["--policy", str(path)])
    assert args.render_settings.policy.gpu_node_taints == (Taint("gpu", "amd"),)
    assert parse_args([]).render_settings.policy == AdminPolicy()


def test_a_bad_policy_file_stops_the_controller_with_the_field(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "policy.yaml"
    path.write_text("gpuNodeTaints: [{key: a, effect: Never}]\n")
    with pytest.raises(SystemExit):
        parse_args(["--policy", str(path)])
    assert "gpuNodeTaints[0].effect" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--policy", str(tmp_path / "missing.yaml")])
