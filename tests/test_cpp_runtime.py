"""The C++ runtime (cpp_runtime/) against the Python loader: the same outputs, the same errors.

Builds the runtime with CMake (tests/cpp_build.py), then runs `bpk-run` on every sample at several
shapes (<= 1e-6 relative to the Python loader: the same kernels), compares guard, input and
corrupt-file errors text for text, checks the shape-program evaluator on vectors the Python evaluator
wrote, runs the C ABI tests plain and under ASan / UBSan, fuzzes the reader briefly, and builds a
consumer project against the installed package.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

import bladepack
from bladepack.artifact import format as bpk_format
from bladepack.artifact.shape_program import Op, ShapeProgram
from bladepack.errors import ShapeGuardError
from bladepack.options import CompileOptions
from samples.registry import SAMPLES
from tests import cpp_build
from tests.helpers import narrowed_sizes, rel_err

TMP = Path(tempfile.mkdtemp(prefix="bladepack-cpp-"))
atexit.register(shutil.rmtree, TMP, ignore_errors=True)


def bpk_run(build: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(build / "bpk-run"), *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@functools.cache
def sample_artifact(name: str) -> Path:
    s = SAMPLES[name]
    path = TMP / f"{name}.bpk"
    bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes).save(path)
    return path


def cases(name: str) -> list[dict[str, int]]:
    """Per dynamic dim: 1, an odd size and the largest test value (the others at their base values)."""
    s = SAMPLES[name]
    out = []
    for dim, values in s.test_dims.items():
        odd = [v for v in values if v % 2 and v > 1]
        for v in dict.fromkeys([min(values), *odd[:1], max(values)]):
            out.append({**s.base_dims, dim: v})
    return out


def save_inputs(arrays: Sequence[np.ndarray], names: Sequence[str], tag: str) -> list[str]:
    args = []
    for a, n in zip(arrays, names):
        f = TMP / f"{tag}-{n}.npy"
        np.save(f, a)
        args += ["--input", f"{n}={f}"]
    return args


def run_both(build: Path, path: Path, arrays: Sequence[np.ndarray], tag: str) -> tuple[list[np.ndarray], list[Any]]:
    loaded = bladepack.load(path)
    names = [t.name for t in loaded.signature.inputs]
    out_dir = TMP / f"out-{tag}"
    out_dir.mkdir(exist_ok=True)
    r = bpk_run(build, str(path), *save_inputs(arrays, names, tag), "--output-dir", str(out_dir))
    assert r.returncode == 0, r.stderr
    want = loaded.run(list(arrays))
    got = [np.load(out_dir / f"{t.name}.npy") for t in loaded.signature.outputs]
    return got, want


# -- numerics


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_match_python_loader(release: Path, name: str) -> None:
    s = SAMPLES[name]
    path = sample_artifact(name)
    g = torch.Generator().manual_seed(11)
    symbols = bladepack.load(path).signature.symbols
    for k, case in enumerate(cases(name)):
        arrays = [t.numpy() for t in s.make_inputs(g, **case)]
        if narrowed_sizes(symbols, case):
            continue
        got, want = run_both(release, path, arrays, f"{name}{k}")
        assert len(got) == len(want)
        for o, w in zip(got, want):
            e = rel_err(o, w)
            assert e <= 1e-6, f"{name} at {case}: C++ vs Python relative error {e:.3g}"


class _Decoder(torch.nn.Module):
    """A segmentation-style decoder head: transposed convolution, bicubic resize to another input's
    size, and top-k over the classes: kernels the samples do not have."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(4, 5, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.interpolate(self.up(x), size=ref.shape[-2:], mode="bicubic")
        v, i = torch.topk(y, 2, dim=1)
        return v, i


def test_decoder_ops_match_python_loader(release: Path) -> None:
    torch.manual_seed(0)
    model = _Decoder().eval()
    samples = [(torch.randn(2, 4, 5, 6), torch.randn(1, 1, 9, 7)), (torch.randn(1, 4, 3, 8), torch.randn(1, 1, 4, 12))]
    path = TMP / "decoder.bpk"
    bladepack.optimize(model, samples).save(path)
    g = torch.Generator().manual_seed(3)
    for k, (b, h, w, oh, ow) in enumerate([(1, 1, 1, 1, 1), (3, 7, 2, 17, 5), (2, 16, 16, 31, 33)]):
        arrays = [torch.randn(b, 4, h, w, generator=g).numpy(), torch.randn(1, 1, oh, ow, generator=g).numpy()]
        got, want = run_both(release, path, arrays, f"decoder{k}")
        with torch.no_grad():
            eager = model(*map(torch.from_numpy, arrays))
        for o, w_, e_ in zip(got, want, eager):
            assert rel_err(o, w_) == 0.0, f"C++ vs Python at {arrays[0].shape} -> {arrays[1].shape}"
            assert rel_err(o, e_.numpy()) <= 1e-5, "vs eager"


