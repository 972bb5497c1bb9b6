"""Real tokens end to end: the rendered llama.cpp command runs as a real llama-server on
the dev cluster's process node, and the proxy streams its completions across swaps.

A Model with backend `llama-cpp` and a tiny random-weight GGUF is rendered by the
controller; the scheduler binds its pod to the process node, which runs the cached
`llama-server` with the rendered flags (only `--host` mapped: a flag the server
rejected would crash-loop the pod and fail these tests); the proxy finds the
rendered Service by cluster DNS, resolved through the runner's hosts file.
"""


from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_core import Policy
from flexinfer_devcluster import gpudriver
from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_devcluster.policy import dev_policy
from flexinfer_devcluster.processnode import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION
from flexinfer_devcluster.tinymodel import write_tiny_model
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_kube.resources import MODELS
from tests.k8s.harness import (
    Cluster,
    MemoryTimeline,
    PodTimeline,
    controller,
    drains_observed,
)
from tests.k8s.kubectl import create_namespace, delete_namespace, install_crds, kubectl_for
from tests.polling import wait_until

pytestmark = pytest.mark.k8s
DEADLINE_SECONDS = 300.0  # real servers on 2 shared cores: a generous bound, not a timing


def async_test(coro_fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(coro_fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(coro_fn(*args, **kwargs), DEADLINE_SECONDS))

    return wrapper

ROOT = Path(__file__).resolve().parents[2]
POLICY = Policy(
    demand_window=timedelta(seconds=3),
    recent_window=timedelta(seconds=4),
    default_swap_cooldown=timedelta(0),
)


def tiny_model_body(name: str, model_file: Path) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {
            "backend": "llama-cpp",
            "source": f"file://{model_file}",
            "gpu": {"shared": "tiny", "swapCooldown": "0s"},
            "serverless": {"idleTimeout": "5m", "coldStartTimeout": "60s"},
            "llamacpp": {"ctxSize": 256},
            "nodeSelector": dict(PROCESS_NODE_SELECTOR),
            "tolerations": [dict(PROCESS_NODE_TOLERATION)],
        },
    }


@pytest.fixture(scope="module")
def process_node(local_cluster: LocalCluster, llama_server: Path) -> Iterator[None]:
    local_cluster.add_process_node()
    yield
    local_cluster.remove_process_node()


@pytest.fixture()
def cluster(local_cluster: LocalCluster, process_node: None) -> Iterator[Cluster]:
    install_crds(local_cluster)
    kubectl = kubectl_for(local_cluster)
    # "baseline": a file:// model and Memory caches reach their host directories
    # through claims on local volumes, never a hostPath.
    namespace = create_namespace(kubectl, "tokens")
    try:
        yield Cluster(local_cluster, namespace)
    finally:
        delete_namespace(kubectl, namespace)


@pytest.fixture()
def proxy(local_cluster: LocalCluster, cluster: Cluster) -> Iterator[str]:
    process = subprocess.Popen(
        [
            sys.executable, "-m", "flexinfer_proxy",
            "--host", "127.0.0.1", "--port", "0",
            "--kubeconfig", str(local_cluster.kubeconfig),
            "--namespace", cluster.namespace,
            "--resolve-file", str(local_cluster.hosts_file),
            "--min-queue-wait", "90s",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    try:
        assert line.startswith("listening on 127.0.0.1:"), f"proxy did not start: {line!r}"
        yield f"http://127.0.0.1:{line.strip().rsplit(':', 1)[1]}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def chat(model: str, *, stream: bool, max_tokens: int = 12) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "say something"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def complete(session: aiohttp.ClientSession, base: str, model: str,
                   *, stream: bool) -> tuple[int, str, dict[str, str]]:
    """(status, generated text, headers) of one chat completion through the proxy."""
    async with session.post(f"{base}/v1/chat/completions",
                            json=chat(model, stream=stream)) as response:
        headers = dict(response.headers)
        if response.status != 200:
            return response.status, await response.text(), headers
        if not stream:
            body = await response.json()
            return 200, str(body["choices"][0]["message"]["content"]), headers
        text, done = [], False
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                done = True
                break
            delta = json.loads(data)["choices"][0].get("delta") or {}
            text.append(str(delta.get("content") or ""))
        assert done, "the stream ended without [DONE]"
        return 200, "".join(text), headers


@async_test
async def test_a_rendered_llama_cpp_model_answers_through_the_proxy(
    local_cluster: LocalCluster, cluster: Cluster, proxy: str, tiny_model: Path
) -> None:
    c = cluster
    await asyncio.to_thread(c.api.create, MODELS, c.namespace,
                            tiny_model_body("tiny-a", tiny_model))
    with controller(local_cluster, c.namespace, policy=POLICY):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=150)) as session:
            # Cold: the request waits while the model is swapped in, then gets tokens.
            status, text, _ = await complete(session, proxy, "tiny-a", stream=False)
            assert status == 200, text
            assert text.strip(), "no tokens came back"
            status, streamed, _ = await complete(session, proxy, "tiny-a", stream=True)
            assert status == 200, streamed
            assert streamed.strip()
        pod = c.ready_pods("tiny-a")[0]
        assert pod["spec"]["nodeName"] == local_cluster.process_node.name
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--alias") + 1] == "tiny-a"


