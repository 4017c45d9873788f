"""Starting and stopping Triton Inference Server on a model repository (`bladepack serve`).

In: a model repository (serving/triton_repo.py), ports and an address. Out: `TritonServer`, a running
`tritonserver` process that answers KServe v2 over HTTP and gRPC and Prometheus metrics, stopped by
`stop()` (or leaving its `with` block).

Note [Finding Triton]: the binary is, in order, the one named (`--tritonserver`,
BLADEPACK_TRITONSERVER), `tritonserver` on PATH (an NGC container: its own backends), or the copy the
nvidia-pytriton wheel bundles. The wheel ships the Python backend's stub once per Python version
(`python_backend_stubs/3.X`); Triton looks for the stub beside the backend library, so `prepare`
builds a backends directory of links with this Python's stub in it. The stub embeds libpython: the
library of the interpreter running bladepack is put first on its LD_LIBRARY_PATH. The stub's Python
ignores PYTHONPATH (it starts isolated), so this interpreter's site-packages and bladepack's own
directory travel in BLADEPACK_SERVE_PATH, which the generated model.py puts first on sys.path: model.py
imports the same bladepack and numpy as the process that started the server. The wheel's metadata pins numpy<2,
which neither bladepack nor the server needs: install it with `pip install --no-deps nvidia-pytriton`.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bladepack.errors import BladepackError
from bladepack.options import child_environment

DEFAULT_BACKENDS = "/opt/tritonserver/backends"  # where Triton's containers keep their backends


class ServerError(BladepackError):
    """Triton could not be found or started (the message has the reason, or the server log's tail)."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backends: Path | None  # the backends directory to pass (None: the binary's default)
    libs: tuple[Path, ...]  # put on LD_LIBRARY_PATH
    where: str  # how it was found, for messages


def find_tritonserver(explicit: str | None = None) -> TritonInstall:
    """Note [Finding Triton]; `explicit`: the binary named (ServeOptions.tritonserver, the command line)."""
    named = explicit
    if named:
        path = Path(named)
        if not path.is_file():
            raise ServerError(f"no tritonserver at {path}")
        return TritonInstall(path, None, (), f"named: {path}")
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), None, (), f"on PATH: {on_path}")
    spec = importlib.util.find_spec("pytriton")  # finds the package without importing it
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        binary = root / "tritonserver" / "bin" / "tritonserver"
        if binary.is_file():
            libs = root.parent / "nvidia_pytriton.libs"
            return TritonInstall(
                binary, root / "tritonserver" / "backends", (libs,), f"nvidia-pytriton wheel: {binary}"
            )
    raise ServerError(
        "no Triton Inference Server found: put tritonserver on PATH, set BLADEPACK_TRITONSERVER, or "
        "`pip install --no-deps nvidia-pytriton` (its bundled server runs on the CPU)"
    )


def find_cpp_backend(explicit: str | Path | None = None) -> Path:
    """libtriton_bladepack.so: the one named (the command line's, else ServeOptions.cpp_backend)."""
    named = explicit
    if not named:
        raise ServerError(
            "the C++ backend needs libtriton_bladepack.so (built with cpp_runtime/): pass --cpp-backend PATH "
            "or set BLADEPACK_TRITON_BACKEND"
        )
    path = Path(named)
    if not path.is_file():
        raise ServerError(f"no C++ Triton backend at {path}")
    return path


def prepare_backends(install: TritonInstall, workdir: Path, cpp_backend: Path | None = None) -> Path | None:
    """A backends directory of links: the server's own backends (the wheel's, with this interpreter's
    Python-backend stub: Note [Finding Triton]; else Triton's default /opt/tritonserver/backends) and,
    given `cpp_backend`, bladepack/libtriton_bladepack.so. None: the server's default will do."""
    source = install.backends or (Path(DEFAULT_BACKENDS) if cpp_backend is not None else None)
    if source is None:
        return None
    out = workdir / "backends"
    out.mkdir(parents=True)
    if source.is_dir():
        for backend in source.iterdir():
            if backend.is_dir() and backend.name != "bladepack":
                (out / backend.name).mkdir()
                for f in backend.iterdir():
                    (out / backend.name / f.name).symlink_to(f)
    if install.backends is not None:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stubs = install.backends.parent / "python_backend_stubs"
        stub = stubs / version / "triton_python_backend_stub"
        if not stub.is_file():
            have = ", ".join(sorted(p.name for p in stubs.glob("3.*")))
            raise ServerError(f"the bundled Triton has Python-backend stubs for {have}, not Python {version}")
        (out / "python" / "triton_python_backend_stub").symlink_to(stub)
    if cpp_backend is not None:
        (out / "bladepack").mkdir()
        (out / "bladepack" / "libtriton_bladepack.so").symlink_to(cpp_backend.resolve())
    return out