class _Recurrent(torch.nn.Module):
    """An LSTM and a GRU: recurrent kernels whose steps run on a team of threads (Note [Teams])."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 40, batch_first=True, bidirectional=True)
        self.gru = torch.nn.GRU(80, 24, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(self.lstm(x)[0])[0]


def test_recurrent_layers_match_python_loader(release: Path) -> None:
    torch.manual_seed(0)
    model = _Recurrent().eval()
    path = TMP / "recurrent.bpk"
    bladepack.optimize(model, [(torch.randn(2, 5, 6),), (torch.randn(3, 7, 6),)]).save(path)
    g = torch.Generator().manual_seed(5)
    for k, (b, s) in enumerate([(1, 1), (3, 9), (17, 4)]):
        arrays = [torch.randn(b, s, 6, generator=g).numpy()]
        got, want = run_both(release, path, arrays, f"recurrent{k}")
        with torch.no_grad():
            eager = model(torch.from_numpy(arrays[0])).numpy()
        assert rel_err(got[0], want[0]) <= 1e-6, f"C++ vs Python at {(b, s)}"
        assert rel_err(got[0], eager) <= 1e-5, f"vs eager at {(b, s)}"


def test_mamba2_scan_matches_python_loader(release: Path) -> None:
    """Mamba-2's grouped, per-head selective scan (format 1.10) through bpk-run: a Hugging Face Mamba2Model
    from a config, at batch 1 and lengths within and across chunks."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Mamba2Config(
        vocab_size=50, hidden_size=24, state_size=8, num_hidden_layers=1, head_dim=6, num_heads=8, expand=2,
        n_groups=2, chunk_size=8, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Mamba2Model(cfg).eval()
    path = TMP / "mamba2.bpk"
    samples = [(torch.randint(0, 50, (2, 9)),), (torch.randint(0, 50, (3, 13)),)]
    bladepack.optimize(_Field(model, "last_hidden_state"), samples).save(path)
    g = torch.Generator().manual_seed(6)
    symbols = bladepack.load(path).signature.symbols
    for k, (b, s) in enumerate([(1, 1), (1, 16), (2, 21)]):
        ids = torch.randint(0, 50, (b, s), generator=g)
        if narrowed_sizes(symbols, {"ids_dim0": b, "ids_dim1": s}):
            continue
        got, want = run_both(release, path, [ids.numpy()], f"mamba2-{k}")
        with torch.no_grad():
            eager = model(input_ids=ids, use_cache=False).last_hidden_state.numpy()
        assert rel_err(got[0], want[0]) <= 1e-6, f"C++ vs Python at {(b, s)}"
        assert rel_err(got[0], eager) <= 1e-5, f"vs eager at {(b, s)}"


def test_winograd_convolutions_match_python_loader(release: Path) -> None:
    """3x3 convolutions by F(2x2, 3x3) (format 1.11: Note [Winograd convolutions]) through bpk-run: a
    64-channel residual block into a 72-channel convolution, at odd sizes and batch 3; the 32-channel
    paired one (format 1.13: Note [Winograd at few channels]) takes its direct variant at 3 x 3 and its
    Winograd variant at the others."""
    from tests.test_winograd import _WinogradChain

    torch.manual_seed(0)
    model = _WinogradChain().eval()
    path = TMP / "winograd.bpk"
    bladepack.optimize(model, [(torch.randn(2, 3, 10, 8),), (torch.randn(3, 3, 12, 14),)]).save(path)
    g = torch.Generator().manual_seed(8)
    for k, (b, h, w) in enumerate([(1, 3, 3), (1, 5, 5), (1, 9, 12), (3, 14, 7)]):
        arrays = [torch.randn(b, 3, h, w, generator=g).numpy()]
        got, want = run_both(release, path, arrays, f"winograd{k}")
        with torch.no_grad():
            eager = model(torch.from_numpy(arrays[0]))
        for o, p_, e in zip(got, want, eager, strict=True):
            assert rel_err(o, p_) <= 1e-6, f"C++ vs Python at {(b, h, w)}"
            assert rel_err(o, e.numpy()) <= 1e-5, f"vs eager at {(b, h, w)}"


