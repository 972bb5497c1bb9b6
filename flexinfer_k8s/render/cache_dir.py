"""A cache's directories and who owns what is in them: the one place for the layout,
the markers and the shell that reads them.

Layout: a node-bound copy lives in `NODE_MODELS_ROOT/<namespace>/<cache>`, a RAM copy in
`MEMORY_ROOT/<namespace>/<cache>`, a claim's copy in `<modelPath>` of the claim. Every
script that touches one of them runs the rules below, so that moving these directories
(e.g. from hostPath volumes to local PersistentVolumes) changes only how they are
mounted, never what is written.

Ownership, the rule that protects a user's data: flexinfer writes only into a directory
that is empty or holds one of its markers.

- `BUSY_MARKER` (`.flexinfer-downloading`) is written before anything else and holds
  the source being written; `COMPLETE_MARKER` (`.flexinfer-complete`) is written last
  (atomically, through a rename) and holds the source the copy is of. Either one means
  "flexinfer wrote this directory": it may empty and rewrite it.
- A directory with files but neither marker is the user's. It is *adopted*: used as it
  is when it holds a model (`model_evidence` below says what counts), refused otherwise,
  and in both cases never written, rewritten or removed.
- A complete copy of the same source is not downloaded again.

A script reports what it found on one line, `flexinfer: <result> <detail>`, written to
its termination message (the file named by its second argument), where the controller
reads it back (`parse_result`). A directory it must not write fails the pod with exit
code `REFUSED_EXIT_CODE` (the Job's pod failure policy fails the Job at once).

Pure: strings and values; the scripts run in pods (busybox `sh` or any POSIX shell).
"""

from __future__ import annotations

import enum
import re

import attrs

COMPLETE_MARKER = ".flexinfer-complete"
"""Written last by every filler (download Job, flash loader), holding the source."""
BUSY_MARKER = ".flexinfer-downloading"
"""Written first by every filler, removed after `COMPLETE_MARKER` is in place."""
NODE_MODELS_ROOT = "/var/lib/flexinfer/models"
MEMORY_ROOT = "/dev/shm/flexinfer"
REFUSED_EXIT_CODE = 3
"""Exit code of a script that found a directory it must not write (or nothing to use)."""
TERMINATION_LOG = "/dev/termination-log"
IGNORED_ENTRIES = ("lost+found",)
"""Entries that do not make a directory "populated" (a fresh ext4 volume's root)."""


def node_dir(namespace: str, name: str) -> str:
    return f"{NODE_MODELS_ROOT}/{namespace}/{name}"


def memory_dir(namespace: str, name: str) -> str:
    return f"{MEMORY_ROOT}/{namespace}/{name}"


class DirResult(enum.StrEnum):
    """What a script found in (and did to) a cache's directory."""

    DOWNLOADED = "downloaded"
    """It was empty or flexinfer's: the source is now there, complete."""
    PRESENT = "present"
    """A complete copy of the same source was already there: nothing downloaded."""
    ADOPTED = "adopted"
    """It held a model flexinfer did not write: used as it is, never written."""
    FOREIGN = "foreign"
    """It held files flexinfer did not write and no model: refused, nothing written."""
    EMPTY = "empty"
    """No source to download and nothing there to adopt."""
    CLEANED = "cleaned"
    """The cleanup: flexinfer's directories removed, any other kept."""


@attrs.frozen
class ScriptReport:
    result: DirResult
    detail: str


_REPORT = re.compile(r"^flexinfer: ([a-z]+) ?(.*)$")


def parse_result(message: str | None) -> ScriptReport | None:
    """The last `flexinfer: <result> <detail>` line of a termination message, if any."""
    found = None
    for line in str(message or "").splitlines():
        match = _REPORT.match(line.strip())
        if match and match[1] in DirResult.__members__.values():
            found = ScriptReport(DirResult(match[1]), match[2].strip())
    return found


# -- the shell -------------------------------------------------------------------------

