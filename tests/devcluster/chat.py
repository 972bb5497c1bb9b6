"""A minimal OpenAI chat client for the tests that talk to a real llama-server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def chat(base_url: str, model: str, *, stream: bool, max_tokens: int = 16) -> dict[str, Any]:
    """One chat completion; returns {"content", "finish_reason", "chunks"} either way."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        if not stream:
            answer = json.load(response)
            choice = answer["choices"][0]
            return {
                "content": choice["message"]["content"],
                "finish_reason": choice["finish_reason"],
                "chunks": 1,
                "model": answer["model"],
            }
        assert response.headers.get_content_type() == "text/event-stream"
        content, finish, chunks, done, model_seen = "", None, 0, False, ""
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            chunks += 1
            model_seen = event.get("model", model_seen)
            choice = event["choices"][0]
            content += choice.get("delta", {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
        assert done, "the stream ended without data: [DONE]"
        return {"content": content, "finish_reason": finish, "chunks": chunks, "model": model_seen}


def health(base_url: str) -> tuple[int, str]:
    """(status, body) of GET /health; (0, error) when nothing answers."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, OSError) as error:
        return 0, str(error)