class _Field(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, field: str) -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=ids, use_cache=False), self.field)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_matches_python_loader(release: Path, dtype: str) -> None:
    """16-bit artifacts run natively in the C++ runtime (bfloat16 .npy files hold uint16 bit patterns,
    Note [bfloat16 on the host]): bit-identical to the Python loader, GEMMs and row kernels included."""
    s = SAMPLES["llama"]  # float inputs (a KV cache) and outputs, GEMMs, RMS norm, softmax, rotary
    path = TMP / f"llama-{dtype}.bpk"
    bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, dtype=dtype).save(path)
    g = torch.Generator().manual_seed(7)
    for k, case in enumerate(cases("llama")):
        args = s.make_inputs(g, **case)
        if dtype == "float16":
            arrays = [a.half().numpy() if a.is_floating_point() else a.numpy() for a in args]
        else:
            arrays = [
                a.bfloat16().view(torch.int16).numpy().view(np.uint16) if a.is_floating_point() else a.numpy()
                for a in args
            ]
        got, want = run_both(release, path, arrays, f"llama-{dtype}{k}")
        for o, w in zip(got, want):
            assert o.dtype == w.dtype == (np.float16 if dtype == "float16" else np.uint16)
            assert np.array_equal(o, w), f"{dtype} at {case}: C++ and Python loaders differ"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_random_joint_shapes_match_python_loader(release: Path, name: str) -> None:
    """Every dynamic dim drawn at once (log-uniform up to the largest test value), four draws per sample:
    shapes no test above combines."""
    s = SAMPLES[name]
    rng = random.Random(f"joint-{name}")
    g = torch.Generator().manual_seed(5)
    path = sample_artifact(name)
    symbols = bladepack.load(path).signature.symbols
    for k in range(4):
        case = {d: max(1, round(math.exp(rng.uniform(0, math.log(min(max(v), 600)))))) for d, v in s.test_dims.items()}
        arrays = [t.numpy() for t in s.make_inputs(g, **case)]
        if narrowed_sizes(symbols, case):
            continue
        got, want = run_both(release, path, arrays, f"joint-{name}{k}")
        for o, w in zip(got, want):
            e = rel_err(o, w)
            assert e <= 1e-6, f"{name} at {case}: C++ vs Python relative error {e:.3g}"


def test_repeat_prints_latency(release: Path) -> None:
    path = sample_artifact("mlp")
    args = save_inputs([np.ones((3, 64), np.float32)], ["x"], "repeat")
    r = bpk_run(release, str(path), *args, "--repeat", "20")
    assert r.returncode == 0, r.stderr
    assert "output0: float32[3, 10]" in r.stdout
    assert "latency over 20 runs (us): min" in r.stdout