def _python_paths() -> tuple[list[str], list[str]]:
    """(LD_LIBRARY_PATH, PYTHONPATH) entries that make the stub embed this interpreter."""
    libdir = sysconfig.get_config_var("LIBDIR")
    libs = [libdir] if libdir and sysconfig.get_config_var("Py_ENABLE_SHARED") else []
    paths = sysconfig.get_paths()
    root = str(Path(__file__).resolve().parents[2])  # the directory holding the bladepack package
    return libs, list(dict.fromkeys([root, paths["purelib"], paths["platlib"]]))


class TritonServer:
    """A tritonserver process on `repository`, listening on `host` (loopback by default)."""

    def __init__(
        self,
        repository: str | Path,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        host: str = "127.0.0.1",
        tritonserver: str | None = None,
        log: str | Path | None = None,
        ready_timeout_s: float = 120.0,
        cpp_backend: str | Path | None = None,
    ) -> None:
        self.repository = Path(repository)
        self.host = host
        self.ports = (http_port, grpc_port, metrics_port)
        self.install = find_tritonserver(tritonserver)
        self.cpp_backend = find_cpp_backend(cpp_backend) if cpp_backend is not None else None
        self._workdir = Path(tempfile.mkdtemp(prefix="bladepack-triton-"))
        self._log_path = Path(log) if log is not None else self._workdir / "tritonserver.log"
        self._timeout = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._backends: Path | None = None  # prepared by the first start, reused by restarts

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports[0]}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports[1]}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports[2]}/metrics"

    def command(self, backends: Path | None) -> list[str]:
        http, grpc, metrics = self.ports
        cmd = [
            str(self.install.binary),
            f"--model-repository={self.repository}",
            f"--http-address={self.host}",
            f"--http-port={http}",
            f"--grpc-address={self.host}",
            f"--grpc-port={grpc}",
            f"--metrics-address={self.host}",
            f"--metrics-port={metrics}",
            "--allow-gpu-metrics=false",
            "--exit-timeout-secs=5",
        ]
        if backends is not None:
            cmd.append(f"--backend-directory={backends}")
        return cmd

    def start(self, restart: bool = False) -> TritonServer:
        """Start the server and wait until it is ready; `restart`: after it died (the log is appended to,
        so what it said before dying stays in it)."""
        if not restart or self._backends is None:
            self._backends = prepare_backends(self.install, self._workdir, self.cpp_backend)
        backends = self._backends
        libs, pythonpath = _python_paths()
        env = child_environment(
            {"LD_LIBRARY_PATH": [*libs, *(str(p) for p in self.install.libs)], "BLADEPACK_SERVE_PATH": pythonpath}
        )
        with open(self._log_path, "ab" if restart else "wb") as log:
            self._proc = subprocess.Popen(
                self.command(backends), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + self._timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                self.cleanup()
                raise ServerError(f"tritonserver exited with status {self._proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        self.cleanup()
        raise ServerError(f"tritonserver was not ready after {self._timeout:.0f} s:\n{tail}")

    def log_tail(self, lines: int = 20) -> str:
        """The server log's error lines (Triton's "E..." lines and "error: ..."), else its last lines."""
        try:
            text = self._log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        errors = [ln for ln in text if re.match(r"E\d{4} |error: ", ln) or "UNAVAILABLE:" in ln]
        where = "" if self._log_path.parent == self._workdir else f"\n(full log: {self._log_path})"
        return "\n".join(errors[-lines:] if errors else text[-lines:]) + where

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_reason(self) -> str:
        """How the server process ended: "exited with status N" or "was killed by SIGSEGV"."""
        code = self._proc.poll() if self._proc is not None else None
        if code is None:
            return "is running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def supervise(
        self, stop: threading.Event, say: Callable[[str], None], max_restarts: int = 5, window_s: float = 300.0
    ) -> bool:
        """Note [Supervised server]: keep the server up until `stop` is set (True). A server that dies
        (a request that crashes Triton's front end, say) is restarted, with a line through `say` naming
        how it ended; False (the server left stopped) when it died more than `max_restarts` times within
        `window_s` seconds, or could not be started again."""
        deaths: list[float] = []
        while not stop.is_set():
            if self.running():
                stop.wait(0.5)
                continue
            now = time.monotonic()
            deaths = [t for t in deaths if now - t < window_s] + [now]
            reason = self.exit_reason()
            if len(deaths) > max_restarts:
                say(f"tritonserver {reason}; it died {len(deaths)} times in {window_s:.0f} s: not restarting it")
                return False
            say(f"tritonserver {reason}; restarting it ({len(deaths)} of at most {max_restarts} in {window_s:.0f} s)")
            try:
                self.start(restart=True)
            except ServerError as e:
                say(f"tritonserver could not be restarted: {e}")
                return False
            say("tritonserver is ready again")
        return True

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (Triton finishes the requests in flight), then SIGKILL after `timeout_s`."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cleanup(self) -> None:
        """Remove the backends directory of links (and the log, unless it was placed elsewhere)."""
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        self.cleanup()