@async_test
async def test_a_swap_under_load_loses_no_request_and_never_overlaps(
    local_cluster: LocalCluster, cluster: Cluster, proxy: str, tiny_model: Path
) -> None:
    c = cluster
    for name in ("tiny-a", "tiny-b"):
        await asyncio.to_thread(c.api.create, MODELS, c.namespace,
                                tiny_model_body(name, tiny_model))
    timeline = PodTimeline(c)
    outcomes: list[tuple[str, int, str, dict[str, str]]] = []
    with controller(local_cluster, c.namespace, policy=POLICY):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

            async def ask(model: str, *, stream: bool) -> None:
                status, text, headers = await complete(session, proxy, model, stream=stream)
                outcomes.append((model, status, text, headers))

            # Demand alternates: a burst for one model, then (once its demand window has
            # passed) a burst for the other, while streams of the first may still run.
            for model in ("tiny-a", "tiny-b", "tiny-a", "tiny-b"):
                burst = [ask(model, stream=i % 2 == 0) for i in range(4)]
                await asyncio.gather(*burst)
                await asyncio.sleep(POLICY.demand_window.total_seconds() + 0.5)
    timeline.stop()
    assert len(outcomes) == 16  # none lost
    for model, status, text, headers in outcomes:
        if status == 200:
            assert text.strip(), f"{model}: an empty completion"
        else:
            assert status == 503 and "Retry-After" in headers, (model, status, text)
    served = {m for m, status, _, _ in outcomes if status == 200}
    assert served == {"tiny-a", "tiny-b"}
    assert timeline.violations == []
    assert timeline.created_apps()[:2] == ["tiny-a", "tiny-b"]


# The drain tests' answers must still be generating when high is asked for (and, for
# the deadline test, at the deadline). llama-server
# caps each slot's context at the model's training context, whatever --ctx-size says, and
# stops an answer that fills it (no context shift): the default tiny model's 2048 ended
# every answer at 2016 tokens ("length"), some 1.5 s: on a quiet machine the deadline
# test's answer ended before its deadline and the drain test's drain could be over
# before its phase was read (a loaded machine was slow enough to hide both).
LONG_CONTEXT = 16384
LONG_ANSWER = 8000  # tokens: some 15 s of generation on a quiet machine, a minute on a busy one


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-long.gguf", seed=0, context_length=LONG_CONTEXT
    )