def test_a_decode_walk_reuses_its_output_memory(release: Path) -> None:
    """Note [Output blocks]: 600 calls of the LLaMA step, the KV cache one token longer each call and
    each call's runtime-allocated outputs freed (bpk_free) before the next, stay within tens of MB of
    resident memory; given back to malloc at their exact sizes they grew the heap by a cache's size per
    call (400 MB after 600 calls)."""
    path = sample_artifact("llama")
    cmd = [str(release / "bench_runtime"), "walk", str(path), "--repeat", "600"]
    cmd += ["--shape", "x=16,1,64", "--shape", "past_k=16,2,100,8", "--shape", "past_v=16,2,100,8"]
    cmd += ["--grow", "past_k:2", "--grow", "past_v:2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    walked = json.loads(r.stdout)
    assert walked["calls"] == 600 and 0 < walked["peak_rss_kb"] < 100 * 1024, walked


def test_signature_and_usage(release: Path) -> None:
    path = sample_artifact("encoder")
    r = bpk_run(release, str(path))
    assert r.returncode == 0, r.stderr
    assert str(bladepack.load(path).signature) in r.stdout
    assert "executor: native (" in r.stdout
    r = bpk_run(release, str(path), "--input", "tokens=x.npy")
    assert r.returncode == 2 and "unknown input 'tokens'; the model's inputs are input_ids, attention_mask" in r.stderr
    args = save_inputs([np.ones((2, 5), np.int64)], ["input_ids"], "usage")
    r = bpk_run(release, str(path), *args)
    assert r.returncode == 2 and "missing --input attention_mask=FILE.npy" in r.stderr
    r = bpk_run(release, str(path), "--device", "cuda")
    assert r.returncode == 1 and r.stderr.strip() == (
        f"bpk-run: unsupported: {path} has no CUDA kernels; optimize it with targets=('cpu', 'cuda') to run it on a GPU"
    )
    r = bpk_run(release, str(path), "--device", "cuda:x")
    assert r.returncode == 2 and "--device is cpu, cuda or cuda:N, got 'cuda:x'" in r.stderr


# -- errors: the same text as the Python loader


def python_error(path: Path, arrays: Sequence[np.ndarray]) -> str:
    with pytest.raises(bladepack.BladepackError) as e:
        bladepack.load(path).run(list(arrays))
    return str(e.value)


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "status"),
    [
        ("mlp", [(4097, 64)], ["float32"], "shape guard"),
        ("mlp", [(0, 64)], ["float32"], "shape guard"),
        ("mlp", [(2, 63)], ["float32"], "input error"),
        ("mlp", [(2, 64, 1)], ["float32"], "input error"),
        ("mlp", [(2, 64)], ["float64"], "input error"),
        ("encoder", [(2, 5), (2, 6)], ["int64", "int64"], "shape guard"),
        ("encoder", [(1, 513), (1, 513)], ["int64", "int64"], "shape guard"),
        ("llama", [(2, 1, 64), (2, 2, 1024, 8), (2, 2, 1024, 8)], ["float32"] * 3, "shape guard"),
        ("llama", [(2, 1, 64), (2, 2, 7, 8), (3, 2, 7, 8)], ["float32"] * 3, "shape guard"),
        ("llama", [(2, 1, 64), (2, 2, 7, 8), (2, 2, 6, 8)], ["float32"] * 3, "shape guard"),
        ("llama", [(2, 1, 64), (2, 4, 7, 8), (2, 2, 7, 8)], ["float32"] * 3, "input error"),
    ],
)
def test_input_errors_match_python(
    release: Path, name: str, shapes: list[tuple[int, ...]], dtypes: list[str], status: str
) -> None:
    path = sample_artifact(name)
    arrays = [np.zeros(s, dtype=d) for s, d in zip(shapes, dtypes)]
    want = python_error(path, arrays)
    names = [t.name for t in bladepack.load(path).signature.inputs]
    r = bpk_run(release, str(path), *save_inputs(arrays, names, f"err-{name}"))
    assert r.returncode == 1
    assert r.stderr.strip() == f"bpk-run: {status}: {want}"


def flip(b: bytes, i: int) -> bytes:
    return b[:i] + bytes([b[i] ^ 0x40]) + b[i + 1 :]


def corruptions(data: bytes) -> dict[str, bytes]:
    """Damaged copies of an artifact, each with the error both loaders must give."""
    m = bpk_format.read(data)
    last = m.manifest["sections"][-1]
    weight = m.manifest["sections"][0]
    return {
        "empty": b"",
        "short": data[:10],
        "header-only": data[:63],
        "header": data[:64],
        "manifest-cut": data[:100],
        "section-cut": data[: m.data_start + last["offset"] + 10],
        "last-byte": data[:-1],
        "magic": flip(data, 1),
        "major": data[:8] + bytes([2, 0]) + data[10:],
        "header-size": data[:12] + bytes([65]) + data[13:],
        "manifest-byte": flip(data, 80),
        "weight-byte": flip(data, m.data_start + weight["offset"] + 5),
        "library-byte": flip(data, len(data) - 7),
    }


def test_corrupt_files_match_python(release: Path) -> None:
    data = sample_artifact("mlp").read_bytes()
    for tag, bad in corruptions(data).items():
        path = TMP / f"corrupt-{tag}.bpk"
        path.write_bytes(bad)
        with pytest.raises(bladepack.BladepackError) as e:
            bladepack.load(path)
        r = bpk_run(release, str(path))
        assert r.returncode == 1, tag
        assert r.stderr.strip() == f"bpk-run: format error: {e.value}", tag


