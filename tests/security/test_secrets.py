"""Secrets stay where they are: a download reads only the Secret its cache names, and
what a failed pod said reaches a status only scrubbed. No cluster."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.reconcile_cache import job_failure
from flexinfer_k8s.render.cache import CacheImages, cache_from_k8s, download_job
from flexinfer_k8s.scrub import scrub


def hf_cache(**spec: Any) -> dict[str, Any]:
    body = {"source": "HF://org/gated", "storageStrategy": "SharedPVC", **spec}
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "x", "namespace": "team-a", "uid": "u"}, "spec": body}


def download_env(obj: dict[str, Any]) -> list[dict[str, Any]]:
    job = download_job(cache_from_k8s(obj), CacheImages())
    return list(job["spec"]["template"]["spec"]["containers"][0]["env"])


def test_no_secret_is_read_by_convention() -> None:
    """Creating ModelCache `x` used to hand Secret `x-hf-token` to its download."""
    env = download_env(hf_cache())
    assert [e for e in env if "valueFrom" in e] == []
    assert "HF_TOKEN" not in {e["name"] for e in env}


def test_the_token_is_the_secret_and_key_the_cache_names() -> None:
    env = download_env(hf_cache(hfTokenSecretRef={"name": "hub-token"}))
    (token,) = [e for e in env if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hub-token", "key": "token"}}
    env = download_env(hf_cache(hfTokenSecretRef={"name": "hub", "key": "hf"}))
    (token,) = [e for e in env if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hub", "key": "hf"}}
    with pytest.raises(InvalidFieldError) as raised:
        cache_from_k8s(hf_cache(hfTokenSecretRef={"key": "hf"}))
    assert raised.value.field == "spec.hfTokenSecretRef"


@pytest.mark.parametrize(("said", "kept", "gone"), [
    ("401 Unauthorized for https://huggingface.co/api/models/o/r (token hf_Abc123def456ghi)",
     "401 Unauthorized", "hf_Abc123def456ghi"),
    ('curl -H "Authorization: Bearer sk-live.abc" https://x', "Authorization: Bearer",
     "sk-live.abc"),
    ("HF_TOKEN=hf_secretsecretsecret ./run", "HF_TOKEN=", "secretsecret"),
    ("fetch https://alice:pa55w0rd@models.lan/x failed", "models.lan/x", "pa55w0rd"),
    ("x-api-key: 0123456789", "x-api-key:", "0123456789"),
    ("blob " + "A1b2" * 12 + " missing", "missing", "A1b2A1b2A1b2"),
    ("\x1b[31mError\x1b[0m: \x00disk full", "Error: disk full", "\x1b"),
])
def test_what_a_pod_said_is_scrubbed(said: str, kept: str, gone: str) -> None:
    cleaned = scrub(said)
    assert kept in cleaned
    assert gone not in cleaned


def test_prose_and_the_end_of_a_long_log_survive() -> None:
    assert scrub("the token is invalid or expired") == "the token is invalid or expired"
    long = "line\n" * 200 + "OSError: No space left on device"
    cleaned = scrub(long)
    assert len(cleaned) <= 512 and cleaned.endswith("No space left on device")


def test_a_failed_jobs_message_in_status_is_scrubbed() -> None:
    job = {"metadata": {"name": "x-download"},
           "status": {"conditions": [{"type": "Failed", "status": "True",
                                      "reason": "BackoffLimitExceeded",
                                      "message": "Job has reached the specified backoff limit"}]}}
    pod = {"metadata": {"name": "x-download-abc", "labels": {"job-name": "x-download"},
                        "creationTimestamp": "2026-01-01T00:00:00Z"},
           "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
               "reason": "Error", "exitCode": 1,
               "message": "requests.exceptions.HTTPError: 401 (Authorization: Bearer "
                          "hf_TopSecretValue123)"}}}]}}
    message = job_failure(job, [pod])
    assert "BackoffLimitExceeded" in message and "401" in message
    assert "hf_TopSecretValue123" not in message and "[redacted]" in message