# Shared by every script: `report` writes the result line where the kubelet reads the
# termination message (and to the log); `model_evidence` names the file that makes a
# directory a model, or prints nothing. What counts, per format:
#   - the file or directory the source names (FLEXINFER_ENTRY), when it names one;
#   - otherwise mlc-llm's `mlc-chat-config.json`; a `*.gguf` file (llama.cpp, Ollama);
#     `config.json` with `*.safetensors` or `*.bin` weights (vLLM, Hugging Face); an
#     Ollama store (`manifests/` and `blobs/`).
_FUNCTIONS = """\
report() { printf '%s\\n' "$*"; printf '%s\\n' "$*" > "$result" 2>/dev/null || true; }
model_evidence() {
  d="$1"
  if [ -n "${FLEXINFER_ENTRY:-}" ]; then
    if [ -e "$d/$FLEXINFER_ENTRY" ]; then echo "$FLEXINFER_ENTRY"; fi
    return 0
  fi
  if [ -f "$d/mlc-chat-config.json" ]; then echo "mlc-chat-config.json (mlc-llm)"; return 0; fi
  for f in "$d"/*.gguf; do
    if [ -f "$f" ]; then echo "${f##*/} (GGUF)"; return 0; fi
  done
  if [ -f "$d/config.json" ]; then
    for f in "$d"/*.safetensors "$d"/*.bin; do
      if [ -f "$f" ]; then echo "config.json and ${f##*/} (Hugging Face)"; return 0; fi
    done
  fi
  if [ -d "$d/manifests" ] && [ -d "$d/blobs" ]; then echo "manifests/ and blobs/ (Ollama)"; fi
  return 0
}
foreign_entries() {
  ls -A "$1" | grep -v -x -e 'lost+found' | head -n 5 | tr '\\n' ' '
}
"""

# Before a download: decide whether this directory may be written, and say so. Reads
# FLEXINFER_SOURCE (the source, as recorded in the markers; "" when none) and exits when
# there is nothing to write; afterwards the directory is flexinfer's, marked busy, empty.
_GUARD = """\
set -eu
target="$1"; result="$2"
done_marker="$target/@COMPLETE@"; busy_marker="$target/@BUSY@"
@FUNCTIONS@
mkdir -p "$target"
if [ -f "$done_marker" ] && [ "$(cat "$done_marker")" = "$FLEXINFER_SOURCE" ] \\
    && [ -n "$FLEXINFER_SOURCE" ]; then
  rm -f "$busy_marker"
  report "flexinfer: present $FLEXINFER_SOURCE"
  exit 0
fi
if [ ! -f "$done_marker" ] && [ ! -f "$busy_marker" ]; then
  others="$(foreign_entries "$target")"
  if [ -n "$others" ]; then
    evidence="$(model_evidence "$target")"
    if [ -n "$evidence" ]; then
      report "flexinfer: adopted $evidence"
      exit 0
    fi
    report "flexinfer: foreign $others"
    exit @REFUSED@
  fi
fi
if [ -z "$FLEXINFER_SOURCE" ]; then
  if [ -f "$done_marker" ]; then
    report "flexinfer: present $(cat "$done_marker")"
    exit 0
  fi
  report "flexinfer: empty"
  exit @REFUSED@
fi
printf '%s\\n' "$FLEXINFER_SOURCE" > "$busy_marker"
rm -f "$done_marker"
find "$target" -mindepth 1 -maxdepth 1 ! -name '@BUSY@' ! -name 'lost+found' \\
  -exec rm -rf {} +
"""

# After a download: no symbolic link survives it (a link in a node directory that a later
# host path runs through would be followed on the node: `file://…/link` → `/`); the
# completion marker last (renamed into place, so it is never half-written), then the
# busy marker goes.
_FINISH = """
find "$target" -type l -exec rm -f {} +
if [ -n "${FLEXINFER_MAX_KIB:-}" ]; then
  used="$(du -sk "$target" | cut -f1)"
  if [ "$used" -gt "$FLEXINFER_MAX_KIB" ]; then
    find "$target" -mindepth 1 -maxdepth 1 ! -name '@BUSY@' ! -name 'lost+found' \\
      -exec rm -rf {} +
    report "flexinfer: too large: the copy is ${used} KiB, more than the cache's" \\
      "${FLEXINFER_MAX_KIB} KiB (spec.storageSize)"
    exit @REFUSED@
  fi
fi
printf '%s\\n' "$FLEXINFER_SOURCE" > "$done_marker.partial"
mv "$done_marker.partial" "$done_marker"
rm -f "$busy_marker"
report "flexinfer: downloaded $FLEXINFER_SOURCE"
"""


