"""Golden IR text for the layout passes, and the cases they must leave alone."""

from __future__ import annotations

import textwrap

import torch

from bladepack.export import capture, to_program
from bladepack.ir import Program, print_graph
from bladepack.passes.canonicalize_shapes import canonicalize_shapes
from bladepack.passes.conv_layout import conv_layout
from bladepack.passes.decompose import decompose


def _program(model: torch.nn.Module, samples: list[tuple[torch.Tensor, ...]]) -> Program:
    return to_program(capture(model.eval(), samples, None))


def test_conv_layout_golden() -> None:
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU())
    p = conv_layout(decompose(_program(m, [(torch.randn(2, 3, 5, 6),), (torch.randn(3, 3, 7, 6),)])))
    assert print_graph(p.graph, p.shape_env) == textwrap.dedent("""\
        symbols { input_dim0: [1, inf], input_dim2: [1, inf] }
        graph(%0 input: f32[input_dim0, 3, input_dim2, 6]) weights(%1 0.weight: f32[4, 3, 3, 3], %2 0.bias: f32[4]) {
          %3: f32[4, input_dim0, input_dim2, 6] = conv2d(%0, %1) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, has_bias=False, out_layout='cnhw', weight_layout='oihw'}
          %4: f32[input_dim0, 4, input_dim2, 6] = permute(%3) {perm=(1, 0, 2, 3)}
          %5: f32[4, 1, 1] = reshape(%2)
          %6: f32[input_dim0, 4, input_dim2, 6] = add(%4, %5)
          %7: f32[input_dim0, 4, input_dim2, 6] = relu(%6)
          return %7
        }
        """)


def test_conv_layout_leaves_batch_one_grouped_and_pointwise_convs() -> None:
    batch_one = _program(torch.nn.Conv2d(3, 4, 3), [(torch.randn(1, 3, 5, 6),), (torch.randn(1, 3, 7, 6),)])
    grouped = _program(torch.nn.Conv2d(4, 4, 3, groups=2), [(torch.randn(2, 4, 5, 6),), (torch.randn(3, 4, 7, 6),)])
    pointwise = _program(torch.nn.Conv2d(3, 4, 1), [(torch.randn(2, 3, 5, 6),), (torch.randn(3, 3, 7, 6),)])
    for p in (batch_one, grouped, pointwise):
        p = decompose(p)
        assert conv_layout(p) is p


def test_canonicalize_shapes_is_the_identity_on_torch_programs() -> None:
    # torch.export unifies equal dims itself, so the analysis finds no fact to apply
    m = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    p = _program(m, [(torch.randn(2, 5, 16),), (torch.randn(3, 7, 16),)])
    assert canonicalize_shapes(p) is p


def test_encoder_layer_is_at_most_eight_kernels_plus_gemms() -> None:
    from bladepack.backends import backend
    from bladepack.lowering.build_plan import build_plan
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    p = _program(layer, [(torch.randn(2, 5, 64),), (torch.randn(3, 7, 64),)])
    plan = build_plan(run_pipeline(p, CompileOptions.from_env(), [backend("cpu").caps]), [backend("cpu")]).sources
    fusion = plan.fusion_text("cpu")
    head = fusion.splitlines()[0]
    words = head.split(":")[1].replace(",", "").split()
    kernels, gemms, dense = int(words[0]), int(words[2]), int(words[5])
    assert head.endswith("0 reference steps"), fusion
    # six GEMMs: the QKV and output projections and the feed-forward's two as dense kernels with their
    # epilogues (Note [Dense layers]), the two of attention inside its fused kernel (Note [Fused attention])
    assert kernels <= 8 and gemms == 0 and dense == 4 and "1 fused attentions" in head, fusion


