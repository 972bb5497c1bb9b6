"""The live page in a real browser, over the local cluster, the controller and the real
proxy (`python -m flexinfer_proxy`): when demand moves the card to another member, the
holder the page shows changes by itself, the waiting request shows while it waits,
and the swap appears on the timeline.

Two Models share one card on kwok nodes (their pods serve nothing, so each model's
endpoint is a fake backend); the controller runs in-process. Chromium is Debian's
(tests/browser.py), driven by Playwright. Waits are Playwright's bounded waits for
what the page shows, never a timing assertion. With `FLEXINFER_UPDATE_SCREENSHOT=1`
the screenshot taken while the new holder loads replaces docs/live-page.png.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect, sync_playwright

from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_kube.resources import MODELS
from tests.browser import ensure_chromium
from tests.k8s.harness import Cluster, controller, model_body
from tests.k8s.harness import cluster as cluster
from tests.k8s.harness import crds as crds
from tests.k8s.harness import kubectl as kubectl
from tests.proxy.harness import BackendProcess, proxy_process

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "live-page.png"
WAIT_MS = 90_000  # a loaded 2-core machine: generous, never asserted as a duration
MEMBERS = ("chat", "coder")


@pytest.fixture(scope="module")
def chromium() -> Path:
    return ensure_chromium()


@pytest.fixture
def backends() -> Iterator[dict[str, BackendProcess]]:
    started = {name: BackendProcess(name) for name in MEMBERS}
    try:
        yield started
    finally:
        for backend in started.values():
            backend.stop()


def _chat(url: str, model: str, answers: list[Any]) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answers.append((response.status, json.loads(response.read())))


def test_the_page_shows_the_card_change_hands(
    local_cluster: LocalCluster,
    cluster: Cluster,
    backends: dict[str, BackendProcess],
    chromium: Path,
    tmp_path: Path,
) -> None:
    # The second member loads slowly, so its waiting request is on the page for a while.
    for name, ready_delay in zip(MEMBERS, ("1s", "12s"), strict=True):
        body = model_body(name, group="card", swap_cooldown="1s", ready_delay=ready_delay)
        cluster.api.create(MODELS, cluster.namespace, body)
    endpoints = {name: b.endpoint for name, b in backends.items()}
    with (
        controller(local_cluster, cluster.namespace),
        proxy_process(local_cluster.kubeconfig, cluster.namespace, endpoints=endpoints) as url,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=str(chromium))
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            page.goto(f"{url}/ui")
            card = page.locator('section.group[data-group$="/card"]')
            holder = card.locator(".holder")
            # Whoever the election put first; the other one is then asked for.
            expect(holder).to_have_text(re.compile(f"^({'|'.join(MEMBERS)})$"), timeout=WAIT_MS)
            first = holder.inner_text()
            other = next(m for m in MEMBERS if m != first)
            expect(page.locator("#no-swaps")).to_be_visible()

            answers: list[Any] = []
            client = threading.Thread(target=_chat, args=(url, other, answers), daemon=True)
            client.start()
            # While it waits, the page shows it waiting for that member.
            waiting = card.locator(f'tr[data-member="{other}"] td.waiting')
            expect(waiting).to_have_text("1", timeout=WAIT_MS)
            expect(page.locator(f'#waiting tr[data-model$="/{other}"]')).to_be_visible()
            # The card changes hands: the page follows without a reload.
            expect(holder).to_have_text(other, timeout=WAIT_MS)
            swap = page.locator("#swaps li").first
            expect(swap).to_contain_text(f"{first} → {other}", timeout=WAIT_MS)
            # For docs/: the new holder loading, its request waiting, the swap on the strip.
            shot = tmp_path / "live-page.png"
            page.screenshot(path=str(shot), full_page=True)
            client.join(timeout=WAIT_MS / 1000)
            assert answers and answers[0][0] == 200, answers
            expect(card.locator(".badge").first).to_have_text("Ready", timeout=WAIT_MS)
            expect(waiting).to_have_text("0", timeout=WAIT_MS)
            if os.environ.get("FLEXINFER_UPDATE_SCREENSHOT") == "1":
                SCREENSHOT.write_bytes(shot.read_bytes())
        finally:
            browser.close()
