"""Golden IR text for the layout passes, and the cases they must leave alone."""

from __future__ import annotations

import textwrap

import torch

from bladepack.export import capture, to_program
from bladepack.ir import Program, print_graph
from bladepack.optimize.canonicalize_shapes import canonicalize_shapes
from bladepack.optimize.conv_layout import conv_layout
from bladepack.optimize.decompose import decompose


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
    from bladepack.optimize.build_plan import build_plan
    from bladepack.optimize.pipeline import run_pipeline
    from bladepack.options import Options

    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    p = _program(layer, [(torch.randn(2, 5, 64),), (torch.randn(3, 7, 64),)])
    plan = build_plan(run_pipeline(p, Options.from_env()))
    head = plan.fusion_text.splitlines()[0]
    kernels, gemms = (int(w) for w in head.split(":")[1].replace(",", "").split()[0:4:2])
    assert head.endswith("0 reference steps"), plan.fusion_text
    assert kernels <= 8 and gemms == 6, plan.fusion_text


def test_direct_conv_packs_weights_golden() -> None:
    from bladepack.optimize.direct_conv import direct_conv

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
