"""A dynamic dim the export fixed to a constant: the error that names it and, from torch's
symbolic-shape log, the model's line that fixed it.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable
from typing import Any

import torch

from bladepack.errors import ExportError
from bladepack.export.declared_dims import AxisSpec, declared_text, derived_spec, spec_range

_CREATED = re.compile(r"create_symbol (\w+) = (\d+) for L\['([^']+)'\]\.size\(\)\[(\d+)\]")
_FIXED = re.compile(r"(?:set_replacement (\w+) = (\d+)|eval Eq\((\w+), (\d+)\) \[guard added\])")


class _Specializations(logging.Handler):
    """Watches torch's symbolic-shape log during an export: which symbol stands for which input dim, and
    the user's source line (the innermost frame outside torch) where a symbol was fixed to a constant."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.created: dict[str, tuple[str, int]] = {}  # symbol -> (argument name, axis)
        self.fixed: dict[str, str] = {}  # symbol -> source line

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if m := _CREATED.search(text):
            self.created[m.group(1)] = (m.group(3), int(m.group(4)))
        elif (m := _FIXED.search(text)) and (sym := m.group(1) or m.group(3)) not in self.fixed:
            user = [f for f in traceback.extract_stack() if not f.filename.startswith(_NOT_THE_MODEL)]
            if user:
                f = user[-1]
                self.fixed[sym] = f"{f.filename.split('/')[-1]}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


# torch's frames, bladepack's (this export call) and the log's own are not the model's
_NOT_THE_MODEL = tuple(str(m.__file__).rsplit("/", 1)[0] + "/" for m in (torch, logging)) + (
    __file__.rsplit("/", 2)[0] + "/",
)


def specialized_at(export: Callable[[], Any], name: str, axis: int) -> str | None:
    """The source line where `export()` fixes input `name`'s dim `axis`, from torch's log (None when
    the log does not say)."""
    log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    watch = _Specializations()
    level, propagate, handlers = log.level, log.propagate, list(log.handlers)
    log.handlers = [watch]
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        export()
    except Exception:
        pass  # it exported before; the log up to a failure is what is wanted
    finally:
        log.handlers = handlers
        log.setLevel(level)
        log.propagate = propagate
    for sym, (arg, a) in watch.created.items():
        if a == axis and arg.split("[")[0] == name and sym in watch.fixed:
            return watch.fixed[sym]
    return None


def refuse_specialized(
    export: Callable[[], Any],
    names: list[str],
    user: list[AxisSpec],
    samples: list[tuple[Any, ...]],
    i: int,
    axis: int,
    size: int,
) -> None:
    """A dim that varies between samples or that the user declared dynamic, which the export fixed: an
    error naming it and, where torch's log says, the line that fixed it. (Dim.AUTO lets torch decide.)"""
    varies = len({s[i].shape[axis] for s in samples}) > 1
    declared = axis in user[i] and (spec_range(user[i][axis])[0] is not None or derived_spec(user[i][axis]))
    if not (varies or declared):
        return
    where = specialized_at(export, names[i], axis)
    at = f" at {where}" if where else ""
    if varies:
        why, fix = "varies between samples", "give samples of one size to compile it static"
    else:
        why = f"is declared dynamic ({declared_text(user[i][axis])})"
        fix = "leave it out of dynamic_shapes to compile it static"
    raise ExportError(
        f"input {names[i]!r} dimension {axis} {why}, but the model fixes it to {size}{at}; make that code keep "
        f"the size symbolic, or {fix}"
    )
