"""Self-verifying artifacts (Note [Reference cases] in bladepack/artifact/reference_cases.py): every
sample verifies where it loads; the recorded cases cover every kernel variant and GEMM dispatch entry
that the shape program lets any shape in the range reach (checked against an independent sweep of
shapes, not a count); a tampered weight, a wrong BLAS and a miscompiled kernel variant are each caught
and named; the C++ runtime's `bpk-run --verify` gives the Python loader's verdict lines."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack.api import Artifact
from bladepack.artifact.reference_cases import compare, covered, generate
from bladepack.cli import main as cli
from bladepack.errors import BpkFormatError, CompileError, ExecutionError
from bladepack.loader.verify import machine_bytes, report_text, verdict_line
from bladepack.options import CompileOptions, LoaderOptions
from samples.registry import SAMPLES
from tests.helpers import reachable_items, with_manifest
from tests.test_cpp_runtime import bpk_run


@pytest.fixture(scope="module")
def artifacts() -> dict[str, Artifact]:
    return {
        name: bladepack.optimize(SAMPLES[name].build(), SAMPLES[name].export_samples(), SAMPLES[name].dynamic_shapes)
        for name in sorted(SAMPLES)
    }


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_verify_and_cover_every_reachable_variant(artifacts: dict[str, Artifact], name: str) -> None:
    art = artifacts[name]
    assert art.reference_cases is not None, art.notes
    record, _ = art.reference_cases
    manifest, _ = art._parts()
    recorded = {i for c in record["cases"] for i in c["covers"]}
    assert reachable_items(manifest) <= recorded, sorted(reachable_items(manifest) - recorded)
    assert record["uncovered"] == [], record["uncovered"]
    assert record["oracle"] == "torch eager"
    lows = {s["name"]: s["min"] for s in manifest["symbols"]}
    assert record["cases"][0]["dims"] == lows  # size 1 (the range's low end) first
    for executor in ("native", "reference"):
        report = bladepack.load(art.to_bytes(), executor=executor).verify()
        assert report["passed"] is True, report_text(name, executor, report)
        for case in report["cases"]:
            assert case["outputs"] and all(o["scaled"] < 1e-5 for o in case["outputs"]), case


def test_variants_picked_by_thresholds_are_covered() -> None:
    """A softmax over a row whose length varies picks its SIMD variant only from some length on: the
    cases hold a row below and one above, and the sweep agrees."""

    class Rows(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x * 2, dim=-1)

    n = bladepack.Dim("n", 1, 300)
    art = bladepack.optimize(Rows(), [(torch.randn(3, 5),), (torch.randn(3, 9),)], ({1: n},))
    record, _ = art.reference_cases  # type: ignore[misc]
    manifest, _ = art._parts()
    variants = {f"cpu {k['name']} {v['name']}" for k in manifest["kernels"] for v in k["variants"]}
    recorded = {i for c in record["cases"] for i in c["covers"]}
    assert len([v for v in variants if "softmax" in v or "_simd" in v or "_scalar" in v]) >= 2, variants
    assert reachable_items(manifest) <= recorded and variants <= recorded, (variants, recorded)
    assert bladepack.load(art.to_bytes()).verify()["passed"] is True


def test_generate_is_deterministic_and_in_range() -> None:
    u = generate({"seed": 5, "uniform": [-2.0, 3.0]}, (4, 7), np.dtype(np.float32))
    assert u.shape == (4, 7) and u.dtype == np.float32 and (u >= -2).all() and (u <= 3).all()
    assert np.array_equal(u, generate({"seed": 5, "uniform": [-2.0, 3.0]}, (4, 7), np.dtype(np.float32)))
    assert not np.array_equal(u, generate({"seed": 6, "uniform": [-2.0, 3.0]}, (4, 7), np.dtype(np.float32)))
    i = generate({"seed": 1, "integers": [3, 9]}, (1000,), np.dtype(np.int64))
    assert set(i.tolist()) == set(range(3, 10))
    c = generate({"seed": 2, "choice": [0.0, float("-inf")]}, (64,), np.dtype(np.float32))
    assert set(c.tolist()) == {0.0, float("-inf")}
    b = generate({"seed": 2, "choice": [0, 1]}, (64,), np.dtype(np.bool_))
    assert b.dtype == np.bool_ and b.any() and not b.all()
    # element i draws splitmix64(seed + i), written here in plain Python (the C++ runtime draws the same)
    mask = 2**64 - 1

    def splitmix64(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    assert splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's published first output
    span = 2**62 + 1
    want = [splitmix64(2**64 - 3 + i) % span for i in range(5)]  # the seed wraps around 2^64
    assert generate({"seed": -3, "integers": [0, 2**62]}, (5,), np.dtype(np.int64)).tolist() == want
    with pytest.raises(ValueError, match="uniform values for a int64 input"):
        generate({"seed": 0, "uniform": [0, 1]}, (2,), np.dtype(np.int64))


def test_compare_rule() -> None:
    w = np.array([1.0, -2.0, np.inf, np.nan, 100.0], np.float32)
    assert compare(w.copy(), w, "float32")[0]
    near = w.copy()
    near[4] += 5e-3  # 5e-3 <= 1e-4 * 100
    assert compare(near, w, "float32")[0]
    far = w.copy()
    far[0] += 2e-2
    ok, err, scaled = compare(far, w, "float32")
    assert not ok and abs(err - 2e-2) < 1e-6 and abs(scaled - 2e-4) < 1e-6
    nan_moved = w.copy()
    nan_moved[3] = 0.0
    assert not compare(nan_moved, w, "float32")[0]
    inf_lost = w.copy()
    inf_lost[2] = 1e30
    assert not compare(inf_lost, w, "float32")[0]
    assert compare(np.array([1, 2]), np.array([1, 2]), "int64")[0]
    assert not compare(np.array([1, 3]), np.array([1, 2]), "int64")[0]


def test_tampered_weight_is_caught(artifacts: dict[str, Artifact], tmp_path: Path, capsys: Any) -> None:
    art = artifacts["encoder"]
    name = next(iter(art.weights))
    weights = dict(art.weights)
    weights[name] = weights[name] * 1.05  # the checksums are recomputed: only verify can tell
    tampered = copy.copy(art)
    tampered.weights = weights
    path = tmp_path / "tampered.bpk"
    tampered.save(path)
    report = bladepack.load(path).verify()
    assert report["passed"] is False and not any(c["passed"] for c in report["cases"]), report
    assert cli(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    cases = len(report["cases"])
    assert (
        "FAIL: output 'output0' differs" in out and f"verify: FAILED ({cases} of {cases} cases failed, 0 passed)" in out
    ), out
    good = tmp_path / "good.bpk"
    art.save(good)
    assert cli(["verify", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True


WRONG_BLAS = r"""
/* A deliberately wrong BLAS: a correct GEMM, then every result 1% too large. */
#include <stddef.h>
enum { RowMajor = 101, ColMajor = 102, NoTrans = 111 };
#define GEMM(NAME, T)                                                                                 \
  void NAME(int order, int ta, int tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, \
            int ldb, T beta, T* C, int ldc) {                                                         \
    for (int i = 0; i < M; ++i)                                                                       \
      for (int j = 0; j < N; ++j) {                                                                   \
        T acc = 0;                                                                                    \
        for (int k = 0; k < K; ++k) {                                                                 \
          int ra = ta == NoTrans ? i : k, ca = ta == NoTrans ? k : i;                                 \
          int rb = tb == NoTrans ? k : j, cb = tb == NoTrans ? j : k;                                 \
          T a = order == RowMajor ? A[(size_t)ra * lda + ca] : A[(size_t)ca * lda + ra];              \
          T b = order == RowMajor ? B[(size_t)rb * ldb + cb] : B[(size_t)cb * ldb + rb];              \
          acc += a * b;                                                                               \
        }                                                                                             \
        T* c = order == RowMajor ? &C[(size_t)i * ldc + j] : &C[(size_t)j * ldc + i];                 \
        *c = (T)1.01 * (alpha * acc + (beta == 0 ? 0 : beta * *c));                                   \
      }                                                                                               \
  }
