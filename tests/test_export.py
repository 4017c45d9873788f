"""The torch.export front end: dynamic-dim inference, ranges, unsupported ops, model families."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bladepack
from tests.helpers import as_tuple, check_against_eager, compile_model


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_batch_one_after_samples_two_and_four() -> None:
    m = TwoLayer().eval()
    loaded = compile_model(m, [(torch.randn(2, 8),), (torch.randn(4, 8),)])
    (sym,) = loaded.signature.symbols
    assert (sym.min, sym.max) == (1, None)
    for b in (1, 3, 100):
        check_against_eager(m, loaded, (torch.randn(b, 8),))


def test_sample_with_dim_one_is_enlarged_not_specialized() -> None:
    m = TwoLayer().eval()
    loaded = compile_model(m, [(torch.randn(1, 8),), (torch.randn(3, 8),)])
    assert loaded.signature.inputs[0].shape == ("x_dim0", 8)
    check_against_eager(m, loaded, (torch.randn(1, 8),))


def test_single_sample_is_static() -> None:
    m = TwoLayer().eval()
    loaded = compile_model(m, (torch.randn(3, 8),))
    assert loaded.signature.inputs[0].shape == (3, 8) and not loaded.signature.symbols
    with pytest.raises(bladepack.InputError, match="static and must be 3"):
        loaded(torch.randn(4, 8))


def test_torch_export_dim_accepted() -> None:
    m = TwoLayer().eval()
    loaded = compile_model(m, (torch.randn(3, 8),), dynamic_shapes=({0: torch.export.Dim("rows", min=1, max=32)},))
    assert [(s.name, s.min, s.max) for s in loaded.signature.symbols] == [("rows", 1, 32)]


def test_model_bound_discovered_and_user_max_narrowed(caplog: pytest.LogCaptureFixture) -> None:
    class Pos(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.randn(512, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.table[: x.shape[1]]

    m = Pos().eval()
    with caplog.at_level(logging.WARNING, logger="bladepack"):
        loaded = compile_model(m, (torch.randn(2, 9, 4),), dynamic_shapes=({1: bladepack.Dim("seq", 1, 4096)},))
    assert [(s.name, s.min, s.max) for s in loaded.signature.symbols] == [("seq", 1, 512)]
    assert "exceeds what the model allows" in caplog.text
    check_against_eager(m, loaded, (torch.randn(2, 512, 4),))
    with pytest.raises(bladepack.ShapeGuardError, match=r"is 513; the allowed range is \[1, 512\]"):
        loaded(torch.randn(2, 513, 4))


def test_unsupported_ops_listed_all_at_once_with_locations() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.cummax(x, dim=0).values
            z = torch.fft.fft(x).real
            return y + z + torch.kthvalue(x, 2, dim=-1, keepdim=True).values

    with pytest.raises(bladepack.UnsupportedOpsError) as info:
        bladepack.optimize(Bad(), [(torch.randn(2, 4),), (torch.randn(3, 4),)])
    text = str(info.value)
    assert "aten.cummax" in text and "aten.kthvalue" in text and ("fft" in text)
    assert "test_export.py:" in text  # the user's source line
    assert len(info.value.problems) >= 3


def test_one_place_reached_twice_is_listed_once() -> None:
    """The same op at the same place (a layer's line, once per layer) is one line with its count."""
    err = bladepack.UnsupportedOpsError([("aten.sort", "m.py:3"), ("aten.flip", "m.py:4"), ("aten.sort", "m.py:3")])
    text = str(err)
    assert "2 unsupported operator(s) at 2 place(s)" in text, text
    assert "  - aten.sort  (at m.py:3) x2\n  - aten.flip  (at m.py:4)" in text, text
    assert len(err.problems) == 3


def test_locations_are_the_models_lines_not_torchs() -> None:
    """nn.Conv2d and nn.Embedding issue their ops inside torch (conv.py, sparse.py): the location is
    the line of the model that called the module."""

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)  # the model's line
            return torch.kthvalue(y, 2, dim=-1).values

    with pytest.raises(bladepack.UnsupportedOpsError) as info:
        bladepack.optimize(M(), [(torch.randn(2, 2, 8, 8),), (torch.randn(3, 2, 9, 9),)])
    assert "test_export.py:" in str(info.value) and "conv.py" not in str(info.value)

    class Conv(M):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).relu()  # the convolution's line

    art = bladepack.optimize(Conv(), [(torch.randn(2, 2, 8, 8),), (torch.randn(3, 2, 9, 9),)])
    m = bladepack.artifact.format.read(art.to_bytes()).manifest
    locs = [k["loc"] for k in m["kernels"]] + [g["loc"] for g in m.get("gemm_configs", [])]
    assert any("the convolution's line" in loc for loc in locs), locs
    assert not any("conv.py" in loc for loc in locs), locs


