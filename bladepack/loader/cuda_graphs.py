"""CUDA graphs for the Python loader's CUDA path: one graph launch per call at a repeated signature.

In: the device and a bound (graphs kept per caller stream). Out: `CudaGraphs`, whose `context(stream)`
gives the caller stream's `GraphContext`: one device buffer that the captured launches address (the
arena and every input and output the plan reads or writes) and its graphs, least recently used first.

Note [CUDA graphs] (the C++ runtime's, cpp_runtime/src/native_cuda.h, makes the same choices): a
signature's first call on a stream runs plain launches (it warms the shape cache, cuBLAS and the
CUTLASS semaphores up); its second is captured (stream capture, thread-local mode, on a private
non-blocking stream, since the legacy default stream cannot capture) into a graph that is instantiated
and launched on the caller's stream; every later call launches that graph only. The graph stays exact
because nothing it addresses moves: the caller's tensors are copied into the context's buffer before
the launch and the results copied out after (host tensors are copied anyway; a device tensor costs one
device-to-device copy each way). Staging was chosen over updating each kernel node's parameters per
call because cuBLAS and CUTLASS nodes have parameter layouts the loader does not know, so their
pointers could not be updated, and because a parameter update per node costs a driver call per kernel,
which is what graphs exist to remove. When the buffer must grow (a larger signature), the stream's
graphs are dropped. A plan with a step that synchronizes with the host (a reference step, a run-time
branch read on the host) is never captured (`graph_obstacle`; `bladepack inspect` says why); a capture
the driver refuses leaves that signature on plain launches.

Note [Graph staging cost]: staging a device tensor costs two passes over its bytes (a copy in, a copy
out), which can cost more than the launches a graph saves. On an H200 a one-kernel gelu(1.5x + y) over
64M float32 torch tensors ran at 0.27 of a device copy's bandwidth with graphs on: the kernel moves 3N
bytes, the staging 6N more. So a call whose device tensors (inputs, and outputs when the caller gets
device tensors) add more than STAGE_BYTES_PER_LAUNCH per launch of its plan runs plain launches on the
tensors in place, never captured (`stage_pays`). About 4 µs of launch cost saved per kernel against
~3 TB/s of copy bandwidth for two passes gives ~6 MB; 4 MiB leaves a margin. Host arrays are copied
in and out either way, so they never count.

Note [Staging or patching]: a caller's tensors reach a graph by staging (a device copy each way per
tensor, one driver call each), never by patching the graph's kernel parameters per call. Patching —
cuGraphExecKernelNodeSetParams per node that reads or writes a caller tensor — is impossible for
cuBLAS and CUTLASS nodes (their parameter layouts are theirs), and for a plan of generated kernels it
costs one driver call per node touching a caller tensor: at least as many calls as staging (each
input and output feeds at least one node, usually more: the first layer's and the residual's), a
node lookup and a parameter buffer each, so it saves no host time; what it saves is the copies'
device bandwidth, which the rule above already buys back where it matters (above 4 MiB per launch the
tensors are used in place with plain launches). So every plan stages; `bladepack inspect` says so
(`cuda_graphs.tensors`). Measured: the H200's staging cost (Note [Graph staging cost]); not measured:
patching on a GPU, which would only change this rule for plans of generated kernels alone.

Note [Graph replay]: a call on host arrays (numpy, the default stream) whose signature has a graph
takes a short path (`CudaExecutor._replay_host`): its shapes were checked, prepared and staged by the
full path when the graph was made, so the call only copies its inputs in, launches the graph and copies
the outputs out — about a dozen driver calls and no per-call Python bookkeeping. Anything else
(another dtype or layout, caller output buffers) takes the full path. Device tensors of every kind
take the same kind of path (Note [Framework replay] in cuda_replay.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bladepack.loader.cuda_driver import SMALLEST_CLASS, CudaError, Device, DeviceBuffer, _check, size_class

DEFAULT_GRAPHS = 64  # per caller stream
STAGE_BYTES_PER_LAUNCH = 4 << 20  # Note [Graph staging cost]


def stage_pays(device_bytes: int, launches: int) -> bool:
    """Note [Graph staging cost]: whether a call whose device tensors hold `device_bytes` (staged in and
    out when it runs as a graph) may run as a graph of `launches` launches."""
    return device_bytes <= STAGE_BYTES_PER_LAUNCH * max(launches, 1)


@dataclass(frozen=True)
class Replay:
    """Note [Framework replay] (cuda_replay.py): what a later call of the same shapes does, precomputed:
    copy each input to its staging address, launch the graph, make the device copies of outputs that
    are inputs / weights / repeats, copy each output out (address, shape, numpy dtype, bytes)."""

    inputs: tuple[tuple[int, int], ...]  # staging address, bytes
    copies: tuple[tuple[int, int, int], ...]  # source, destination, bytes
    outputs: tuple[tuple[int, tuple[int, ...], Any, int], ...]
    pooled: int = 0  # the outputs' bytes carved out of one pooled block (each rounded up to 256)


@dataclass
class GraphEntry:
    runs: int = 0
    exec: Any = None  # CUgraphExec
    refused: bool = False
    replay: Replay | None = None


@dataclass
class GraphContext:
    """A caller stream's staging buffer and graphs (key: the input-shape signature)."""

    stream: int
    handle: Any = None  # the driver's CUstream for `stream`, made once
    buffer: DeviceBuffer | None = None
    graphs: OrderedDict[Any, GraphEntry] = field(default_factory=OrderedDict)


