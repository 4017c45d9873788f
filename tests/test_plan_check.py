"""Note [Plan checks]: a plan edited and re-hashed (every checksum recomputed) gets a BpkFormatError
from the Python loader, at load or at the first call of a shape, never a crash or a silent result."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import bladepack
from bladepack.artifact import format as bpk_format
from bladepack.errors import BpkFormatError


def _rehashed(art: bladepack.api.Artifact, edit: Callable[[dict[str, Any]], None]) -> bytes:
    bpk = bpk_format.read(art.to_bytes())
    sections = [bpk_format.Section(n, bytes(bpk.section(n))) for n in bpk.section_names]
    manifest = copy.deepcopy({k: v for k, v in bpk.manifest.items() if k != "sections"})
    edit(manifest)
    return b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))


def _gemm(m: dict[str, Any]) -> dict[str, Any]:
    return next(lr for lr in m["native_cpu"]["launches"] if lr["op"] == "gemm")


def _kernel(m: dict[str, Any]) -> dict[str, Any]:
    return next(lr for lr in m["native_cpu"]["launches"] if lr["op"] == "kernel")


def _set(get: Callable[[dict[str, Any]], Any], key: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        get(m)[key] = value

    return edit


def _gemm_int(k: int, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        _gemm(m)["ints"][k] = value

    return edit


def _output_shape(m: dict[str, Any]) -> None:
    out = m["outputs"][0]["id"]
    next(v for v in m["values"] if v["id"] == out)["shape"] = [1, 1]


NATIVE = lambda m: m["native_cpu"]  # noqa: E731
EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "GEMM M from the arena size's register": (
        lambda m: _gemm(m)["ints"].__setitem__(12, m["native_cpu"]["arena_bytes"]),
        "operand A reaches",
    ),
    "GEMM lda 2**30": (_gemm_int(17, 1 << 30), "operand A reaches"),
    "GEMM batch 2**31": (_gemm_int(0, 1 << 31), "the batches of D overlap"),
    "GEMM M huge": (_gemm_int(12, 1 << 40), "a dim or leading dim above"),
    "GEMM negative stride": (_gemm_int(3, -5), "negative count or stride"),
    "GEMM transpose flag 7": (_gemm_int(15, 7), "transpose flag"),
    "GEMM ldc too short": (_gemm_int(19, 1), "leading dim is shorter"),
    "GEMM empty ints": (_set(_gemm, "ints", []), "a GEMM takes 3 pointers and 20 integers"),
    "GEMM register 10**6": (_gemm_int(13, {"r": 10**6}), "neither an integer nor a register"),
    "pointer slot 1000000": (lambda m: _kernel(m)["ptrs"].__setitem__(0, [1000000, 0]), "slots are 0 to"),
    "pointer offset -64": (lambda m: _kernel(m)["ptrs"].__setitem__(0, [0, -64]), "points -64 bytes into slot 0"),
    "pointer past the arena": (lambda m: _kernel(m)["ptrs"].__setitem__(0, [0, 1 << 40]), "bytes into slot 0"),
    "arena 0 bytes": (_set(NATIVE, "arena_bytes", 0), "does not fit in the 0-byte arena"),
    "buffer past the arena": (
        lambda m: m["native_cpu"]["buffers"][0].__setitem__("offset", 1 << 40),
        r"arena buffer %\d+ \(\d+ bytes at 1099511627776\) does not fit",
    ),
    "buffer without a shape": (
        lambda m: m["native_cpu"]["buffers"][0].pop("shape"),
        r"arena buffer %\d+ has shape None; a list is required",
    ),
    "nameless kernel": (lambda m: m["kernels"][0].pop("name"), "kernel 0 has name None; a string is required"),
    "output names an input": (
        lambda m: m["outputs"][0].__setitem__("id", m["inputs"][0]["id"]),
        r"output 0 is written to slot 2 but is %\d+, no value of the plan",
    ),
    "outputs [0]": (_set(NATIVE, "outputs", [0]), "output 0 is written to slot 0"),
    "kernel -1": (_set(_kernel, "k", -1), "runs kernel -1"),
    "unknown launch op": (_set(_kernel, "op", "syscall"), "has op 'syscall'"),
    "variant function 999": (
        lambda m: m["kernels"][0]["variants"][0].__setitem__("fn", 999),
        "names function 999",
    ),
    "ABI 2": (_set(NATIVE, "abi", 2), "native CPU plan ABI 2 is not 1"),
    "no library list": (lambda m: m["native_cpu"].pop("libraries"), "native_cpu.libraries must list"),
    # Note [Kernel operand checks]: the kernel library's own checks of a generated kernel's operands
    "output value shape [1, 1]": (_output_shape, r"\(kernel k2\): pointer 0 reaches \d+ bytes; its tensor holds 4 "),
    "kernel integer from the arena size's register": (
        lambda m: _kernel(m)["ints"].__setitem__(0, m["native_cpu"]["arena_bytes"]),
        r"\(kernel k0\): pointer 0 reaches \d+ bytes; its tensor holds \d+ from there",
    ),
    "kernel integer -1": (lambda m: _kernel(m)["ints"].__setitem__(0, -1), "integer 0 is a negative size"),
    "kernel integer 2**62": (lambda m: _kernel(m)["ints"].__setitem__(0, 1 << 62), "0's buffer has a negative dim"),
    "kernel given an extra integer": (
        lambda m: _kernel(m)["ints"].append(7),
        "passes 3 pointers and 2 integers; its function takes 3 and 1",
    ),
    "kernel given one pointer less": (lambda m: _kernel(m)["ptrs"].pop(), "passes 2 pointers and 1 integers"),
    "kernel writing a weight": (
        lambda m: _kernel(m)["ptrs"].__setitem__(0, [4, 0]),
        "writes through pointer 0 into slot 4, an input or a weight",
    ),
    "kernel writing its input": (
        lambda m: _kernel(m)["ptrs"].__setitem__(0, [1, 0]),
        "writes through pointer 0 into slot 1, an input or a weight",
    ),
    "GEMM writing a weight": (
        lambda m: _gemm(m)["ptrs"].__setitem__(2, [3, 0]),
        "writes through pointer 2 into slot 3",
    ),
    "ref of no step": (
        lambda m: m["native_cpu"]["launches"].append({"op": "ref", "node": 10**6, "reason": ""}),
        "no plan step",
    ),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_edited_plans_are_refused(mlp_artifact: bladepack.api.Artifact, name: str) -> None:
    edit, message = EDITS[name]
    data = _rehashed(mlp_artifact, edit)
    with pytest.raises(BpkFormatError, match=message):
        m = bladepack.load(data, executor="native")
        for b in (1, 5, 64):
            m(np.ones((b, 64), np.float32))


def test_untouched_plans_pass(mlp_artifact: bladepack.api.Artifact, two_input_artifact: bladepack.api.Artifact) -> None:
    for art in (mlp_artifact, two_input_artifact):
        data = _rehashed(art, lambda m: None)
        m = bladepack.load(data, executor="native")
        assert m.executor.startswith("native")


def test_edited_plans_never_crash_the_process(mlp_artifact: bladepack.api.Artifact, tmp_path: Any) -> None:
    """The same edits in a fresh process: it exits cleanly with the error, never by a signal."""
    for k, name in enumerate(sorted(EDITS)):
        path = tmp_path / f"{k}.bpk"
        path.write_bytes(_rehashed(mlp_artifact, EDITS[name][0]))
    code = (
        "import sys, numpy as np, bladepack\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        m = bladepack.load(p, executor='native')\n"
        "        [m(np.ones((b, 64), np.float32)) for b in (1, 5, 64)]\n"
        "        print(p, 'ran')\n"
        "    except bladepack.BladepackError as e:\n"
        "        print(p, type(e).__name__)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, *(str(tmp_path / f"{k}.bpk") for k in range(len(EDITS)))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("BpkFormatError") == len(EDITS), r.stdout


def test_inconsistent_kernel_integers_are_refused(two_input_artifact: bladepack.api.Artifact) -> None:
    """A kernel integer derived from the shape symbols (3 x batch here) set to another register's value."""
    data = _rehashed(two_input_artifact, lambda m: _kernel(m)["ints"].__setitem__(1, _kernel(m)["ints"][0]))
    m = bladepack.load(data, executor="native")
    with pytest.raises(BpkFormatError, match=r"\(kernel k0\): passes 4 as integer 1; its shape symbols make it 12"):
        m(np.ones((4, 6, 3), np.float32), np.ones((4, 6), np.float32))