def test_no_verify_skips_section_checksums(release: Path) -> None:
    data = sample_artifact("mlp").read_bytes()
    path = TMP / "weight-flipped.bpk"
    path.write_bytes(corruptions(data)["weight-byte"])
    arrays = [np.linspace(-1, 1, 5 * 64, dtype=np.float32).reshape(5, 64)]
    out_dir = TMP / "out-noverify"
    out_dir.mkdir(exist_ok=True)
    r = bpk_run(release, str(path), "--no-verify", *save_inputs(arrays, ["x"], "nv"), "--output-dir", str(out_dir))
    assert r.returncode == 0, r.stderr
    want = bladepack.load(path, verify=False).run(arrays)[0]
    assert rel_err(np.load(out_dir / "output0.npy"), want) <= 1e-6


def test_artifacts_the_runtime_refuses(release: Path) -> None:
    class IntMatmul(torch.nn.Module):  # an integer matmul has no BLAS routine: a reference step
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return (x @ w) + 1

    samples = [(torch.ones(3, 4, dtype=torch.int64), torch.ones(4, 2, dtype=torch.int64))] * 2
    samples[1] = (torch.ones(5, 4, dtype=torch.int64), samples[0][1])
    ref = TMP / "ref-step.bpk"
    bladepack.optimize(IntMatmul(), samples).save(ref)
    r = bpk_run(release, str(ref))
    assert r.returncode == 1
    assert "these plan steps have no generated CPU kernel" in r.stderr
    assert "matmul: matmul on int64 has no BLAS routine (from " in r.stderr
    r = subprocess.run([sys.executable, "-m", "bladepack.cli", "inspect", str(ref)], capture_output=True, text=True)
    assert "reference steps: 1 (numpy, Python loader only; the C++ runtime refuses the artifact)" in r.stdout
    assert "matmul: matmul on int64 has no BLAS routine (from " in r.stdout
    plain = TMP / "no-library.bpk"
    bladepack.optimize(IntMatmul(), samples, options=CompileOptions.from_env(native=False)).save(plain)
    r = bpk_run(release, str(plain))
    assert r.returncode == 1 and "has no CPU kernel library" in r.stderr


def test_artifact_with_a_cuda_plan_runs_on_cpu(release: Path) -> None:
    """CUDA kernel rows follow the CPU rows in `kernels`; the C++ runtime runs the CPU plan as before."""
    pytest.importorskip("cuda.bindings.driver")
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not found")
    s = SAMPLES["encoder"]
    path = TMP / "encoder-cuda.bpk"
    bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda:sm_90")).save(path)
    g = torch.Generator().manual_seed(5)
    arrays = [a.numpy() for a in s.make_inputs(g, batch=3, seq=17)]
    got, want = run_both(release, path, arrays, "cuda-plan")
    for o, w in zip(got, want):
        assert rel_err(o, w) <= 1e-6


# -- the shape program on shared vectors


def _expected(prog: ShapeProgram, dims: list[list[int]]) -> tuple[list[int] | None, str | None]:
    """Registers, or the error text, as the C++ evaluator must give them (int64 overflow included)."""
    lo, hi = -(2**63), 2**63 - 1
    for k in range(1, len(prog.code) + 1):
        try:
            regs = ShapeProgram(prog.code[:k], prog.num_registers, prog.messages).evaluate(dims)
        except ShapeGuardError as e:
            return None, str(e)
        if any(not lo <= r <= hi for r in regs):
            return None, (
                f"shape program overflowed int64 at instruction {k - 1}: an input dimension is too large "
                "for the sizes derived from it"
            )
    return prog.evaluate(dims), None