def test_direct_conv_packs_weights_golden() -> None:
    from bladepack.passes.direct_conv import direct_conv

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1, bias=False), torch.nn.ReLU())
    p = _program(m, [(torch.randn(2, 3, 5, 6),), (torch.randn(3, 3, 7, 6),)])
    q = direct_conv(decompose(p))
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { input_dim0: [1, inf], input_dim2: [1, inf] }
        graph(%0 input: f32[input_dim0, 3, input_dim2, 6]) weights(%2 0.weight.ihwo: f32[3, 3, 3, 4]) {
          %3: f32[input_dim0, 4, input_dim2, 6] = conv2d(%0, %2) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, has_bias=False, out_layout='nchw', weight_layout='ihwo'}
          %4: f32[input_dim0, 4, input_dim2, 6] = relu(%3)
          return %4
        }
        """)
    w = p.weight_data["0.weight"]
    assert list(q.weight_data) == ["0.weight.ihwo"]
    assert (q.weight_data["0.weight.ihwo"] == w.transpose(1, 2, 3, 0)).all()
    assert conv_layout(q) is q  # a direct convolution is never batch-folded


class _Epilogues(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 16)
        self.d = torch.nn.Linear(16, 16, bias=False)
        self.u = torch.nn.Linear(16, 16, bias=False)
        self.v = torch.nn.Linear(32, 16, bias=False)
        self.e = torch.nn.Linear(16, 16)
        self.f = torch.nn.Linear(16, 8)
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.nn.functional.gelu(self.b(torch.relu(self.a(x))))  # bias + relu, bias + gelu
        t = torch.nn.functional.gelu(self.c(h), approximate="tanh")  # bias only: tanh GELU stays a kernel
        t = t + self.u(t)  # a residual
        y = h[:, :16] + self.v(h)  # a residual that is a strided slice: no epilogue
        r = y + torch.nn.functional.silu(self.d(t))  # silu; the add after it is not an epilogue
        s = r + self.e(r)  # bias, then a second add: bias only
        f = self.f(s)  # bias; its add is used twice, so it is stored once
        g = s @ self.w  # the product itself is used twice: no epilogue
        return f * 2, f + 1, g - 1, g.exp(), s @ self.w.t()  # the last product is an output: no epilogue


def test_gemm_epilogue_golden() -> None:
    """Note [GEMM epilogue]: which adds and activations the CUTLASS epilogue takes over (CUDA plans)."""
    from bladepack.backends import backend
    from bladepack.lowering.lower_native import fusion_for
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    samples = [(torch.randn(2, 16),), (torch.randn(3, 16),)]
    p = run_pipeline(_program(_Epilogues(), samples), CompileOptions.from_env(), [backend("cuda").caps])
    from bladepack.dtypes import DType
    from bladepack.library_ops.cutlass.select import GemmPolicy

    # float32 GEMMs stay off CUTLASS by default (library_ops/cutlass/configs.VERIFIED_DTYPES): no epilogues
    assert "epilogue" not in fusion_for(
        p, backend("cuda"), GemmPolicy("cutlass", dtypes=frozenset({DType.FLOAT16}))
    ).text(p.graph)
    assert fusion_for(p, backend("cuda"), GemmPolicy("cutlass", dtypes=frozenset({DType.FLOAT32}))).text(
        p.graph
    ) == textwrap.dedent("""\
        fusion plan: 7 kernels, 10 library calls, 0 reference steps
          matmul%15 -> %17 = {add%16 relu%17} (epilogue: bias %3 + relu)
          matmul%18 -> %20 = {add%19 gelu%20} (epilogue: bias %5 + gelu)
          matmul%21 -> %22 = {add%22} (epilogue: bias %7)
          k0: loop[x_dim0, 16] -> %23 = {gelu%23}
          matmul%24 -> %25 = {add%25} (epilogue: residual %23)
          matmul -> %27
          matmul%29 -> %30 = {silu%30} (epilogue: silu)
          k1: loop[x_dim0, 16] -> %31 = {slice%26 add%28 add%31}
          matmul%32 -> %33 = {add%33} (epilogue: bias %12)
          k2: loop[x_dim0, 16] -> %34 = {add%34}
          matmul%35 -> %36 = {add%36} (epilogue: bias %14)
          matmul -> %37
          k3: loop[x_dim0, 8] -> %39 = {constant%38 mul%39}
          k4: loop[x_dim0, 8] -> %41 = {constant%40 add%41}
          k5: loop[x_dim0, 16] -> %43 = {constant%42 sub%43}
          k6: loop[x_dim0, 16] -> %44 = {exp%44}
          matmul -> %46
        """)
    # without the flag (CPU, cuBLAS) every add and activation stays in a generated kernel
    assert "epilogue" not in fusion_for(p, backend("cuda")).text(p.graph)


class _ConvChains(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, bias=False)
        self.c = torch.nn.Conv2d(8, 8, (3, 2), padding=(1, 0), bias=False)
        self.d = torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(self.bn(self.a(x)))  # bias, batch norm's scale and shift, ReLU
        z = torch.relu(y + self.b(y) * 0.5)  # a literal, then a residual read from memory
        u = self.c(z)  # read by two ops: stored as it is
        w = torch.nn.functional.gelu(self.d(u.sigmoid()))  # bias + GELU, an output read again
        return u + 1, u * u, w, w * 2


def test_conv_epilogue_golden() -> None:
    """Note [Convolution epilogue]: the elementwise chains direct convolutions compute before storing
    (CPU plans only; the CUDA direct kernel stores its product). Note [Channels-last chains]: a, b, c and
    the sigmoid compute [N, H, W, C]; d, whose chain ends at an output, stores NCHW itself reading the
    sigmoid through its permute; the outputs read from u convert it in their own loops."""
    from bladepack.backends import backend
    from bladepack.lowering.lower_native import fusion_for
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    samples = [(torch.randn(2, 3, 9, 8),), (torch.randn(3, 3, 11, 13),)]
    p = run_pipeline(_program(_ConvChains(), samples), CompileOptions.from_env(), [backend("cpu").caps])
    assert fusion_for(p, backend("cpu")).text(p.graph) == textwrap.dedent("""\
        fusion plan: 4 kernels, 0 library calls, 4 direct convolutions, 0 reference steps
          conv2d%10 (direct kernel) -> %24 = {add%14 mul%18 add%22 relu%24} (epilogue: inline)
          conv2d%26 (direct kernel) -> %33 = {constant%28 mul%29 add%31 relu%33} (epilogue: inline)
          conv2d (direct kernel) -> %35
          k0: loop[x_dim0, x_dim2, x_dim3-1, 8] -> %37 = {sigmoid%37}
          conv2d%39 (direct kernel) -> %41 = {add%40 gelu%41} (epilogue: inline)
          k1: loop[x_dim0, 8, x_dim2, x_dim3-1] -> %44 = {constant%42 add%43 permute%44}
          k2: loop[x_dim0, 8, x_dim2, x_dim3-1] -> %46 = {mul%45 permute%46}
          k3: loop[x_dim0, 4, x_dim2, x_dim3-1] -> %48 = {constant%47 mul%48}
        """)
    assert "epilogue" not in fusion_for(p, backend("cuda")).text(p.graph)


class _Linears(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(40, 16)
        self.a = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(32, 10)  # narrower than one vector chunk: stays [N, K]

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(ids)
        tied = torch.nn.functional.linear(h, self.emb.weight)  # a tied table, also gathered from: [N, K]
        return self.head(torch.relu(self.a(h))), tied


def test_pack_linear_golden() -> None:
    """Note [Packed linear weights]: nn.Linear weights of 32 rows or more become [K, N] constants in
    CPU-only plans; narrow heads, weights read otherwise and CUDA plans keep [N, K]. (`pack_linear`
    alone: in the CPU pipeline `dense_layers` takes these layers first, tests/test_dense_layers.py.)"""
    from bladepack.backends import backend
    from bladepack.options import CompileOptions
    from bladepack.passes.pack_linear import pack_linear
    from bladepack.passes.pipeline import run_pipeline

    p = _program(_Linears(), [(torch.randint(0, 40, (2, 5)),), (torch.randint(0, 40, (3, 7)),)])
    q = pack_linear(p)
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { ids_dim0: [1, inf], ids_dim1: [1, inf] }
        graph(%0 ids: i64[ids_dim0, ids_dim1]) weights(%1 emb.weight: f32[40, 16], %3 a.bias: f32[32], %4 head.weight: f32[10, 32], %5 head.bias: f32[10], %8 a.weight.kn: f32[16, 32]) {
          %6: f32[ids_dim0, ids_dim1, 16] = take(%1, %0) {axis=0, wrap=False}
          %7: f32[ids_dim0, ids_dim1, 40] = matmul(%6, %1) {transpose_b=True}
          %9: f32[ids_dim0, ids_dim1, 32] = matmul(%6, %8) {transpose_b=False}
          %10: f32[ids_dim0, ids_dim1, 32] = add(%9, %3)
          %11: f32[ids_dim0, ids_dim1, 32] = relu(%10)
          %12: f32[ids_dim0, ids_dim1, 10] = matmul(%11, %4) {transpose_b=True}
          %13: f32[ids_dim0, ids_dim1, 10] = add(%12, %5)
          return %13, %7
        }
        """)
    assert (q.weight_data["a.weight.kn"] == p.weight_data["a.weight"].T).all()
    both = run_pipeline(p, CompileOptions.from_env(), [backend("cpu").caps, backend("cuda").caps])
    assert "a.weight.kn" not in both.weight_data and "a.weight" in both.weight_data


