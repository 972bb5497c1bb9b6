"""The Hugging Face download a ModelCache's Job runs: Python's standard library only.

The Job used to `pip install huggingface_hub` at run time, unpinned, with the token in
its environment: whatever PyPI served that day ran beside the token. This script needs
no package at all, so the image (`--cache-image huggingface=…`, default
`python:3.12-slim`; pin it by digest) is the whole of what runs:

1. `GET {endpoint}/api/models/{repo}/revision/main?blobs=true`: the commit and the
   files (with the sha256 of each large file);
2. the files the pattern names (`FLEXINFER_PATTERN`: a file, or a directory and all
   under it; empty: all), each from `{endpoint}/{repo}/resolve/{commit}/{file}` into
   `FLEXINFER_TARGET`, written as `<file>.partial` and renamed once whole; a large file
   whose sha256 differs from the Hub's fails the Job;
3. the token (`HF_TOKEN`, from the Secret the cache names) goes only to the Hub's own
   host, never along a redirect to another (the CDN a file is served from);
4. a name that would leave the target (`..`) fails the Job; nothing matching the
   pattern fails it too, rather than leaving an empty "ready" copy;
5. with `FLEXINFER_MAX_KIB` (a node cache's bound), files whose sizes add up to more
   fail it before a byte is written, and so does a download that grows past it.

`HF_ENDPOINT` moves the Hub (a mirror; the tests' fake one). The script is a constant,
run as `python -c HF_DOWNLOAD`; its tests run it against a local HTTP server. Pure:
text only.
"""

from __future__ import annotations

HF_DOWNLOAD = """\
import hashlib, json, os, urllib.error, urllib.parse, urllib.request

endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
repo = os.environ["FLEXINFER_REPO"]
pattern = (os.environ.get("FLEXINFER_PATTERN") or "").strip("/")
target = os.path.normpath(os.environ["FLEXINFER_TARGET"])
token = os.environ.get("HF_TOKEN") or ""
hub = urllib.parse.urlsplit(endpoint).netloc


class TokenStaysOnTheHub(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and token and urllib.parse.urlsplit(newurl).netloc == hub:
            new.add_unredirected_header("Authorization", "Bearer " + token)
        return new


opener = urllib.request.build_opener(TokenStaysOnTheHub)


def get(url):
    request = urllib.request.Request(url, headers={"User-Agent": "flexinfer-download"})
    if token:
        request.add_unredirected_header("Authorization", "Bearer " + token)
    try:
        return opener.open(request, timeout=60)
    except urllib.error.HTTPError as error:
        raise SystemExit(f"{repo}: {error.code} {error.reason} for {url}") from None


quoted = urllib.parse.quote(repo, safe="/")
with get(f"{endpoint}/api/models/{quoted}/revision/main?blobs=true") as response:
    info = json.load(response)
commit = info.get("sha") or "main"
wanted = [
    entry for entry in info.get("siblings") or []
    if not pattern or entry["rfilename"] == pattern
    or entry["rfilename"].startswith(pattern + "/")
]
if not wanted:
    raise SystemExit(f"{repo}: nothing matches {pattern or 'the repository'}")
limit = int(os.environ.get("FLEXINFER_MAX_KIB") or 0) * 1024
total = sum(int(entry.get("size") or 0) for entry in wanted)
if limit and total > limit:
    raise SystemExit(f"{repo}: {total} bytes, more than the cache's {limit} (spec.storageSize)")
written = 0
for entry in wanted:
    name = entry["rfilename"]
    path = os.path.normpath(os.path.join(target, name))
    if not path.startswith(target + os.sep):
        raise SystemExit(f"{repo}: {name!r} would be written outside the copy")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    expected = (entry.get("lfs") or {}).get("sha256")
    digest = hashlib.sha256()
    url = f"{endpoint}/{quoted}/resolve/{commit}/{urllib.parse.quote(name)}"
    with get(url) as response, open(path + ".partial", "wb") as out:
        while True:
            chunk = response.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
            written += len(chunk)
            if limit and written > limit:
                out.close()
                os.remove(path + ".partial")
                raise SystemExit(f"{repo}: more than the cache's {limit} bytes (spec.storageSize)")
    if expected and digest.hexdigest() != expected:
        os.remove(path + ".partial")
        raise SystemExit(f"{repo}: {name} has sha256 {digest.hexdigest()}, the Hub says {expected}")
    os.replace(path + ".partial", path)
    print(f"{name}: {os.path.getsize(path)} bytes", flush=True)
"""
