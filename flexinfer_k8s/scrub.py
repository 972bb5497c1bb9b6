"""What a failed pod said about itself, fit to be copied into a status.

A container's termination message (with `FallbackToLogsOnError`, the tail of its log)
can hold what should never leave the namespace's pods: a token in a URL, an
`Authorization:` header, an `HF_TOKEN=` echoed by a shell. Copied into a ModelCache's
status and Events it would be readable by everyone who may read ModelCaches. So
before that: values after secret-looking names, userinfo in URLs, Hugging Face
tokens and long opaque strings are replaced by `[redacted]`, control characters go,
and the text is bounded. Pure: text in, text out.
"""

from __future__ import annotations

import re

MAX_CHARS = 512
REDACTED = "[redacted]"

_NAMED = re.compile(
    r"(?i)\b((?:[a-z0-9_-]*(?:token|secret|password|passwd|api[_-]?key|authorization))"
    r"[\"']?\s*[:=]\s*(?:bearer\s+|basic\s+)?)[\"']?[^\s\"',;)]+"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_USERINFO = re.compile(r"(://)[^/\s@]+@")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
_OPAQUE = re.compile(r"[A-Za-z0-9+/_=-]{40,}")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def scrub(text: str, *, limit: int = MAX_CHARS) -> str:
    """`text` without secrets or control characters, at most `limit` characters (the
    end kept: a log's last lines say why it failed)."""
    cleaned = _CONTROL.sub("", _ANSI.sub("", text))
    cleaned = _NAMED.sub(lambda m: f"{m[1]}{REDACTED}", cleaned)
    cleaned = _BEARER.sub(lambda m: f"{m[1]} {REDACTED}", cleaned)
    cleaned = _USERINFO.sub(lambda m: f"{m[1]}{REDACTED}@", cleaned)
    cleaned = _HF_TOKEN.sub(REDACTED, cleaned)
    cleaned = _OPAQUE.sub(REDACTED, cleaned)
    cleaned = cleaned.strip()
    return cleaned if len(cleaned) <= limit else "…" + cleaned[-(limit - 1) :]