GEMM(cblas_sgemm, float)
GEMM(cblas_dgemm, double)
"""


@pytest.fixture(scope="module")
def wrong_blas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("blas")
    (d / "wrong_blas.c").write_text(WRONG_BLAS)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(d / "libwrong.so"), str(d / "wrong_blas.c")], check=True)
    return d / "libwrong.so"


def test_wrong_blas_is_caught(mlp_artifact: Artifact, wrong_blas: Path, release: Path, tmp_path: Path) -> None:
    path = tmp_path / "mlp.bpk"
    mlp_artifact.save(path)  # the BLAS-GEMM plan (the samples' linear layers are dense kernels)
    report = bladepack.load(path, options=LoaderOptions.from_env(blas=str(wrong_blas))).verify()
    assert report["passed"] is False, report
    failing = [c for c in report["cases"] if not c["passed"]]
    assert failing and all(c["error"] is None for c in failing), failing  # wrong numbers, not an error
    r = bpk_run(release, str(path), "--verify", env={"BLADEPACK_BLAS": str(wrong_blas)})  # bpk-run's process
    assert r.returncode == 1, r.stdout + r.stderr
    assert _verdicts(r.stdout) == [verdict_line(c) for c in report["cases"]], r.stdout
    assert bladepack.load(path).verify()["passed"] is True


def test_miscompiled_variant_is_caught_and_named(artifacts: dict[str, Artifact]) -> None:
    """The encoder's fused attention has a wide, a blocked and a rows variant; a library whose wide
    variant scales the scores by the wrong constant (a miscompile) fails exactly the cases that ran it."""
    from bladepack.codegen.toolchain import build_libraries, find_compiler
    from bladepack.options import CompileOptions

    art = artifacts["encoder"]
    src = art.sources.unit("cpu")
    start = src.index("k2_wide(")
    body_end = src.index("\n}\n", start)
    body = src[start:body_end]
    assert "= 4.0f;" in body, body[:1500]  # 1 / sqrt(head dim 16)
    # in every ISA library's branch (Note [Attention groups per ISA]: AVX2 and AVX-512 blocks differ)
    broken = src[:start] + body.replace("= 4.0f;", "= 4.5f;") + src[body_end:]
    options = CompileOptions.from_env()
    cxx = find_compiler(options.cxx)
    assert cxx is not None
    libs = build_libraries(broken, options.cache_dir, cxx, options.cpu_isas)
    bad = copy.copy(art)
    bad.cpu_libraries = [(lib.isa.name, lib.isa.requires, lib.data) for lib in libs]
    report = bladepack.load(bad.to_bytes()).verify()
    for case in report["cases"]:
        ran_wide = "cpu k2 k2_wide" in case["ran"]
        assert case["passed"] is not ran_wide, case
    assert any("cpu k2 k2_wide" in c["ran"] for c in report["cases"])


def _verdicts(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("case ")]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_cpp_verify_gives_the_same_verdicts(
    artifacts: dict[str, Artifact], name: str, release: Path, tmp_path: Path
) -> None:
    path = tmp_path / f"{name}.bpk"
    artifacts[name].save(path)
    report = bladepack.load(path).verify()
    r = bpk_run(release, str(path), "--verify")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _verdicts(r.stdout) == [verdict_line(c) for c in report["cases"]], (r.stdout, report)
    # the whole report agrees to the digit: the same kernels on the same seeded inputs, the same
    # coverage items derived by both shape-program evaluators
    executor = bladepack.load(path).executor
    assert r.stdout == report_text(str(path), executor, report)
    assert r.stdout.endswith(f"verify: passed ({len(report['cases'])} of {len(report['cases'])} cases passed)\n")


def test_records_without_cases_and_malformed_records(
    artifacts: dict[str, Artifact], release: Path, tmp_path: Path
) -> None:
    s = SAMPLES["mlp"]
    plain = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, reference_cases=False)
    assert plain.reference_cases is None
    report = bladepack.load(plain.to_bytes()).verify()
    assert report["passed"] is None and report["cases"] == []
    with pytest.raises(ValueError, match="reference_cases must be True, False or a byte budget"):
        bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, reference_cases=-1)
    art = artifacts["mlp"]
    for edit in (
        lambda m: m["reference_cases"]["cases"][0].pop("inputs"),
        lambda m: m["reference_cases"]["cases"][0]["inputs"][0].__setitem__("uniform", "x"),
        lambda m: m["reference_cases"]["cases"][0]["outputs"][0].__setitem__("shape", [3]),
        lambda m: m["reference_cases"]["cases"][0]["dims"].__setitem__("batch", 10**12),
    ):
        data = with_manifest(art, edit)
        with pytest.raises(BpkFormatError, match="malformed manifest: reference_cases"):
            bladepack.load(data).verify()
        path = tmp_path / "edited.bpk"
        path.write_bytes(data)
        r = bpk_run(release, str(path), "--verify")
        assert (
            r.returncode == 1 and "format error: " in r.stderr and "malformed manifest: reference_cases" in r.stderr
        ), (
            r.stdout,
            r.stderr,
        )
    # an unbounded symbol recorded at 2^40: the inputs cannot be made, which is an error, not a crash
    huge = with_manifest(
        artifacts["encoder"], lambda m: m["reference_cases"]["cases"][0]["dims"].__setitem__("batch", 2**40)
    )
    with pytest.raises(ExecutionError, match=r"cannot allocate a reference input of shape \[1099511627776, "):
        bladepack.load(huge).verify()

    # Note [Reference input sizes]: inputs a little over the machine's memory, which an overcommitting
    # allocator would hand out, are refused before any is made, in both loaders
    def just_over(m: dict[str, Any]) -> None:
        dims = m["reference_cases"]["cases"][0]["dims"]
        per_batch = sum(
            int(np.prod([1 if d == "batch" else dims.get(d, d) for d in t["shape"]])) * np.dtype(t["dtype"]).itemsize
            for t in m["inputs"]
        )
        dims["batch"] = machine_bytes() // per_batch + 1

    over = with_manifest(artifacts["encoder"], just_over)
    with pytest.raises(ExecutionError, match="more than this machine's .* bytes of memory"):
        bladepack.load(over).verify()
    path.write_bytes(over)
    r = bpk_run(release, str(path), "--verify")
    assert r.returncode != 0 and "more than this machine's" in r.stderr, (r.stdout, r.stderr)
    plain_path = tmp_path / "plain.bpk"
    plain.save(plain_path)
    r = bpk_run(release, str(plain_path), "--verify")
    assert r.returncode == 0 and "no reference cases recorded" in r.stdout, r.stdout + r.stderr

    def lie(m: dict[str, Any]) -> None:
        m["reference_cases"]["cases"][0]["covers"] = ["cpu k0 k0_nothing"]

    data = with_manifest(art, lie)
    report = bladepack.load(data).verify()
    assert report["cases"][0]["passed"] is False and "the shape program picks" in report["cases"][0]["error"]
    path.write_bytes(data)
    r = bpk_run(release, str(path), "--verify")
    assert r.returncode == 1 and _verdicts(r.stdout)[0] == verdict_line(report["cases"][0]), r.stdout


def test_budget_limits_the_cases(tmp_path: Path) -> None:
    s = SAMPLES["encoder"]
    small = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, reference_cases=3000)
    record, sections = small.reference_cases  # type: ignore[misc]
    assert sum(len(b) for b in sections.values()) <= 3000
    assert record["uncovered"] and all(u["why"] == "over the reference-case budget" for u in record["uncovered"])
    from bladepack.inspect import inspect_text, manifest_summary

    text = inspect_text(manifest_summary(small._parts()[0]))
    # three small cases fit: seq 1 runs the fused attention's rows variant and the dense kernels' tiles
    # of one row, seq 4 its blocked variant and tiles of four, batch 2 tiles of two (Note [Dense tiles])
    assert "reference cases: 3 (batch=1, seq=1; batch=1, seq=4; batch=2, seq=1), oracle torch eager;" in text, text
    assert "  not covered: cpu k2 k2_wide (over the reference-case budget)" in text, text


def test_onnx_models_verify_against_onnx_reference(tmp_path: Path) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.fc(x).relu(), dim=-1)

    path = tmp_path / "net.onnx"
    torch.onnx.export(
        Net().eval(), (torch.randn(2, 8),), str(path), input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "batch"}}, dynamo=False,
    )  # fmt: skip
    art = bladepack.optimize(str(path), [(np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32),)])
    record, _ = art.reference_cases  # type: ignore[misc]
    assert record["oracle"] == "onnx reference evaluator"
    assert bladepack.load(art.to_bytes()).verify()["passed"] is True
    out = tmp_path / "net.bpk"
    r = subprocess.run(
        [sys.executable, "-m", "bladepack.cli", "optimize", str(path), "-o", str(out), "--reference-cases", "0"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "reference cases: none" in r.stdout


def test_optimize_runs_the_cases_it_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """An artifact whose kernels disagree with the oracle is a CompileError naming the case at optimize
    time (here the oracle is made 10% off, as a model whose eager path differs from its exported graph
    would be); self_check="warn" keeps the artifact with the failure in its notes (Note [Self-check])."""
    import bladepack.export.oracle as oracle_module

    real = oracle_module.torch_oracle

    def off(model: nn.Module) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        run = real(model)
        return lambda arrays: [o * np.float32(1.1) for o in run(arrays)]

    monkeypatch.setattr(oracle_module, "torch_oracle", off)
    s = SAMPLES["mlp"]
    said = "the artifact differs from torch eager in reference cases (case 0: batch=1 (1x64): FAIL: output 'output0' differs"
    with pytest.raises(CompileError) as e:
        bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes)
    assert said in str(e.value) and "BLADEPACK_SELF_CHECK=warn" in str(e.value), e.value
    art = bladepack.optimize(
        s.build(), s.export_samples(), s.dynamic_shapes, options=CompileOptions.from_env(self_check="warn")
    )
    assert any(said in n and n.endswith("please report it") for n in art.notes), art.notes


class _MixedPrecision(nn.Module):
    """A float64 output computed through a float32 product, an int64 output and a float32 one."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 48))
        self.w64 = nn.Parameter(torch.randn(48, 8, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x @ self.w
        return (h.double() @ self.w64, h.argmax(-1), h.double().sum(-1), x.double() * 2)


def test_verdict_tolerance_follows_the_precision_an_output_is_computed_in(release: Path, tmp_path: Path) -> None:
    """Note [Verdict tolerance]: a float64 output of float32 arithmetic is judged at float32's 1e-4 (it
    was held to float64's 1e-9 and failed on a correct artifact), an integer output exactly, a float64
    output of float64 arithmetic from a float32 input at 1e-4 too (the input's rounding is in it). The
    C++ runtime reads the same record (tests/test_cpp_runtime.py checks its verify on shared vectors)."""
    model = _MixedPrecision().eval()
    art = bladepack.optimize(model, [(torch.randn(3, 64),), (torch.randn(5, 64),)])
    record, _ = art.reference_cases  # type: ignore[misc]
    assert record["tolerance"] == [1e-4, 0.0, 1e-4, 1e-4], record["tolerance"]
    report = bladepack.load(art.to_bytes()).verify()
    assert report["passed"] is True, report
    assert [o["tolerance"] for o in report["cases"][0]["outputs"]] == [1e-4, 0.0, 1e-4, 1e-4]
    path = tmp_path / "mixed.bpk"
    art.save(path)
    r = bpk_run(release, str(path), "--verify")  # the C++ runtime judges alike, to the digit
    assert r.returncode == 0 and r.stdout == report_text(str(path), bladepack.load(path).executor, report), r.stdout
    assert "(tolerance 1e-04)" in r.stdout and "(tolerance 0e+00)" in r.stdout, r.stdout
    # a record without the list (format 1.4 before it) judges by each output's dtype
    bare = with_manifest(art, lambda m: m["reference_cases"].pop("tolerance"))
    assert [o["tolerance"] for o in bladepack.load(bare).verify()["cases"][0]["outputs"]] == [1e-9, 0.0, 1e-9, 1e-9]
    nested: Any = 1.0
    for _ in range(1000):  # printed bounded (a repr of it recursed too deeply); bpk-run refuses the depth itself
        nested = [nested]
    for k, bad in enumerate(
        ([1e-4], [1e-4, 0.0, "x", 1e-4], [1e-4, 0.0, 2.0, 1e-4], [1e-4, 0.0, True, 1e-4], [1e-4, 0.0, nested, 1e-4])
    ):
        broken = with_manifest(art, lambda m, bad=bad: m["reference_cases"].__setitem__("tolerance", bad))
        with pytest.raises(BpkFormatError, match="malformed manifest: reference_cases .*tolerance"):
            bladepack.load(broken).verify()
        (tmp_path / f"broken{k}.bpk").write_bytes(broken)
        r = bpk_run(release, str(tmp_path / f"broken{k}.bpk"), "--verify")
        cpp_says = (
            "manifest is not valid msgpack (depth size overflow)"
            if nested in bad
            else "malformed manifest: reference_cases"
        )
        assert r.returncode != 0 and cpp_says in r.stderr + r.stdout, (bad, r.stderr)


def test_coverage_items_of_cutlass_dispatch_and_guarded_launches() -> None:
    """CUTLASS dispatch entries (the first entry whose predicate register holds, per table) and kernels
    whose launches a shape condition rules out, on a hand-written manifest (docs/format.md)."""
    from bladepack.artifact.reference_cases import all_items

    m = {
        "kernels": [
            {"name": "k0", "target": "cpu", "variants": [{"name": "k0_v8", "pred": 2}, {"name": "k0", "pred": 1}]},
            {
                "name": "k0",
                "target": "cuda",
                "variants": [{"name": "k0_warp", "pred": 3}, {"name": "k0_block", "pred": 1}],
            },
        ],
        "gemm_configs": [
            {"node": 7, "library": "blas"},
            {"node": 9, "library": "cutlass", "dispatch": [{}, {}, {}], "dispatch_sm90": [{}, {}]},
        ],
        "native_cpu": {"launches": [{"op": "kernel", "k": 0, "when": [{"r": 4, "is": True}]}]},
        "native_cuda": {
            "launches": [
                {"op": "kernel", "k": 0},
                {
                    "op": "cutlass",
                    "entries": [{"pred": 2}, {"pred": 3}, {"pred": 1}],
                    "entries_sm90": [{"pred": 3}, {"pred": 1}],
                },
            ]
        },
    }
    assert all_items(m) == [
        "cpu k0 k0_v8", "cpu k0 k0", "cuda k0 k0_warp", "cuda k0 k0_block",
        "gemm %9 dispatch 0", "gemm %9 dispatch 1", "gemm %9 dispatch 2",
        "gemm %9 dispatch_sm90 0", "gemm %9 dispatch_sm90 1",
    ]  # fmt: skip
    # registers: r1 = 1 (always), r2, r3 the predicates, r4 the CPU launch's shape condition
    assert covered(m, [0, 1, 1, 0, 1]) == [
        "cpu k0 k0_v8",
        "cuda k0 k0_block",
        "gemm %9 dispatch 0",
        "gemm %9 dispatch_sm90 1",
    ]
    assert covered(m, [0, 1, 0, 1, 0]) == ["cuda k0 k0_warp", "gemm %9 dispatch 1", "gemm %9 dispatch_sm90 0"]


def test_16_bit_inputs_record_no_cases_and_say_why() -> None:
    """bfloat16 sample tensors (numpy has no bfloat16) reach the recorder without an error escaping; the
    artifact records no cases and its notes say why."""
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).to(torch.bfloat16).eval()
    samples = [(torch.randn(b, 8, dtype=torch.bfloat16),) for b in (2, 3)]
    art = bladepack.optimize(model, samples)
    assert art.reference_cases is None
    assert any("input 'input' is bfloat16" in n or "is bfloat16: reference cases" in n for n in art.notes), art.notes