class CudaGraphs:
    def __init__(self, device: Device, limit: int = DEFAULT_GRAPHS) -> None:
        if limit < 1:
            raise ValueError(f"the CUDA graph bound must be positive, got {limit}")
        self.device = device
        self.limit = limit
        self._drv = device._drv
        self._contexts: dict[int, GraphContext] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # each thread's capture stream

    def context(self, stream: int) -> GraphContext:
        with self._lock:
            ctx = self._contexts.get(stream)
            if ctx is None:
                ctx = self._contexts[stream] = GraphContext(stream, self._drv.CUstream(stream))
            return ctx

    def peek(self, stream: int) -> GraphContext | None:
        """The stream's context if it has one (no lock: a dict read)."""
        return self._contexts.get(stream)

    def memory(self, ctx: GraphContext, nbytes: int, key: Any = None) -> int:
        """The context's buffer, at least `nbytes`. A new one drops every graph of the context first, so
        an entry (and its replay record) never outlives the buffer it addresses; signature `key`'s run
        count, which addresses nothing, is kept (its first run may have been in place: Note [First calls
        on the device] in cuda_module.py)."""
        if ctx.buffer is None or ctx.buffer.nbytes < nbytes:
            earlier = ctx.graphs.get(key)
            self._drop(ctx)
            if earlier is not None and earlier.runs:
                ctx.graphs[key] = GraphEntry(runs=earlier.runs)
            if ctx.buffer is not None:
                ctx.buffer.free()
            ctx.buffer = self.device.alloc(size_class(max(nbytes, SMALLEST_CLASS)))  # Note [Device size classes]
        return ctx.buffer.ptr

    def entry(self, ctx: GraphContext, key: Any) -> GraphEntry:
        """The signature's entry, made the most recently used; beyond the bound the least recently used
        other graph is destroyed."""
        e = ctx.graphs.get(key)
        if e is None:
            e = ctx.graphs[key] = GraphEntry()
        ctx.graphs.move_to_end(key)
        while len(ctx.graphs) > self.limit:
            _, old = ctx.graphs.popitem(last=False)
            if old.exec is not None:
                self.device.synchronize(ctx.stream)
                self._drv.cuGraphExecDestroy(old.exec)
        return e

    def first_run(self, stream: int, key: Any) -> bool:
        """Whether this call is the signature's first run on `stream` (Note [First calls on the device] in
        cuda_module.py); it is then counted, so the signature's next call is captured."""
        ctx = self.context(stream)
        e = ctx.graphs.get(key)
        if e is not None and e.runs:
            return False
        self.entry(ctx, key).runs += 1
        return True

    def capture(self, enqueue: Callable[[int], None]) -> Any:
        """An instantiated graph of what `enqueue(stream)` enqueues on this thread's capture stream, or
        None when the driver refuses the capture (the work is then not done: run it plainly)."""
        drv = self._drv
        stream = getattr(self._local, "stream", None)
        if stream is None:
            flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
            stream = self._local.stream = _check(drv, drv.cuStreamCreate(flags), "cuStreamCreate")
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        if drv.cuStreamBeginCapture(stream, mode)[0] != drv.CUresult.CUDA_SUCCESS:
            return None
        ok = True
        try:
            enqueue(int(stream))
        except CudaError:
            ok = False  # a launch refused while capturing: the capture is discarded below
        err, graph = drv.cuStreamEndCapture(stream)
        if not ok or err != drv.CUresult.CUDA_SUCCESS or graph is None or not int(graph):
            if graph is not None and int(graph):
                drv.cuGraphDestroy(graph)
            return None
        err, exec_ = drv.cuGraphInstantiate(graph, 0)
        drv.cuGraphDestroy(graph)
        return exec_ if err == drv.CUresult.CUDA_SUCCESS else None

    def launch(self, exec_: Any, stream: int) -> None:
        drv = self._drv
        _check(drv, drv.cuGraphLaunch(exec_, drv.CUstream(stream)), "cuGraphLaunch")

    def _drop(self, ctx: GraphContext) -> None:
        if any(e.exec is not None for e in ctx.graphs.values()):
            self.device.synchronize(ctx.stream)
        for e in ctx.graphs.values():
            if e.exec is not None:
                self._drv.cuGraphExecDestroy(e.exec)
        ctx.graphs.clear()

    def close(self) -> None:
        with self._lock:
            for ctx in self._contexts.values():
                self._drop(ctx)
                if ctx.buffer is not None:
                    ctx.buffer.free()
            self._contexts.clear()


__all__ = ["DEFAULT_GRAPHS", "CudaGraphs", "GraphContext", "GraphEntry", "Replay"]