@async_test
async def test_a_long_answer_finishes_before_a_more_important_model_takes_the_card(
    local_cluster: LocalCluster, cluster: Cluster, proxy: str, long_context_model: Path
) -> None:
    # docs/election.md 1.6: low streams a long answer; a request for high (more
    # important) arrives in the middle. low drains: its stream runs to its end, token
    # for token, then high is swapped in and answers. Never two servers at once.
    c = cluster
    for name, priority in (("low", 100), ("high", 300)):
        body = tiny_model_body(name, long_context_model)
        body["spec"]["gpu"]["priority"] = priority
        body["spec"]["llamacpp"] = {"ctxSize": LONG_CONTEXT}
        await asyncio.to_thread(c.api.create, MODELS, c.namespace, body)
    timeline = PodTimeline(c)
    # The default demand window: the proxy refreshes a waiting request's demand once a
    # minute, so with the short windows above high would stop being demanded while it
    # waits, and the election would (rightly) give the card back to the draining low.
    policy = Policy(default_swap_cooldown=timedelta(0))
    with controller(local_cluster, c.namespace, policy=policy) as ctl:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=280)) as session:
            status, text, _ = await complete(session, proxy, "low", stream=False)  # warm
            assert status == 200, text
            long = {**chat("low", stream=True, max_tokens=3000), "ignore_eos": True}
            events: list[str] = []
            phases: set[str] = set()
            async with session.post(f"{proxy}/v1/chat/completions", json=long) as stream:
                assert stream.status == 200
                first = await stream.content.readuntil(b"\n\n")
                events.append(first.decode().strip())
                high = asyncio.create_task(complete(session, proxy, "high", stream=False))
                async for raw in stream.content:
                    line = raw.decode().strip()
                    if line:
                        events.append(line)
                    if len(events) % 50 == 0:
                        phases.add(str((await asyncio.to_thread(c.status, "low")).get("phase")))

                    # A slow reader (5 ms a line, some 15 s in all): the answer is still
                    # being generated, so in flight, for seconds after high was asked
                    # for (once generated, the proxy hands it to the sockets' buffers).
                    await asyncio.sleep(0.005)
            status, text, _ = await high
        drains = drains_observed(ctl.scrape(), c.namespace, "low")
    timeline.stop()
    print(f"flexinfer_drain_seconds of low: {drains}")
    assert events[-1] == "data: [DONE]", events[-3:]
    chunks = [json.loads(e.removeprefix("data:")) for e in events[:-1] if e.startswith("data:")]
    assert not [x for x in chunks if "error" in x], "the stream was cut"
    finish = [x["choices"][0].get("finish_reason") for x in chunks if x.get("choices")]
    assert finish[-1] == "length"  # it ran to its max_tokens
    assert status == 200 and text.strip(), text
    assert "Draining" in phases, phases  # low drained while its answer ran
    assert list(drains) == ["drained"] and drains["drained"][0] == 1, drains  # once, by its count
    assert timeline.violations == []
    assert timeline.created_apps()[:2] == ["low", "high"]


async def stream_raw(
    base: str, body: dict[str, Any], *, after_first: Callable[[], object]
) -> tuple[list[str], bool]:
    """The lines of one streamed answer, read straight off the socket as they come, and
    whether it was cut (the connection ended before the last chunk).

    Not aiohttp: once a connection breaks, its reader raises at once and drops what it
    had buffered, the error event with it when the reader was behind.
    """
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (host.encode(), len(payload), payload)
    )
    lines: list[str] = []
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower(), head
        pending = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                return lines, False
            pending += await reader.readexactly(size)
            await reader.readexactly(2)
            *complete_lines, pending = pending.split(b"\n")
            for line in complete_lines:
                if line.strip():
                    lines.append(line.decode().strip())
                    if len(lines) == 1:
                        after_first()
    except (asyncio.IncompleteReadError, ConnectionError):
        return lines, True
    finally:
        writer.close()