def test_bad_targets_and_inputs() -> None:
    with pytest.raises(ValueError, match="unsupported targets"):
        bladepack.optimize(TwoLayer(), (torch.randn(2, 8),), targets=("tpu",))
    with pytest.raises(ValueError, match="rank"):
        bladepack.optimize(TwoLayer(), [(torch.randn(2, 8),), (torch.randn(2, 8, 1),)])


def test_cuda_targets_name_images() -> None:
    """`cuda` alone is every default image; named images alone are those; `cuda` and named images are
    the defaults plus the named ones (`("cuda", "cuda:sm_90a")` adds the Hopper GEMMs: Note [Hopper
    GEMMs]); every Target survives the manifest's spec round trip."""
    from bladepack.target import CUBIN_ARCHES, PTX_ARCH, Target

    defaults = (*CUBIN_ARCHES, PTX_ARCH)
    cases = {
        ("cuda",): None,
        ("cuda:sm_90a",): ("sm_90a",),
        ("cuda", "cuda:sm_90a"): (*defaults, "sm_90a"),
        ("cpu", "cuda:sm_90", "cuda"): defaults,
        ("cuda:sm_80", "cuda:sm_80"): ("sm_80",),
    }
    for targets, images in cases.items():
        t = Target.parse(targets)
        assert t.cuda_images == images, targets
        assert Target.parse(t.spec()) == t


def test_transformer_encoder_layer() -> None:
    for norm_first in (False, True):
        m = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True, norm_first=norm_first).eval()
        loaded = compile_model(m, [(torch.randn(2, 5, 32),), (torch.randn(3, 8, 32),)])
        for b, s in [(1, 1), (2, 7), (5, 3), (1, 33)]:
            check_against_eager(m, loaded, (torch.randn(b, s, 32),))


