"""The CUDA driver layer (bladepack/loader/cuda_driver.py) without a GPU.

Pure parts (argument packing, kernel-image choice) are checked directly. The launch path runs in a
subprocess against the fake driver tests/fake_cuda/fake_libcuda.c (built here, put first on
LD_LIBRARY_PATH), with a real kernel compiled by nvcc; the fake's log says what reached the driver:
image kind and size, function names, attributes, grid, block, shared memory and argument bytes.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bladepack.loader.cuda_driver import CudaUnavailable, choose_image, pack_args

ROOT = Path(__file__).resolve().parent.parent
KERNEL = r"""
extern "C" __global__ void scale(float* y, const float* x, float a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
"""


def test_pack_args_uses_c_alignment() -> None:
    b = pack_args([("i32", 7), ("ptr", 0x1122334455667788), ("f32", 2.0), ("i64", -1), ("f64", 0.5)])
    assert len(b) == 4 + 4 + 8 + 4 + 4 + 8 + 8
    assert b[:4] == struct.pack("<i", 7) and b[4:8] == b"\0" * 4
    assert b[8:16] == struct.pack("<Q", 0x1122334455667788)
    assert b[16:20] == struct.pack("<f", 2.0) and b[20:24] == b"\0" * 4
    assert b[24:32] == struct.pack("<q", -1) and b[32:40] == struct.pack("<d", 0.5)
    with pytest.raises(ValueError, match="unknown argument kind 'f16'"):
        pack_args([("f16", 1.0)])


def test_choose_image() -> None:
    images = {"sm_80": b"a", "sm_86": b"b", "sm_90a": b"c", "compute_90": b"p"}
    assert choose_image(images, (8, 6))[0] == "sm_86"
    assert choose_image(images, (8, 9))[0] == "sm_86"  # same major, newest minor not above the device's
    assert choose_image(images, (9, 0))[0] == "sm_90a"  # arch-specific: exact match only
    assert choose_image(images, (10, 0))[0] == "compute_90"  # no cubin runs: PTX, JIT-compiled
    assert choose_image({"sm_80": b"a", "compute_80": b"p"}, (9, 0))[0] == "compute_80"
    with pytest.raises(CudaUnavailable, match=r"no kernel image runs on sm_75: the artifact has compute_80, sm_80"):
        choose_image({"sm_80": b"a", "compute_80": b"p"}, (7, 5))
    with pytest.raises(ValueError, match="not sm_XY"):
        choose_image({"gfx90a": b""}, (9, 0))


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("cuda.bindings.driver")
    d = tmp_path_factory.mktemp("fake_cuda")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"), str(ROOT / "tests/fake_cuda/fake_libcuda.c")],
        check=True,
    )
    return d


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    d = tmp_path_factory.mktemp("kernel")
    (d / "k.cu").write_text(KERNEL)
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", str(d / "k.cubin"), str(d / "k.cu")], check=True)
    subprocess.run(["nvcc", "-ptx", "-arch=compute_90", "-o", str(d / "k.ptx"), str(d / "k.cu")], check=True)
    return {"sm_90": (d / "k.cubin").read_bytes(), "compute_90": (d / "k.ptx").read_bytes()}


SCRIPT = r"""
import sys, pickle, numpy as np
from bladepack.loader.cuda_driver import Device, CudaError, CudaUnavailable, choose_image, pack_args
images = pickle.load(open(sys.argv[1], "rb"))
try:
    dev = Device(int(sys.argv[2]))
except CudaUnavailable as e:
    print("unavailable:", e)
    sys.exit(0)
print("device:", dev.info.name, dev.info.arch, dev.info.sm_count)
key, image = choose_image(images, dev.info.compute_capability)
print("image:", key, len(image))
fn = dev.load_module(image).function("scale")
x = np.arange(5, dtype=np.float32)
bx, by = dev.alloc(x.nbytes), dev.alloc(x.nbytes)
bx.copy_from_host(x)
args = pack_args([("ptr", by.ptr), ("ptr", bx.ptr), ("f32", 2.5), ("i64", 5)])
print("args:", args.hex())
fn.launch((1,), (128,), args, shared_bytes=64 * 1024, stream=0)
fn.launch((1,), (128,), args, shared_bytes=64 * 1024, stream=0)  # the limit is raised once
try:
    fn.launch((1,), (2048,), args)
except CudaError as e:
    print("error:", e)
dev.synchronize()
print("roundtrip:", np.frombuffer(bx.copy_to_host(), np.float32).tolist())
bx.free(); by.free(); dev.close()
"""


def _run(fake: Path | None, images: dict[str, bytes], tmp: Path, ordinal: int = 0, cc: str = "90") -> tuple[str, str]:
    import pickle

    img = tmp / "images.pkl"
    img.write_bytes(pickle.dumps(images))
    log = tmp / "cuda.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "FAKE_CUDA_LOG": str(log), "FAKE_CUDA_CC": cc, "PYTHONPATH": str(ROOT)}
    env["LD_LIBRARY_PATH"] = str(fake) if fake else "/nonexistent"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(img), str(ordinal)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, log.read_text() if log.exists() else ""


def test_launch_path_against_the_fake_driver(fake: Path, images: dict[str, bytes], tmp_path: Path) -> None:
    out, log = _run(fake, images, tmp_path)
    assert "device: Fake GPU 0 (sm_90) sm_90 132" in out
    assert f"image: sm_90 {len(images['sm_90'])}" in out
    args = next(line.split()[1] for line in out.splitlines() if line.startswith("args:"))
    lines = log.splitlines()
    assert lines[:2] == ["init", "ctx_retain 0"]
    assert f"module_load cubin {len(images['sm_90'])}" in lines  # the whole cubin reached the driver
    assert "get_function scale" in lines
    # MAX_DYNAMIC_SHARED_SIZE_BYTES (8) raised once for the two 64 KiB launches
    assert [x for x in lines if x.startswith("func_attribute")] == ["func_attribute scale 8 65536"]
    launches = [x for x in lines if x.startswith("launch ")]
    assert launches[0] == f"launch scale grid 1 1 1 block 128 1 1 smem 65536 stream 0 params none args {args}"
    assert len(launches) == 3 and "block 2048 1 1" in launches[2]
    assert "error: cuLaunchKernel(scale) failed: CUDA_ERROR_INVALID_VALUE (invalid argument)" in out
    assert "roundtrip: [0.0, 1.0, 2.0, 3.0, 4.0]" in out  # host -> device -> host through the fake's memory
    assert lines[-1] == "ctx_release 0"


def test_ptx_when_no_cubin_runs(fake: Path, images: dict[str, bytes], tmp_path: Path) -> None:
    out, log = _run(fake, images, tmp_path, cc="100")
    assert f"image: compute_90 {len(images['compute_90'])}" in out
    assert f"module_load ptx {len(images['compute_90'])}" in log


def test_no_driver_no_device(fake: Path, images: dict[str, bytes], tmp_path: Path) -> None:
    out, _ = _run(None, images, tmp_path)
    assert "unavailable: no CUDA driver found (libcuda.so.1 could not be loaded)" in out
    out, _ = _run(fake, images, tmp_path, ordinal=3)
    assert "unavailable: cuda:3 requested; this machine has 1 CUDA device(s)" in out


class _Fn:
    """A C function of a stand-in library: ctypes' argtypes may be set on it."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def __call__(self, *args: Any) -> int:
        return int(self.body(*args))


def test_cublas_calls_from_two_threads_keep_their_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuBLAS's handle holds one stream, set per call: two threads calling on their own streams must
    each enqueue on their own (ctypes drops the GIL between the stream and the GEMM; without the lock
    a GEMM lands on the other thread's stream, unordered with its own kernels). A stand-in library
    records the stream each GEMM was enqueued on, and sleeps in between to make the interleaving
    likely; also, a call on the stream set last sets it no more."""
    import ctypes
    import threading
    import time

    from bladepack.loader import cublas
    from bladepack.loader.gemm_args import gemm_args
    from bladepack.options import LoaderOptions

    state: dict[str, Any] = {"stream": None, "sets": 0, "seen": []}

    def set_stream(handle: Any, stream: Any) -> int:
        state["stream"] = stream.value
        state["sets"] += 1
        time.sleep(0.0005)
        return 0

    def gemm(handle: Any, *args: Any) -> int:
        state["seen"].append((threading.get_ident(), state["stream"]))
        time.sleep(0.0002)
        return 0

    lib = type("Lib", (), {})()
    lib.cublasCreate_v2 = _Fn(lambda h: 0)
    lib.cublasSetStream_v2 = _Fn(set_stream)
    lib.cublasDestroy_v2 = _Fn(lambda h: 0)
    lib.cublasGemmStridedBatchedEx = _Fn(gemm)
    monkeypatch.setattr(ctypes, "CDLL", lambda path: lib)
    handle = cublas.Cublas(LoaderOptions(cublas="stand-in"))
    ints = [1, 1, 1, *([0] * 9), 4, 4, 4, 0, 0, 4, 4, 4]
    args = gemm_args(ints, 4)
    streams = {}

    def work(stream: int) -> None:
        streams[threading.get_ident()] = stream
        for _ in range(40):
            handle.gemm("float32", 0x1000, 0x2000, 0x3000, args, stream)

    threads = [threading.Thread(target=work, args=(s,)) for s in (0x51, 0x52)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(state["seen"]) == 80
    assert all(stream == streams[ident] for ident, stream in state["seen"])
    before = state["sets"]
    work(0x53)
    assert state["sets"] == before + 1  # one stream for 40 calls: set once


def test_outgrown_semaphores_stay_allocated_for_captured_graphs() -> None:
    """A CUDA graph captured at one signature addresses the stream's split-K semaphore buffer as it was;
    a later signature that needs a larger one must not free it under that graph (StreamBuffers `keep`:
    freed at `free()` only). Without `keep`, the outgrown buffer is freed once the stream is idle."""
    from bladepack.loader.cuda_driver import StreamBuffers

    freed: list[int] = []
    synced: list[int] = []

    class Buffer:
        def __init__(self, ptr: int, nbytes: int) -> None:
            self.ptr, self.nbytes = ptr, nbytes

        def free(self) -> None:
            freed.append(self.ptr)

        def copy_from_host(self, data: bytes) -> None:
            assert len(data) == self.nbytes

    class Device:
        next = 0x1000

        def alloc(self, nbytes: int) -> Buffer:
            Device.next += 0x100000
            return Buffer(Device.next, nbytes)

        def synchronize(self, stream: int) -> None:
            synced.append(stream)

    for keep in (True, False):
        freed.clear()
        bufs = StreamBuffers(Device(), 256, zeroed=True, keep=keep)  # type: ignore[arg-type]
        small = bufs.get(0, 7)
        assert bufs.get(100, 7) == small  # fits: the same buffer
        large = bufs.get(1 << 16, 7)
        assert large != small
        assert freed == ([] if keep else [small])
        bufs.free()
        assert sorted(freed) == sorted([small, large])
