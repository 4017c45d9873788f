"""Progress of `optimize`: stage lines on the `bladepack` logger, and a bar on a terminal.

Note [Progress]: an optimize takes 15-70 s on real models, most of it compiling kernel libraries, and
said nothing meanwhile. Each stage (export, passes, plan, each kernel library's compile, ...) is now
logged at INFO when it ends, with its time; BLADEPACK_LOG=info (or debug) makes the `bladepack` logger
print to stderr. On a terminal (stderr a TTY) with tqdm installed (the `progress` extra), a bar names
the running stage instead; BLADEPACK_PROGRESS=0 turns the bar off, =1 forces it. Without a bar and
without those log lines, a stage still running after 5 s says so on stderr ("bladepack: build (cpu)
..."), then each unit of work it finishes and its end with its time, so a long optimize is never
silent off a terminal; CompileOptions.quiet (BLADEPACK_QUIET=1) turns those lines off.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("bladepack")
_HANDLER_NAME = "bladepack-stderr"


def configure_logging(level: str) -> None:
    """Apply BLADEPACK_LOG ("" when unset: nothing changes): the logger's level, and a stderr handler
    (once) when it asks for INFO or DEBUG lines, which Python's default handling would drop."""
    if not level:
        return
    numeric = logging.getLevelName(level)
    if not isinstance(numeric, int):
        return
    log.setLevel(numeric)
    if numeric < logging.WARNING and not any(h.get_name() == _HANDLER_NAME for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)


def _bar_wanted(setting: str) -> bool:
    if setting == "0":
        return False
    if setting != "1" and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


class Progress:
    """The stages of one optimize. `stage(name)` times a stage; `done(what)` reports a unit of work
    inside one (a compiled library)."""

    def __init__(self, stages: int, setting: str = "auto", quiet: bool = False, slow_s: float = 5.0) -> None:
        self._bar: Any = None
        if _bar_wanted(setting):
            from tqdm import tqdm

            self._bar = tqdm(total=stages, desc="bladepack", unit="stage", leave=False, file=sys.stderr)
        self._t0 = time.perf_counter()
        self._quiet, self._slow_s = quiet, slow_s
        self._running: list[threading.Event] = []  # per running stage (stages nest): it said it is slow

    def _speaks(self) -> bool:
        """Whether slow stages print their own lines: no bar, not quiet, and no INFO log lines already."""
        return self._bar is None and not self._quiet and not (log.isEnabledFor(logging.INFO) and log.handlers)

    def _say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        if self._bar is not None:
            self._bar.set_description_str(f"bladepack: {name}")
        log.debug("bladepack: %s ...", name)
        announced = threading.Event()
        self._running.append(announced)
        timer = None
        if self._speaks():

            def announce() -> None:
                announced.set()
                self._say(f"bladepack: {name} ...")

            timer = threading.Timer(self._slow_s, announce)
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            if timer is not None:
                timer.cancel()
            self._running.remove(announced)
            log.info("bladepack: %s (%.1f s)", name, took)
            if announced.is_set():
                self._say(f"bladepack: {name} done ({took:.1f} s)")
            if self._bar is not None:
                self._bar.update(1)

    def done(self, what: str) -> None:
        log.info("bladepack:   %s", what)
        if self._running and self._running[-1].is_set():
            self._say(f"bladepack:   {what}")
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        log.info("bladepack: optimized in %.1f s", time.perf_counter() - self._t0)
