"""The core's `InvalidFieldError` in the user's words: the object's field and its value.

A snapshot validator names its own attribute (`ModelState(a).priority: 5000 must be
between 0 and 1000`); a user reads the object's YAML. Converters build snapshots
inside `user_fields`, which re-raises such an error naming the object's field
(`spec.gpu.priority`) and the value stored there, so a condition or an Event points
at the line to fix. Pure: no client, no clock, no decisions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from flexinfer_core import InvalidFieldError
from flexinfer_kube.objects import get_path


@contextlib.contextmanager
def user_fields(obj: Mapping[str, Any], paths: Mapping[str, str]) -> Iterator[None]:
    """Re-raise an `InvalidFieldError` about a snapshot attribute that `paths` maps to a
    dotted path of `obj` (`{"priority": "spec.gpu.priority"}`) as an error about that
    path, holding the value `obj` has there; any other error passes unchanged."""
    try:
        yield
    except InvalidFieldError as error:
        path = paths.get(error.attribute)
        if path is None:
            raise
        raise error.renamed(path, get_path(obj, *path.split("."))) from None