class HFStyle(nn.Module):
    """Written the way Hugging Face writes GPT-2: Conv1D (addmm), arange / expand position ids,
    a padding mask combined with a causal mask (bitwise and, comparisons, new_ones, casts),
    scaled_dot_product_attention with a boolean mask, gather-based pooling of the last token."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(50, 16), nn.Embedding(64, 16)
        self.c_attn_w, self.c_attn_b = nn.Parameter(torch.randn(16, 48) * 0.2), nn.Parameter(torch.zeros(48))
        self.ln = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s = input_ids.shape
        pos = torch.arange(s, dtype=torch.long).unsqueeze(0).expand(b, s)
        h = self.drop(self.wte(input_ids) + self.wpe(pos))
        qkv = torch.addmm(self.c_attn_b, h.view(-1, 16), self.c_attn_w).view(b, s, 48)
        q, k, v = (t.view(b, s, 2, 8).transpose(1, 2) for t in qkv.split(16, dim=2))
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        pad = attention_mask.to(torch.bool)[:, None, None, :]
        mask = causal[None, None] & pad & (attention_mask.new_ones(b, s)[:, None, None, :] > 0)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = self.ln(h + a.transpose(1, 2).reshape(b, s, 16))
        last = (attention_mask.sum(-1) - 1).clamp(min=0)
        pooled = h[torch.arange(b), last]
        gathered = torch.gather(h, 1, last[:, None, None].expand(b, 1, 16)).squeeze(1)
        return h.float(), pooled + gathered


def test_hugging_face_style_model() -> None:
    m = HFStyle().eval()
    g = torch.Generator().manual_seed(0)

    def inputs(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 50, (b, s), generator=g)
        mask = torch.ones(b, s, dtype=torch.long)
        mask[0, s // 2 + 1 :] = 0
        return ids, mask

    loaded = compile_model(m, [inputs(2, 6), inputs(3, 10)])
    for b, s in [(1, 1), (1, 5), (4, 13), (2, 64)]:
        check_against_eager(m, loaded, inputs(b, s))


def test_dump_writes_every_stage(tmp_path) -> None:
    """CompileOptions.dump_dir (BLADEPACK_DUMP): what each stage of optimize produced (bladepack/stages.py)."""
    from bladepack.options import CompileOptions

    options = CompileOptions.from_env(dump_dir=tmp_path)
    bladepack.optimize(TwoLayer().eval(), [(torch.randn(2, 8),), (torch.randn(3, 8),)], options=options)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "01-frontend.ir",
        "03-pass-01-canonicalize_shapes.ir",
        "03-pass-02-dead_code_elimination.ir",
        "03-pass-03-decompose.ir",
        "03-pass-04-weight_views.ir",
        "03-pass-05-winograd_conv.ir",
        "03-pass-06-direct_conv.ir",
        "03-pass-07-channels_last.ir",
        "03-pass-08-conv_layout.ir",
        "03-pass-09-sink_layout.ir",
        "03-pass-10-transposed_weights.ir",
        "03-pass-11-dense_layers.ir",
        "03-pass-12-pack_linear.ir",
        "03-pass-13-matmul_scalars.ir",
        "04-shape_guards.txt",
        "05-fusion.cpu.txt",
        "06-lowering.cpu.cc",
        "06-lowering.cpu.launches.txt",
        "07-memory_plan.cpu.txt",
        "08-plan.txt",
        "09-build.cpu.txt",
        "10-reference_cases.txt",
    ]
    assert (
        "fusion plan: 0 kernels, 0 library calls, 2 direct convolutions" in (tmp_path / "05-fusion.cpu.txt").read_text()
    )
    assert "bpk_run" in (tmp_path / "06-lowering.cpu.cc").read_text()
    ir = (tmp_path / "01-frontend.ir").read_text()
    assert "symbols { x_dim0: [1, inf] }" in ir and "matmul" in ir and "test_export.py:" in ir
    assert "assert" in (tmp_path / "04-shape_guards.txt").read_text()
    assert "arena:" in (tmp_path / "07-memory_plan.cpu.txt").read_text()
    assert "plan:" in (tmp_path / "08-plan.txt").read_text()
    assert (
        "kernel library" in (tmp_path / "09-build.cpu.txt").read_text()
        or "cpu_libraries" in (tmp_path / "09-build.cpu.txt").read_text()
    )
    assert "cases" in (tmp_path / "10-reference_cases.txt").read_text()


def test_fallback_reason_quotes_the_symbols_own_guard() -> None:
    """A fallen-back dim's warning quotes the line of torch's error about that dim, and never torch's
    2^62 stand-in for an unbounded range."""
    from bladepack.export.capture import fallback_reason

    text = (
        "Constraints violated (batch, seq)!\n"
        "  - Not all values of batch = L['x'].size()[0] in the specified range batch <= 4611686018427387904 hold\n"
        "  - Not all values of seq = L['x'].size()[1] in the specified range 1 <= seq <= 64 satisfy seq > 1\n"
    )
    assert fallback_reason(text, "seq").startswith("- Not all values of seq")
    assert fallback_reason(text, "batch").endswith("range batch <= inf hold")
    assert fallback_reason("one line only", "seq") == "one line only"


def test_dict_outputs_keep_their_names() -> None:
    class D(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, object]:
            return {"logits": x + 1, "extra": (x * 2, x - 1)}

    art = bladepack.optimize(D(), [(torch.randn(2, 3),), (torch.randn(4, 3),)])
    m = bladepack.load(art.to_bytes())
    assert [o.name for o in m.signature.outputs] == ["logits", "extra.0", "extra.1"]
    x = torch.randn(5, 3)
    got = m(x)
    assert all(torch.equal(a, b) for a, b in zip(got, (x + 1, x * 2, x - 1)))


def test_submodule_modes_survive_optimize() -> None:
    """optimize exports in eval mode and gives every submodule its own mode back: a frozen (eval)
    submodule inside a training model stays in eval."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    model[1].eval()
    bladepack.optimize(model, [(torch.randn(2, 4),), (torch.randn(3, 4),)])
    assert model.training and model[0].training and not model[1].training