@async_test
async def test_a_long_answer_past_the_drain_timeout_is_cut_with_an_error_event(
    local_cluster: LocalCluster, cluster: Cluster, proxy: str, long_context_model: Path
) -> None:
    # docs/election.md 1.6, the deadline: low's drain timeout (3 s) is far shorter than
    # its answer, so at the deadline low is scaled to 0, the proxy ends its stream with
    # the explicit error event (never a silent cut, never [DONE]), and high answers.
    # Never two servers at once. The answer is still being generated at the deadline
    # (an answer the proxy already has whole is relayed to its end, not cut): a model
    # that declares a 16k training context, so the server's slot holds the whole
    # 8000-token answer, read as it comes. Each token costs more than the last (its
    # attention reads every one before it): some 1300 a second at first, a few hundred
    # past 5000 on two cores. Without the deadline it runs to [DONE] (seen).
    c = cluster
    for name, priority in (("low", 100), ("high", 300)):
        body = tiny_model_body(name, long_context_model)
        body["spec"]["gpu"]["priority"] = priority
        body["spec"]["llamacpp"] = {"ctxSize": LONG_CONTEXT}
        if name == "low":
            body["spec"]["gpu"]["drainTimeout"] = "3s"
        await asyncio.to_thread(c.api.create, MODELS, c.namespace, body)
    timeline = PodTimeline(c)
    # The default demand window, as in the test above: high stays demanded while it waits.
    policy = Policy(default_swap_cooldown=timedelta(0))
    with controller(local_cluster, c.namespace, policy=policy) as ctl:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=280)) as session:
            status, text, _ = await complete(session, proxy, "low", stream=False)  # warm
            assert status == 200, text
            long = {**chat("low", stream=True, max_tokens=LONG_ANSWER), "ignore_eos": True}
            asked: list[asyncio.Task[tuple[int, str, dict[str, str]]]] = []
            times: dict[str, float] = {}

            def ask_high() -> None:
                times["asked"] = time.monotonic()
                task = asyncio.create_task(complete(session, proxy, "high", stream=False))
                task.add_done_callback(lambda _: times.setdefault("answered", time.monotonic()))
                asked.append(task)

            events, cut = await stream_raw(proxy, long, after_first=ask_high)
            times["cut"] = time.monotonic()
            (high,) = asked
            status, text, _ = await high
            # Not asserted (timings): the 3 s drain, then low's server stopping
            # (docs/proxy.md, Preemption: one that hangs on SIGTERM goes at its 33 s grace
            # period) and high's load.
            print(
                f"low's stream cut {times['cut'] - times['asked']:.1f} s and high answered "
                f"{times['answered'] - times['asked']:.1f} s after high was asked"
            )
        low = await asyncio.to_thread(c.status, "low")
        drains = drains_observed(ctl.scrape(), c.namespace, "low")
    timeline.stop()
    print(f"flexinfer_drain_seconds of low: {drains}")
    chunks = [json.loads(e.removeprefix("data:")) for e in events if e.startswith("data: {")]
    finish = [x["choices"][0].get("finish_reason") for x in chunks if x.get("choices")]
    assert "data: [DONE]" not in events, (
        f"the stream ran to its end ({len(chunks)} events, finish_reason {finish[-1:]}):"
        " no deadline was hit"
    )
    assert cut, "the stream ended cleanly without [DONE]"
    last = json.loads(events[-1].removeprefix("data:"))
    assert last["error"]["code"] == "stream_cut", events[-3:]
    assert "was stopped" in last["error"]["message"], last
    assert "scaled to zero" in last["error"]["message"], last
    tokens = [e for e in events[:-1] if e.startswith("data:")]
    assert len(tokens) > 1  # it streamed before it was cut
    # low drained, once, until its deadline (flexinfer_drain_seconds).
    assert list(drains) == ["deadline"], drains
    assert drains["deadline"][0] == 1 and drains["deadline"][1] >= 3, drains
    assert low["phase"] == "Preempted" and low["sharedGroup"]["preemptedBy"] == "high", low
    assert status == 200 and text.strip(), text
    assert timeline.violations == []
    assert timeline.created_apps()[:2] == ["low", "high"]


# docs/election.md 1.7 with real servers: three Models in one budgeted group on the
# process node, their pods sharing the group's ResourceClaim (the fake DRA driver's one
# device of the process node). The process node runs them on the CPU, so a footprint is
# what a Model declares (`vramEstimate`): two small ones fit together (16 of 24 GiB);
# the third is larger (16 GiB) and more important, and fits beside one of them only.
PACKED_BUDGET = 24  # GiB
PACKED = {"small-a": (8, 100), "small-b": (8, 100), "large": (16, 300)}
PACKED_ANSWER = 3000  # tokens each: long enough that two answers overlap, on any load
QUEUE_HEADER = "x-flexinfer-queue-position"


def packed_body(name: str, model_file: Path) -> dict[str, Any]:
    size, priority = PACKED[name]
    body = tiny_model_body(name, model_file)
    body["spec"]["gpu"] |= {
        "shared": "packed",
        "priority": priority,
        "vramBudget": f"{PACKED_BUDGET}Gi",
        "vramEstimate": f"{size}Gi",
    }
    body["spec"]["llamacpp"] = {"ctxSize": LONG_CONTEXT}
    return body