PER_SIGNATURE = [
    n
    for n in EDITS
    if n.startswith(("GEMM", "kernel i", "kernel g", "kernel w", "output value"))
    and "ints" not in n
    and "10**6" not in n
] + [
    "pointer offset -64",
    "pointer past the arena",
    "arena 0 bytes",
]


# load-time checks both loaders word alike (references to registers and plan steps are worded per loader)
AT_LOAD = ["ABI 2", "GEMM empty ints", "kernel -1", "outputs [0]", "pointer slot 1000000", "unknown launch op"]
AT_LOAD.append("variant function 999")


def test_bpk_run_refuses_the_same_edits(mlp_artifact: bladepack.api.Artifact, tmp_path: Any) -> None:
    """bpk-run exits with an error (never a signal) on every edit; the per-signature checks and the
    load-time checks of AT_LOAD give the Python loader's message."""
    from tests import cpp_build

    build = cpp_build.build("release")
    x = tmp_path / "x.npy"
    np.save(x, np.ones((5, 64), np.float32))
    for k, name in enumerate(sorted(EDITS)):
        path = tmp_path / f"{k}.bpk"
        path.write_bytes(_rehashed(mlp_artifact, EDITS[name][0]))
        r = subprocess.run(
            [str(build / "bpk-run"), str(path), "--input", f"x={x}", "--output-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 1 and r.stderr.startswith("bpk-run: "), (name, r.returncode, r.stderr)
        if name in PER_SIGNATURE or name in AT_LOAD:
            with pytest.raises(BpkFormatError) as e:
                bladepack.load(path, executor="native")(np.ones((5, 64), np.float32))
            assert r.stderr.strip() == f"bpk-run: format error: {e.value}", name


def _both_checks(m: Any, checks: Any, key: Any, regs: Any) -> list[Any]:
    """check_launches' and LaunchChecks' outcomes at one signature: the slot sizes, or the error text."""
    from bladepack.loader.plan_check import check_launches

    outs = [s for s, _ in m.output_specs(regs)]
    outcome: list[Any] = []
    for check in (lambda: check_launches(m, "cpu", key, regs, outs), lambda: checks(key, regs, outs)):
        try:
            outcome.append(check())
        except BpkFormatError as e:
            outcome.append(str(e))
    return outcome


def test_vectorized_launch_checks_agree(mlp_artifact: bladepack.api.Artifact) -> None:
    """Note [Vectorized launch checks]: at every signature LaunchChecks passes exactly where
    check_launches does, with the same slot sizes, and raises its error word for word where it fails
    (every edit above that the load-time checks let through, and the plan untouched)."""
    from bladepack.loader.launch_checks import LaunchChecks
    from bladepack.loader.manifest import Manifest
    from bladepack.loader.plan_check import check_plan

    compared = 0
    for name in ["untouched", *sorted(EDITS)]:
        edit = EDITS[name][0] if name in EDITS else (lambda m: None)
        m = Manifest.read(bpk_format.read(_rehashed(mlp_artifact, edit)))
        try:
            check_plan(m, "cpu", None)
        except BpkFormatError:
            continue  # refused at load
        checks = LaunchChecks(m, "cpu")
        for b in (1, 5, 64):
            key = ((b, 64),)
            try:
                regs = m.registers(key)
            except bladepack.BladepackError:
                continue
            outcome = _both_checks(m, checks, key, regs)
            assert outcome[0] == outcome[1], (name, b)
            compared += 1
    assert compared >= 3 * 20, compared


@pytest.mark.parametrize("offset", ["in place", 1 << 40, -8])
def test_vectorized_checks_of_data_conditions(offset: Any) -> None:
    """A data condition's byte offset (Note [Guarded launches]) past its slot, or before it, is refused
    by both forms of the per-signature checks in the same words."""
    import torch

    from bladepack.loader.launch_checks import LaunchChecks
    from bladepack.loader.manifest import Manifest
    from tests.test_branches import BATCH, _Branchy

    torch.manual_seed(0)
    art = bladepack.optimize(_Branchy().eval(), [(torch.randn(3, 8),), (torch.randn(6, 8),)], ({0: BATCH},))

    def edit(m: dict[str, Any]) -> None:
        for lr in m["native_cpu"]["launches"]:
            for c in lr.get("when", ()):
                if "ptr" in c and offset != "in place":
                    c["ptr"][1] = offset

    m = Manifest.read(bpk_format.read(_rehashed(art, edit)))
    checks = LaunchChecks(m, "cpu")
    for b in (1, 6, 64):
        key = ((b, 8),)
        outcome = _both_checks(m, checks, key, m.registers(key))
        assert outcome[0] == outcome[1], (offset, b)
        assert isinstance(outcome[0], str) == (offset != "in place"), outcome[0]