class _AttentionPatterns(torch.nn.Module):
    """Two attentions: one fused (scale, padding mask, softmax), one whose scores are also returned
    (stored, so planned as two GEMMs and a row kernel), and a GQA sdpa read in place."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = torch.matmul(q, k.transpose(-1, -2)) / 4.0
        s = s.masked_fill(mask[:, None, None, :] == 0, -1e9)
        fused = torch.matmul(torch.softmax(s, dim=-1), k)
        kept = torch.matmul(q, k.transpose(-1, -2))
        gqa = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return fused, torch.matmul(torch.softmax(kept, dim=-1), q) + kept.sum(-1, keepdim=True), gqa


def test_fused_attention_golden() -> None:
    """Note [Fused attention]: matmul → chain → softmax → matmul is one step on CPU when no inner value
    is needed elsewhere; GQA's repeated heads are read in place; CUDA plans fuse the same attentions
    (Note [Online softmax on CUDA])."""
    from bladepack.backends import backend
    from bladepack.lowering.lower_native import fusion_for
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    def sample(b: int, s: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(b, 4, s, 8), torch.randn(b, 4, s, 8), torch.ones(b, s), torch.randn(b, 2, s, 8))

    p = run_pipeline(
        _program(_AttentionPatterns(), [sample(2, 5), sample(3, 7)]), CompileOptions.from_env(), [backend("cpu").caps]
    )
    cpu = fusion_for(p, backend("cpu")).text(p.graph)
    assert cpu == textwrap.dedent("""\
        fusion plan: 3 kernels, 2 library calls, 2 fused attentions, 0 reference steps
          attention -> %15 = {matmul%5 constant%6 div%7 reshape%8 reshape%9 constant%10 eq%11 constant%12 where%13 softmax%14 matmul%15}
          matmul -> %17
          attention -> %28 = {matmul%24 constant%25 mul%26 softmax%27 matmul%28}
          k0: row[q_dim0, 4, q_dim2, q_dim2] rows of 1 -> %29 = {softmax%29}
          matmul -> %30
          k1: row[q_dim0, 4, q_dim2, q_dim2] rows of 1 -> %31 = {sum%31}
          k2: loop[q_dim0, 4, q_dim2, 8] -> %32 = {add%32}
        """)
    assert fusion_for(p, backend("cuda")).text(p.graph) == cpu


class _ScaledOperands(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = torch.matmul(q * 0.5, (k * 0.25).transpose(-1, -2))
        kk = k * 3.0
        return a, torch.matmul(q, kk.transpose(-1, -2)), kk


def test_matmul_scalars_golden() -> None:
    """Scalar factors move from a matmul's operands (directly or under a transpose) onto its product;
    a scaled operand that is also returned keeps its mul."""
    from bladepack.passes.matmul_scalars import matmul_scalars

    def sample(b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, n, 8), torch.randn(b, n, 8)

    p = _program(_ScaledOperands(), [sample(2, 5), sample(3, 7)])
    q = matmul_scalars(p)
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { k_dim1: [1, inf], q_dim0: [1, inf], q_dim1: [1, inf] }
        graph(%0 q: f32[q_dim0, q_dim1, 8], %1 k: f32[q_dim0, k_dim1, 8]) {
          %2: f32[] = constant() {value=0.5}
          %3: f32[] = constant() {value=0.25}
          %4: f32[q_dim0, 8, k_dim1] = permute(%1) {perm=(0, 2, 1)}
          %5: f32[q_dim0, q_dim1, k_dim1] = matmul(%0, %4) {transpose_b=False}
          %6: f32[q_dim0, q_dim1, k_dim1] = mul(%5, %2)
          %7: f32[q_dim0, q_dim1, k_dim1] = mul(%6, %3)
          %8: f32[] = constant() {value=3.0}
          %9: f32[q_dim0, k_dim1, 8] = mul(%1, %8)
          %10: f32[q_dim0, 8, k_dim1] = permute(%9) {perm=(0, 2, 1)}
          %11: f32[q_dim0, q_dim1, k_dim1] = matmul(%0, %10) {transpose_b=False}
          return %7, %11, %9
        }
        """)