async def timed_stream(
    session: aiohttp.ClientSession, base: str, model: str
) -> tuple[float, float, int, dict[str, str]]:
    """(when its first token came, when it ended, tokens, headers) of one long answer."""
    loop = asyncio.get_running_loop()
    body = {**chat(model, stream=True, max_tokens=PACKED_ANSWER), "ignore_eos": True}
    first, tokens = 0.0, 0
    async with session.post(f"{base}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        headers = dict(response.headers)
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data:"))
            assert "error" not in chunk, chunk
            if (chunk.get("choices") or [{}])[0].get("delta", {}).get("content"):
                tokens += 1
                first = first or loop.time()
    return first, loop.time(), tokens, headers


def pod_names(c: Cluster, name: str) -> set[str]:
    return {p["metadata"]["name"] for p in c.pods(name)}


@async_test
async def test_two_packed_models_answer_at_once_and_a_larger_one_evicts_just_enough(
    local_cluster: LocalCluster, cluster: Cluster, proxy: str, long_context_model: Path
) -> None:
    c = cluster
    for name in PACKED:
        await asyncio.to_thread(c.api.create, MODELS, c.namespace,
                                packed_body(name, long_context_model))  # fmt: skip
    footprints = {name: size for name, (size, _) in PACKED.items()}
    timeline = MemoryTimeline(c, footprints=footprints, budget=PACKED_BUDGET)
    shared_card = RenderSettings(policy=dev_policy(), gpu_device_class=gpudriver.DEVICE_CLASS)
    # The default demand window: large stays asked for while it waits for its room.
    policy = Policy(default_swap_cooldown=timedelta(0))
    small = ("small-a", "small-b")
    with controller(local_cluster, c.namespace, policy=policy, settings=shared_card):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=280)) as session:
            # Cold: both small ones asked for at once; they fit together, so both start.
            cold = await asyncio.gather(*(complete(session, proxy, n, stream=False)
                                          for n in small))  # fmt: skip
            for status, text, _ in cold:
                assert status == 200 and text.strip(), text
            await asyncio.to_thread(wait_until, lambda: c.holders() == set(small),
                                    what="both small models to hold the card")  # fmt: skip
            pods = {n: await asyncio.to_thread(pod_names, c, n) for n in small}
            assert all(len(p) == 1 for p in pods.values()), pods

            # Warm: a long answer from each at once. Both run together, each on its own
            # server: neither waits in a queue, nothing is swapped.
            answers = await asyncio.gather(*(timed_stream(session, proxy, n) for n in small))
            firsts, ends = [a[0] for a in answers], [a[1] for a in answers]
            together, whole = min(ends) - max(firsts), max(ends) - min(firsts)
            print(f"two packed answers of {PACKED_ANSWER} tokens each: both streamed "
                  f"together for {together:.1f} s of {whole:.1f} s")  # fmt: skip
            assert max(firsts) < min(ends), f"the answers did not overlap: {answers}"
            for _, _, tokens, headers in answers:
                assert tokens > 1
                assert QUEUE_HEADER not in {h.lower() for h in headers}, headers
            assert {n: await asyncio.to_thread(pod_names, c, n) for n in small} == pods
            assert sorted(app for app, _ in timeline.created) == sorted(small)

            # The larger, more important one: 16 GiB with 8 free. It evicts one small
            # model (just enough), waits for its pod to be gone, and answers.
            status, text, _ = await complete(session, proxy, "large", stream=False)
            assert status == 200 and text.strip(), text
            holders = await asyncio.to_thread(c.holders)
            assert "large" in holders and len(holders) == 2, holders
            (survivor,) = holders & set(small)
            (evicted,) = set(small) - holders
            # The survivor kept its seat and its server: the same pod answers, warm.
            assert await asyncio.to_thread(pod_names, c, survivor) == pods[survivor]
            status, text, headers = await complete(session, proxy, survivor, stream=False)
            assert status == 200 and text.strip(), text
            assert QUEUE_HEADER not in {h.lower() for h in headers}, headers
            await asyncio.to_thread(wait_until, lambda: not c.pods(evicted),
                                    what=f"{evicted}'s pod to be gone")  # fmt: skip
            # Evicted by large, once, and told so (since, still asked for, it waits for
            # room: WaitingForVram, "may not evict large, ...").
            status = await asyncio.to_thread(c.status, evicted)
            assert status["sharedGroup"]["preemptedBy"] == "large", status
            events = await asyncio.to_thread(c.events, evicted)
            assert [e["message"] for e in events if e["reason"] == "Preempted"] == [
                f"{evicted} was preempted by large: {evicted} needs 8 GiB, 0 free; large leads"
            ], events
    timeline.stop()
    print(f"most footprint of live pods at once: {timeline.peak} of {PACKED_BUDGET} GiB")
    assert timeline.violations == []
    assert [app for app, _ in timeline.created][2:] == ["large"]
