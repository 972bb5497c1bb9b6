"""Who owns a Deployment's `spec.replicas`, read from managedFields as the API server
writes them (shapes recorded from kube-apiserver 1.37 on the local control plane:
create at 0 by the applier, hand-over apply, scale subresource to 1, then to 0)."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_k8s.apply import FIELD_MANAGER, REPLICAS_MANAGER
from flexinfer_k8s.reconcile_workload import replicas_need_handover

REPLICAS = {"f:spec": {"f:replicas": {}}}
TEMPLATE = {"f:spec": {"f:template": {}}}
BOTH = {"f:spec": {"f:replicas": {}, "f:template": {}}}
SCALE = {"subresource": "scale"}


def entry(manager: str, operation: str, fields: dict[str, Any], **extra: str) -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "fieldsV1": fields, **extra}


def deployment(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"managedFields": list(entries)}}


@pytest.mark.parametrize(
    ("moment", "fields", "handover"),
    [
        # created at replicas 0 by the applier alone: its next apply would drop the field
        ("created", [entry(FIELD_MANAGER, "Apply", BOTH)], True),
        # after the hand-over both own it: the applier may leave it out
        (
            "handed over",
            [entry(REPLICAS_MANAGER, "Apply", REPLICAS), entry(FIELD_MANAGER, "Apply", BOTH)],
            False,
        ),
        (
            "scaled to 1",
            [
                entry(FIELD_MANAGER, "Apply", TEMPLATE),
                entry(REPLICAS_MANAGER, "Update", REPLICAS, **SCALE),
            ],
            False,
        ),
        # the Scale's replicas is omitted at 0, so the API server records no owner at all:
        # no apply of ours can reset an unowned field, and a swap writes nothing more
        ("scaled to 0", [entry(FIELD_MANAGER, "Apply", TEMPLATE)], False),
        (
            "a user's kubectl scale",
            [
                entry(FIELD_MANAGER, "Apply", TEMPLATE),
                entry("kubectl", "Update", REPLICAS, **SCALE),
            ],
            False,
        ),
        ("no managedFields", [], False),
    ],
)
def test_the_replicas_are_handed_over_only_while_the_applier_alone_owns_them(
    moment: str, fields: list[dict[str, Any]], handover: bool
) -> None:
    assert replicas_need_handover(deployment(*fields)) is handover, moment