def _fill(template: str) -> str:
    return (
        template.replace("@FUNCTIONS@", _FUNCTIONS)
        .replace("@COMPLETE@", COMPLETE_MARKER)
        .replace("@BUSY@", BUSY_MARKER)
        .replace("@REFUSED@", str(REFUSED_EXIT_CODE))
    )


def download_script(body: str) -> str:
    """A complete download script: the guard, `body` (which fills "$target"), the
    markers. Run as `sh -c SCRIPT download <target> <termination log> [args for body]`;
    positional arguments past the second are the body's `$3`…"""
    return _fill(_GUARD) + body.rstrip("\n") + "\n" + _fill(_FINISH)


CLEANUP_SCRIPT = _fill(
    """\
set -eu
result="$1"; shift
@FUNCTIONS@
removed=""; kept=""
for d in "$@"; do
  if [ ! -e "$d" ]; then continue; fi
  if [ -f "$d/@COMPLETE@" ] || [ -f "$d/@BUSY@" ]; then
    rm -rf "$d"; removed="$removed $d"
  elif [ -z "$(ls -A "$d")" ]; then
    rmdir "$d"; removed="$removed $d"
  else
    kept="$kept $d"
  fi
done
report "flexinfer: cleaned removed:${removed:- none} kept:${kept:- none}"
"""
)
"""Removes each directory given that flexinfer wrote (one of its markers) or that is
empty, keeps any other. `sh -c CLEANUP_SCRIPT cleanup <termination log> <dir>…`."""


FLASH_LOADER_SCRIPT = _fill(
    """\
set -eu
src=/cache-source; dst="$1"; trust="${2:-}"; result=/dev/null
marker=@COMPLETE@; busy=@BUSY@
@FUNCTIONS@
if [ ! -f "$src/$marker" ] && [ "$trust" != adopted ]; then
  echo "flash-loader: the backing copy in $src is incomplete ($marker missing)" >&2
  exit 1
fi
mkdir -p "$dst"
if [ ! -f "$dst/$marker" ] && [ ! -f "$dst/$busy" ] && [ -n "$(foreign_entries "$dst")" ]; then
  echo "flash-loader: $dst holds files flexinfer did not write ($(foreign_entries "$dst")):" \\
    "it never replaces them; remove them on the node" >&2
  exit 1
fi
if [ -n "${FLEXINFER_MAX_KIB:-}" ]; then
  need="$(du -sk "$src" | cut -f1)"
  if [ "$need" -gt "$FLEXINFER_MAX_KIB" ]; then
    echo "flash-loader: the copy is ${need} KiB, more than the cache's ${FLEXINFER_MAX_KIB}" \
      "KiB (spec.storageSize): not loaded into memory" >&2
    exit 1
  fi
fi
touch "$dst/$busy"
rm -f "$dst/$marker"
cd "$src"
find . -type f ! -name "$marker" ! -name "$busy" | while IFS= read -r f; do
  if [ -f "$dst/$f" ] && [ "$(stat -c '%s %Y' "$f")" = "$(stat -c '%s %Y' "$dst/$f")" ]; then
    continue
  fi
  mkdir -p "$dst/$(dirname "$f")"
  cp -p "$f" "$dst/$f.flexinfer-partial"
  mv "$dst/$f.flexinfer-partial" "$dst/$f"
done
cd "$dst"
find . -type f ! -name "$marker" ! -name "$busy" | while IFS= read -r f; do
  [ -f "$src/$f" ] || rm -f "$f"
done
find . -depth -mindepth 1 -type d -empty -exec rmdir {} \\;
touch "$dst/$marker"
rm -f "$dst/$busy"
"""
)
"""Brings a RAM copy up to date from its backing copy (`render.cache` mounts them):
`sh -c FLASH_LOADER_SCRIPT flash-loader <ram dir> [adopted]`. The backing copy must carry
`COMPLETE_MARKER`, unless the controller adopted it (`adopted`: a user's copy, complete
as it is); the RAM directory is flexinfer's own and is refused if it holds anything else."""