class _LayoutChains(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2.0
        moved = torch.nn.functional.gelu(y.transpose(1, 2).reshape(y.shape[0], -1))
        t = (x + 1.0).transpose(1, 2)  # read twice: the relu stays after the permute
        return moved, torch.relu(t) + t


def test_sink_layout_golden() -> None:
    """Note [Layout sinking]: a unary elementwise op reads the value under its permute / reshape
    chain, and the chain is rebuilt after it; a chain read by another op is left alone."""
    from bladepack.passes.sink_layout import sink_layout

    p = _program(_LayoutChains(), [(torch.randn(2, 3, 4),), (torch.randn(3, 5, 4),)])
    q = sink_layout(p)
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { x_dim0: [1, inf], x_dim1: [1, inf] }
        graph(%0 x: f32[x_dim0, x_dim1, 4]) {
          %1: f32[] = constant() {value=2.0}
          %2: f32[x_dim0, x_dim1, 4] = mul(%0, %1)
          %5: f32[x_dim0, x_dim1, 4] = gelu(%2) {approximate='none'}
          %6: f32[x_dim0, 4, x_dim1] = permute(%5) {perm=(0, 2, 1)}
          %7: f32[x_dim0, 4*x_dim1] = reshape(%6)
          %8: f32[] = constant() {value=1.0}
          %9: f32[x_dim0, x_dim1, 4] = add(%0, %8)
          %10: f32[x_dim0, 4, x_dim1] = permute(%9) {perm=(0, 2, 1)}
          %11: f32[x_dim0, 4, x_dim1] = relu(%10)
          %12: f32[x_dim0, 4, x_dim1] = add(%11, %10)
          return %7, %12
        }
        """)


class _Conv1d(torch.nn.Module):
    """Whisper's stem: GELU after each 1-D convolution, the second strided, then the time axis first."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv1d(8, 16, 3, padding=1)
        self.c2 = torch.nn.Conv1d(16, 16, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.c2(torch.nn.functional.gelu(self.c1(x))))
        return torch.nn.functional.layer_norm(h.permute(0, 2, 1), (16,))


def test_layout_sinking_puts_gelu_in_the_convolution_epilogue() -> None:
    """Note [Layout sinking] with Note [Channels-last chains]: each GELU is in its convolution's store,
    and the layer norm reads the second convolution's channels-last output in place."""
    from bladepack.backends import backend
    from bladepack.lowering.lower_native import fusion_for
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    p = _program(_Conv1d(), [(torch.randn(2, 8, 12),), (torch.randn(3, 8, 20),)])
    p = run_pipeline(p, CompileOptions.from_env(), [backend("cpu").caps])
    text = fusion_for(p, backend("cpu")).text(p.graph)
    assert text == textwrap.dedent("""\
        fusion plan: 1 kernels, 0 library calls, 2 direct convolutions, 0 reference steps
          conv2d%7 (direct kernel) -> %13 = {add%10 gelu%13} (epilogue: inline)
          conv2d%18 (direct kernel) -> %24 = {add%21 gelu%24} (epilogue: inline)
          k0: row[x_dim0, floor(x_dim2/2-1/2)+1, 16] rows of 1 -> %28 = {permute%25 reshape%26 permute%27 layer_norm%28}
        """), text
    import bladepack

    model = _Conv1d().eval()
    art = bladepack.optimize(model, [(torch.randn(2, 8, 12),), (torch.randn(3, 8, 20),)])
    m = bladepack.load(art.to_bytes(), executor="native")
    for b, t in ((1, 1), (2, 2), (1, 7), (3, 33)):
        x = torch.randn(b, 8, t)
        with torch.no_grad():
            want = model(x)
        assert float((torch.as_tensor(m(x)) - want).abs().max()) <= 1e-5, (b, t)


class _ExplicitProducts(torch.nn.Module):
    """Falcon's FalconLinear (`input @ self.weight.T`) twice, and a transposed weight that is also an
    output (its permute stays, the product reads the weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(24, 8))
        self.w2 = torch.nn.Parameter(torch.randn(8, 24))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.gelu(x @ self.w1.T)
        t = self.w2.T
        return h @ t + x, t


def test_transposed_weights_golden() -> None:
    """Note [Transposed weights]: `x @ W.T` becomes nn.Linear's form, and in a CPU plan the first product
    is a dense kernel with the GELU in its store (the second's weight is also read by the returned
    permute, so it keeps one layout and stays a GEMM)."""
    import bladepack
    from bladepack.passes.transposed_weights import transposed_weights

    samples = [(torch.randn(2, 5, 8),), (torch.randn(3, 7, 8),)]
    q = transposed_weights(_program(_ExplicitProducts(), samples))
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { x_dim0: [1, inf], x_dim1: [1, inf] }
        graph(%0 x: f32[x_dim0, x_dim1, 8]) weights(%1 w1: f32[24, 8], %2 w2: f32[8, 24]) {
          %4: f32[x_dim0, x_dim1, 24] = matmul(%0, %1) {transpose_b=True}
          %5: f32[x_dim0, x_dim1, 24] = gelu(%4) {approximate='none'}
          %6: f32[24, 8] = permute(%2) {perm=(1, 0)}
          %7: f32[x_dim0, x_dim1, 8] = matmul(%5, %2) {transpose_b=True}
          %8: f32[x_dim0, x_dim1, 8] = add(%7, %0)
          return %8, %6
        }
        """), print_graph(q.graph, q.shape_env)
    torch.manual_seed(0)
    model = _ExplicitProducts().eval()
    art = bladepack.optimize(model, samples)
    m = bladepack.load(art.to_bytes(), executor="native")
    kinds = [k["kind"] for k in m._manifest.kernels["cpu"]]
    assert kinds.count("conv") == 1, kinds
    for b, s in ((1, 1), (2, 9), (4, 33)):
        x = torch.randn(b, s, 8)
        with torch.no_grad():
            want = [t.detach() for t in model(x)]
        for got, ref in zip(m(x), want, strict=True):
            assert float((torch.as_tensor(got) - ref).abs().max()) <= 1e-5 * (1 + float(ref.abs().max())), (b, s)