def _random_program(rng: random.Random) -> tuple[ShapeProgram, list[int]]:
    ranks = [rng.randint(0, 3) for _ in range(rng.randint(1, 3))]
    n = rng.randint(3, 12)
    messages = ("dim is {value}, other {other}", "guard {value}", "plain")
    # every register defined once (to 0, as evaluation starts): a valid program has no more registers
    # than instructions
    code: list[tuple[int, int, int, int, int]] = [(Op.CONST, r, 0, 0, 0) for r in range(n)]
    for i, rank in enumerate(ranks):
        code += [(Op.DIM, rng.randrange(n), i, a, 0) for a in range(rank)]
    axes = [(i, a) for i, rank in enumerate(ranks) for a in range(rank)]
    for _ in range(rng.randint(1, 30)):
        op = rng.choice(list(Op))
        d, a, b, c = (rng.randrange(n) for _ in range(4))
        if op is Op.CONST:
            code.append((op, d, rng.choice([rng.randint(-9, 9), rng.randint(-(2**40), 2**40)]), 0, 0))
        elif op is Op.DIM:
            if axes:
                i, ax = rng.choice(axes)
                code.append((op, d, i, ax, 0))
        elif op is Op.ASSERT:
            if rng.random() < 0.3:
                code.append((op, d, a, b, rng.randrange(len(messages))))
        else:
            code.append((op, d, a, b, c if op is Op.SELECT else 0))
    return ShapeProgram(tuple(tuple(int(w) for w in ins) for ins in code), n, messages), ranks  # type: ignore[misc]