def test_internal_failures_are_bladepack_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [No raw tracebacks]: a failure inside a compiler stage reaches the user as a CompileError
    naming the stage (the original exception chained), and a size the shape program cannot compute as
    an unsupported op naming the op and the model's line."""
    from bladepack.errors import CompileError, UnsupportedOpsError
    from bladepack.lowering import shape_compiler

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    samples = [(torch.randn(2, 4),), (torch.randn(3, 4),)]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("lost value")

    with monkeypatch.context() as m:
        m.setattr("bladepack.passes.pipeline.run_pipeline", broken)
        with pytest.raises(CompileError, match="stage 'graph passes.*KeyError.*lost value") as info:
            bladepack.optimize(model, samples)
        assert isinstance(info.value.__cause__, KeyError)

    class Cat(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x], dim=0).relu()

    original = shape_compiler.ShapeProgramBuilder.expr

    def refuse_sums(self: Any, e: Any) -> Any:
        if getattr(e, "is_Add", False) or getattr(e, "is_Mul", False):
            raise shape_compiler.ShapeCompileError(f"cannot compile shape expression {e}")
        return original(self, e)

    monkeypatch.setattr(shape_compiler.ShapeProgramBuilder, "expr", refuse_sums)
    with pytest.raises(UnsupportedOpsError, match=r"cannot compute .* \(at test_export.py:\d+"):
        bladepack.optimize(Cat(), [(torch.randn(2, 4),), (torch.randn(3, 4),)])


# --------------------------------------------------------------------------- torch.cond


class _Cond(nn.Module):
    """torch.cond on shape predicates: two results, a nested cond, a weight read inside a branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def small(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x - 1, x.sum(-1)

        def large(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.cond(x.shape[1] == 3, lambda t: self.fc(t).relu(), lambda t: t * 0, (x,))
            return y * 2, y.amax(-1)

        return torch.cond(x.shape[0] > 4, large, small, (x,))


@pytest.mark.parametrize("lo, hi", [(5, 64), (1, 4)])
def test_cond_on_a_predicate_the_ranges_decide(lo: int, hi: int) -> None:
    """Note [Inlined torch.cond]: batch in [5, 64] takes `large` (and its nested cond's true branch)
    for every input, batch in [1, 4] takes `small`; matches eager at the range edges and between."""
    model = _Cond().eval()
    samples = [(torch.randn(lo, 3),), (torch.randn(hi, 3),)]
    art = bladepack.optimize(model, samples, ({0: bladepack.Dim("batch", lo, hi)},))
    mod = bladepack.load(art.to_bytes())
    for n in sorted({lo, (lo + hi) // 2 | 1, hi}):
        x = torch.randn(n, 3)
        with torch.no_grad():
            want = model(x)
        for o, w in zip(mod(x), want):
            assert torch.allclose(o, w, rtol=1e-5, atol=1e-6), n


def test_cond_on_a_run_time_predicate_becomes_a_branch() -> None:
    """Note [Run-time branches]: a data predicate, and a shape predicate the ranges leave open, no
    longer fail: both branches are kept under guards (tests/test_branches.py checks them in depth)."""

    class Data(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda t: t.relu(), lambda t: t - 1, (x,))

    for model, dyn in ((Data(), None), (_Cond().eval(), ({0: bladepack.Dim("batch", 1, 64)},))):
        art = bladepack.optimize(model, [(torch.randn(3, 3),), (torch.randn(6, 3),)], dyn)
        assert any(st.when for st in art.plan.steps)
        mod = bladepack.load(art.to_bytes())
        for n in (1, 4, 5, 9):
            for sign in (1, -1):
                x = torch.randn(n, 3).abs() * sign
                with torch.no_grad():
                    want = as_tuple(model(x))
                for o, w in zip(as_tuple(mod(x)), want):
                    assert torch.allclose(o, w, rtol=1e-5, atol=1e-6), (type(model).__name__, n, sign)


class _ScaledEmbedding(nn.Module):
    """A decoder's scaled embedding: the scale is a 0-d buffer (Gemma's and others' embed_scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.register_buffer("embed_scale", torch.tensor(2.5), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * self.embed_scale.to(self.embed.weight.dtype)


def test_a_zero_dim_weight_stays_zero_dim() -> None:
    """np.ascontiguousarray makes a 0-d array 1-d: the artifact writer refused the 0-d scale it declared
    ("weight embed_scale: array float32(1,) does not match float32()")."""
    model = _ScaledEmbedding().eval()
    loaded = compile_model(model, [(torch.randint(0, 10, (2, 5)),), (torch.randint(0, 10, (3, 7)),)])
    for shape in [(1, 1), (4, 9)]:
        check_against_eager(model, loaded, (torch.randint(0, 10, shape),))


class _Parity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[1] % 2 == 0 else x - 1


class _Windowed(nn.Module):
    """A branch on two dims at once (a windowed attention's `min(h, w) > window`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if min(x.shape[2], x.shape[3]) > 4 else x + 1


def test_guards_of_a_fallback_export_are_checked() -> None:
    """Note [Input guards]: where export falls back to Dim.AUTO, torch keeps guards that are no range
    (a parity, min(h, w) > 4) as the exported module's own input checks; the artifact checks them too,
    and refuses a shape that breaks one instead of running the branch the samples took."""
    loaded = bladepack.load(bladepack.optimize(_Parity(), [(torch.randn(2, 4),), (torch.randn(3, 6),)]).to_bytes())
    for w in (2, 8, 30):
        check_against_eager(_Parity(), loaded, (torch.randn(2, w),))
    with pytest.raises(bladepack.ShapeGuardError, match=r"traced where x_dim1 % 2 == 0 \(torch.export's guard"):
        loaded(torch.randn(2, 5))
    art = bladepack.optimize(_Windowed(), [(torch.randn(1, 2, 8, 8),), (torch.randn(2, 2, 9, 12),)])
    loaded = bladepack.load(art.to_bytes())
    for h, w in ((5, 5), (6, 40), (17, 9)):
        check_against_eager(_Windowed(), loaded, (torch.randn(1, 2, h, w),))
    for h, w in ((3, 10), (10, 4)):
        with pytest.raises(bladepack.ShapeGuardError, match="traced where min"):
            loaded(torch.randn(1, 2, h, w))


def _counted_exports(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[bool]]:
    """The capture module, with each torch.export it runs logged (its size-oblivious flag)."""
    import importlib

    capture_module = importlib.import_module("bladepack.export.capture")
    calls: list[bool] = []
    real = capture_module._export

    def counted(model: Any, args: Any, shapes: Any, oblivious: bool = False) -> Any:
        calls.append(oblivious)
        return real(model, args, shapes, oblivious)

    monkeypatch.setattr(capture_module, "_export", counted)
    return capture_module, calls


def test_a_remainder_guard_falls_back_without_failing_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Remainder guards]: a guard with a remainder on one dim (a parity here; Swin's `h % 4 == 0`)
    is read from the discovery export, and the dim exported with Dim.AUTO at once: two traces, not the
    four of a named export failing in both modes first."""
    capture_module, calls = _counted_exports(monkeypatch)
    cap = capture_module.capture(_Parity(), [(torch.randn(2, 4),), (torch.randn(3, 6),)])
    assert calls == [False, False], calls
    assert any("x_dim1 (its guard x_dim1 % 2 == 0 does not hold at every size)" in n for n in cap.notes), cap.notes
    assert "torch.export traced the model only where x_dim1 % 2 == 0 (its guards" in " ".join(cap.notes)


def test_a_broken_disequality_tries_the_size_oblivious_export_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Remainder guards]: a stride-2 convolution's `(w - 1) // 2 + 1 != 1` breaks at w = 1, so the
    plain named export would fail on it; the size-oblivious one, tried first, holds from 1."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1)).eval()
    capture_module, calls = _counted_exports(monkeypatch)
    cap = capture_module.capture(model, [(torch.randn(1, 3, 8, 10),), (torch.randn(2, 3, 12, 6),)])
    assert calls == [False, True], calls
    assert sorted((i.name, i.min) for i in cap.symbols.values()) == [
        ("input_dim0", 1),
        ("input_dim2", 1),
        ("input_dim3", 1),
    ]