class _SunkTwice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.relu((x * 2.0).transpose(1, 2))
        return torch.nn.functional.gelu(r.transpose(1, 2).reshape(x.shape[0], -1))


def test_sink_layout_when_a_moved_op_is_the_next_ones_base() -> None:
    """Note [Layout sinking]: the ReLU moves before its permute and is itself the value under the GELU's
    chain; the GELU reads the ReLU's new value, and the model still equals eager."""
    import bladepack
    from bladepack.passes.sink_layout import sink_layout

    samples = [(torch.randn(2, 3, 4),), (torch.randn(3, 5, 4),)]
    q = sink_layout(_program(_SunkTwice(), samples))
    ops = [n.op.value for n in q.graph.nodes]
    assert ops == ["constant", "mul", "relu", "permute", "gelu", "permute", "reshape"], ops
    model = _SunkTwice()
    m = bladepack.load(bladepack.optimize(model, samples).to_bytes(), executor="native")
    for b, s in ((1, 1), (4, 7)):
        x = torch.randn(b, s, 4)
        assert float((torch.as_tensor(m(x)) - model(x)).abs().max()) <= 1e-6, (b, s)


class _CausalConv(torch.nn.Module):
    """Mamba's causal depthwise convolution as transformers' torch fallback writes it: the weight
    squeezed by the mixer and unsqueezed again for F.conv1d; a second weight read both through a
    reshape and directly."""

    def __init__(self, channels: int = 40) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(channels, 1, 4))
        self.v = torch.nn.Parameter(torch.randn(2, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, n = x.shape[1], x.shape[2]
        y = torch.nn.functional.conv1d(x, self.w.squeeze(1).unsqueeze(1), padding=3, groups=c)[..., :n]
        return y * self.v.reshape(2 * c)[:c, None] + self.v[1][:, None]


def test_weight_views_golden() -> None:
    """Note [Weight views]: the convolution's weight behind two reshapes becomes one weight of the
    convolution's shape, under its own name; `v`, also read directly, keeps its reshape. In a CPU plan
    the convolution is then a channels-last depthwise kernel (it was a GEMM per channel)."""
    import bladepack
    from bladepack.passes.weight_views import weight_views

    samples = [(torch.randn(2, 40, 9),), (torch.randn(3, 40, 13),)]
    q = weight_views(_program(_CausalConv(), samples))
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { x_dim0: [1, inf], x_dim2: [1, inf] }
        graph(%0 x: f32[x_dim0, 40, x_dim2]) weights(%2 v: f32[2, 40], %6 w: f32[40, 1, 1, 4]) {
          %5: f32[x_dim0, 40, 1, x_dim2] = reshape(%0)
          %7: f32[x_dim0, 40, 1, x_dim2+3] = conv2d(%5, %6) {stride=(1, 1), padding=(0, 3), dilation=(1, 1), groups=40, has_bias=False, out_layout='nchw', weight_layout='oihw'}
          %8: f32[x_dim0, 40, x_dim2+3] = reshape(%7)
          %9: f32[x_dim0, 40, x_dim2] = slice(%8) {axis=2, start=0, step=1}
          %10: f32[80] = reshape(%2)
          %11: f32[40] = slice(%10) {axis=0, start=0, step=1}
          %12: f32[40, 1] = reshape(%11)
          %13: f32[x_dim0, 40, x_dim2] = mul(%9, %12)
          %14: f32[1, 40] = slice(%2) {axis=0, start=1, step=1}
          %15: f32[40] = reshape(%14)
          %16: f32[40, 1] = reshape(%15)
          %17: f32[x_dim0, 40, x_dim2] = add(%13, %16)
          return %17
        }
        """), print_graph(q.graph, q.shape_env)  # fmt: skip
    torch.manual_seed(0)
    model = _CausalConv().eval()
    art = bladepack.optimize(model, samples)
    m = bladepack.load(art.to_bytes())
    kinds = [k["kind"] for k in m._manifest.kernels["cpu"]]
    assert "conv" in kinds and "im2col" not in kinds, kinds
    for b, n in ((1, 1), (2, 9), (4, 33)):
        x = torch.randn(b, 40, n)
        with torch.no_grad():
            want = model(x)
        assert float((torch.as_tensor(m(x.numpy())) - want).abs().max()) <= 1e-5 * (1 + float(want.abs().max())), (b, n)