def test_shape_program_vectors(release: Path) -> None:
    rng = random.Random(1234)
    vectors = []
    programs: list[tuple[ShapeProgram, list[int], list[list[list[int]]]]] = []
    for _ in range(400):
        prog, ranks = _random_program(rng)
        dims = [[[rng.choice([0, 1, 2, 3, 7, 40, -3, 2**31]) for _ in range(r)] for r in ranks] for _ in range(8)]
        programs.append((prog, ranks, dims))
    for name in sorted(SAMPLES):  # the samples' own programs: in range, at both ends, past them
        m = bpk_format.read(sample_artifact(name)).manifest
        prog = ShapeProgram.from_manifest(m["shape_program"])
        ranks = [len(t["shape"]) for t in m["inputs"]]
        s = SAMPLES[name]
        dims = []
        for case in [*s.test_cases(), *({**s.base_dims, d: v} for d in s.test_dims for v in (0, 513, 5000))]:
            arrays = s.make_inputs(torch.Generator().manual_seed(0), **{k: max(v, 1) for k, v in case.items()})
            shapes = [list(a.shape) for a in arrays]
            for d, v in case.items():  # put the (possibly out-of-range) value where the symbol sits
                for shp, t in zip(shapes, m["inputs"]):
                    for ax, expr in enumerate(t["shape"]):
                        if expr == d:
                            shp[ax] = v
            dims.append(shapes)
        programs.append((prog, ranks, dims))
    kinds = {"registers": 0, "guard": 0, "overflow": 0}
    for prog, ranks, dims in programs:
        cases_ = []
        for shape_set in dims:
            regs, err = _expected(prog, shape_set)
            kinds["overflow" if err and "overflowed" in err else "guard" if err else "registers"] += 1
            cases_.append({"dims": shape_set, "regs": regs, "error": err})
        vectors.append({**prog.to_manifest(), "ranks": ranks, "cases": cases_})
    assert kinds["registers"] > 200 and kinds["guard"] > 200 and kinds["overflow"] > 10, kinds  # every outcome
    path = TMP / "shape_vectors.msgpack"
    path.write_bytes(msgpack.packb(vectors, use_bin_type=True))
    r = subprocess.run([str(release / "shape_vectors"), str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"{len(vectors)} programs" in r.stdout


# -- the C ABI, sanitizers, fuzzing, installation


def test_c_api(release: Path) -> None:
    r = subprocess.run(
        [str(release / "test_api"), str(sample_artifact("mlp"))], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "checks passed" in r.stdout


def test_c_abi_from_c(release: Path) -> None:
    """tests/c_consumer.c is built as C99 with -Werror -pedantic: the header is C; the results are right."""
    path = sample_artifact("mlp")
    r = subprocess.run([str(release / "c_consumer"), str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = bladepack.load(path)(np.full((1, 64), 0.25, np.float32))
    line = next(x for x in r.stdout.splitlines() if x.startswith("output0:"))
    assert line.startswith("output0: float32, 10 elements, sum ")
    assert abs(float(line.split()[-1]) - float(want.sum(dtype=np.float64))) <= 1e-5 * abs(float(want.sum()))


@pytest.mark.slow
def test_under_sanitizers() -> None:
    build = cpp_build.build("sanitize")
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    r = subprocess.run(
        [str(build / "test_api"), str(sample_artifact("mlp"))],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]
    g = torch.Generator().manual_seed(3)
    for name in sorted(SAMPLES):
        s = SAMPLES[name]
        arrays = [t.numpy() for t in s.make_inputs(g, **cases(name)[-1])]
        names = [t.name for t in bladepack.load(sample_artifact(name)).signature.inputs]
        r = bpk_run(build, str(sample_artifact(name)), *save_inputs(arrays, names, f"asan-{name}"), env=env)
        assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]
    for tag, bad in corruptions(sample_artifact("mlp").read_bytes()).items():
        path = TMP / f"asan-{tag}.bpk"
        path.write_bytes(bad)
        r = bpk_run(build, str(path), env=env)
        assert r.returncode == 1 and "format error" in r.stderr and "Sanitizer" not in r.stderr, (tag, r.stderr[-4000:])


def fuzz_seeds(directory: Path) -> None:
    """Real manifests (samples) with small sections: the encoder's and the CNN's kernel libraries
    emptied, so the fuzzer spends most of its time on the parser, not on copying code; the MLP keeps
    its library (and its weights), so mutated plans are checked, prepared and run by real kernels. With
    nvcc, the encoder built for the CPU and sm_90 too, so that mutations reach the CUDA plan's keys."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: sample_artifact(name) for name in ("mlp", "encoder", "cnn")}
    if shutil.which("nvcc"):
        s = SAMPLES["encoder"]
        paths["encoder-cuda"] = TMP / "encoder-cuda.bpk"
        bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda:sm_90")).save(
            paths["encoder-cuda"]
        )
    for name, path in paths.items():
        art = bpk_format.read(path)
        sections = [
            bpk_format.Section(
                e["name"],
                bytes(art.section(e["name"]))
                if name == "mlp"
                else b""
                if e["name"].startswith("cpu/")
                else art.section(e["name"])[:256],
            )
            for e in art.manifest["sections"]
        ]
        manifest = {k: v for k, v in art.manifest.items() if k != "sections"}
        (directory / f"{name}.bpk").write_bytes(b"".join(bytes(c) for c in bpk_format.encode(manifest, sections)))


@pytest.mark.slow
def test_fuzz_reader() -> None:
    build = cpp_build.build("fuzz")
    corpus, seeds = TMP / "fuzz-corpus", TMP / "fuzz-seeds"
    corpus.mkdir(exist_ok=True)
    fuzz_seeds(seeds)
    r = subprocess.run(
        [str(build / "fuzz_load"), str(corpus), str(seeds), "-max_total_time=25", "-rss_limit_mb=2048", "-timeout=10"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TMP,
    )
    assert r.returncode == 0, r.stderr[-6000:]
    assert "Done" in r.stderr


@pytest.mark.slow
def test_install_and_find_package(release: Path) -> None:
    prefix, consumer = TMP / "prefix", TMP / "consumer"
    subprocess.run(["cmake", "--install", str(release), "--prefix", str(prefix)], check=True, capture_output=True)
    assert (prefix / "include" / "bladepack" / "runtime.h").exists()
    r = subprocess.run(
        [
            "cmake",
            "-S",
            str(cpp_build.ROOT / "samples" / "cpp_consumer"),
            "-B",
            str(consumer),
            f"-DCMAKE_PREFIX_PATH={prefix}",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["cmake", "--build", str(consumer)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    path = sample_artifact("mlp")
    r = subprocess.run([str(consumer / "consumer"), str(path), "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = bladepack.load(path)(np.full((3, 64), 0.5, np.float32))
    line = next(x for x in r.stdout.splitlines() if x.startswith("output0:"))
    assert line.startswith("output0: 3 10 sum ")
    assert abs(float(line.split()[-1]) - float(want.sum(dtype=np.float64))) <= 1e-5 * abs(float(want.sum()))
    r = subprocess.run([str(prefix / "bin" / "bpk-run"), str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "x: float32[batch, 64]" in r.stdout, r.stderr


def test_demo_with_cpp(release: Path) -> None:
    """The README's demo, with its C++ leg (the MLP sample: quickest to optimize)."""
    r = subprocess.run(
        [sys.executable, "-m", "samples.demo", "--sample", "mlp", "--cpp", "--out", str(TMP / "demo")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cpp_build.ROOT,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "C++ runtime: max relative error" in r.stdout and r.stdout.rstrip().endswith("OK")
    assert "child: bladepack verify: 6 of 6 reference cases pass here (oracle: torch eager)" in r.stdout, r.stdout
    assert "bpk-run --verify: verify: passed (6 of 6 cases passed)" in r.stdout, r.stdout