def test_long_guards_are_counted_in_the_note() -> None:
    from bladepack.export.capture import GUARD_NOTE_CHARS, _guards_note

    long = "floor((1/4)*((3*floor((1/4)*h)) % 4) + (1/4)*floor((1/4)*w)) == 1"
    long = " + ".join([long] * (GUARD_NOTE_CHARS // len(long) + 1))
    note = _guards_note([("h % 4 == 0", ["h"]), (long, ["h", "w"]), (long + " + 1", ["h"])])
    assert note.startswith("torch.export traced the model only where h % 4 == 0; 2 longer conditions on h, w (its")
    assert len(note) < 200


def test_input_guard_forms_are_read() -> None:
    """Note [Input guards]: the guard source forms torch writes, as conditions over the dims; an
    unknown form is an ExportError naming the guard (never a guard silently dropped)."""
    import ast

    import sympy

    from bladepack.export.input_guards import _Reader, _Unreadable

    s, t = sympy.symbols("s t", integer=True, positive=True)
    reader = _Reader([[s, t]], {("x",): 0})
    forms = {
        "(L['x'].size()[1] % 2) == 0": sympy.Eq(sympy.Mod(t, 2), 0),
        "min(L['x'].size()[0] // 4, L['x'].size()[1]) > 4": sympy.Min(sympy.floor(s / 4), t) > 4,
        "L['x'].stride()[0] == 8": sympy.Eq(t, 8),
        "2 <= L['x'].size()[0] < 9": sympy.And(2 <= s, s < 9),
        "not (L['x'].size()[0] == 3) or L['x'].size()[1] ** 2 > 16": sympy.Or(sympy.Not(sympy.Eq(s, 3)), t**2 > 16),
        "math.ceil(L['x'].size()[0] / 2) >= 2": sympy.ceiling(s / 2) >= 2,
    }
    for code, want in forms.items():
        got = reader.read(ast.parse(code, mode="eval").body)
        for sv, tv in ((1, 1), (3, 2), (8, 5), (9, 8), (12, 16)):
            at = {s: sv, t: tv}
            assert bool(got.subs(at)) == bool(want.subs(at)), (code, sv, tv)
    for code in ("L['y'].size()[0] > 1", "L['x'].dim() == 2", "foo(L['x'].size()[0])"):
        with pytest.raises(_Unreadable):
            reader.read(ast.parse(code, mode="eval").body)


class _TwoDims(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * x.shape[1]


def test_a_torch_that_checks_auto_ranges_gets_a_bare_auto_dim(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11 refuses a named Dim and a ranged Dim.AUTO alike where it cannot prove a guard (a
    Qwen2's `min(16*s, 32*s) == 16*s`). Played here: every export with a range on `seq` fails naming
    seq; the capture then exports seq as a bare Dim.AUTO and puts the declared maximum back (the
    artifact's range [2, 40], said in a note), leaving batch as declared."""
    import importlib

    capture_module = importlib.import_module("bladepack.export.capture")
    real = capture_module._export
    tried: list[str] = []

    def strict(model: Any, args: Any, shapes: Any, oblivious: bool = False) -> Any:
        seq = shapes[0].get(1) if shapes and shapes[0] else None
        ranged = seq is not None and (getattr(seq, "max", None) is not None or "min=" in repr(seq))
        tried.append(repr(seq))
        if ranged:
            raise RuntimeError("Constraints violated (seq)!\n  - Not all values of seq satisfy min(2*seq, 4*seq)")
        return real(model, args, shapes, oblivious)

    monkeypatch.setattr(capture_module, "_export", strict)
    batch, seq = bladepack.Dim("batch", 1, 8), bladepack.Dim("seq", 1, 40)
    art = bladepack.optimize(_TwoDims(), [(torch.randn(2, 5),), (torch.randn(3, 7),)], ({0: batch, 1: seq},))
    ranges = {s.name: (s.min, s.max) for s in art.plan.symbols}
    assert ranges == {"batch": (1, 8), "seq": (2, 40)}, (ranges, tried)
    assert any("declared range of seq (- Not all values of seq" in n for n in art.notes), art.notes
    loaded = bladepack.load(art.to_bytes())
    check_against_eager(_TwoDims(), loaded, (torch.randn(1, 40),))
    with pytest.raises(bladepack.ShapeGuardError, match=r"the allowed range is \[2, 40\]"):
        loaded(torch.randn(1, 41))


@pytest.mark.parametrize("samples", ["one", "two"])
def test_a_tensor_sampled_for_several_inputs_compiles_them_apart(samples: str) -> None:
    """torch.export merges an argument passed twice into one placeholder; the artifact must still read
    each input (the attention below differs from eager by ~5 when only v is read)."""

    class Attend(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax(q @ k.transpose(-1, -2), -1) @ v + 2 * q

    m = Attend().eval()
    x, y = torch.randn(2, 5, 8), torch.randn(2, 7, 8)
    loaded = compile_model(m, (x, x, x) if samples == "one" else [(x, x, x), (y, y, y)])
    assert [i.name for i in loaded.signature.inputs] == ["q", "k", "v"]
    if samples == "one":
        check_against_eager(m, loaded, tuple(torch.randn(2, 5, 8) for _ in range(3)))
    else:  # the query's length and the keys' are two dims: the samples' equal sizes do not tie them
        check_against_eager(m, loaded, (torch.randn(2, 6, 8), torch.randn(2, 9, 8), torch.randn(2, 9, 8)))
