"""A BERT-base-sized encoder on the CPU: bladepack against its own plan with linear layers as BLAS GEMMs,
ONNX Runtime, OpenVINO and eager, side by side in one process.

In: a Hugging Face BertModel with BERT-base's layer shape (hidden 768, 12 heads, feed-forward 3072) and
`--layers` layers (default 4: optimize and the peers' exports stay short; every layer is the same
work), random weights. Out: a markdown table of median latencies and ratios (peer time / bladepack
time: above 1, bladepack is faster), printed and written to `--out` (.md and .json). The "BLAS
linear layers" peer is the same model optimized with `dense_layers=False` (BERT-base's layers ran
that way before Note [Dense weight panels]). Rounds as bench.cpu_samples (Note [Rounds]).

    python -m bench.bert_base [--layers 4] [--sizes 1x16,1x128,4x128,8x256] [--out bench/results/bert_base]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bench.cpp_runtime import machine
from bench.cpu_samples import Runner, geomean, measure, onnx_peers


class _Encoder(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        cfg = BertConfig(
            hidden_size=768,
            num_attention_heads=12,
            intermediate_size=3072,
            num_hidden_layers=layers,
            vocab_size=30522,
            max_position_embeddings=512,
        )
        self.bert = BertModel(cfg, add_pooling_layer=False).eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state


def _inputs(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(b * 1000 + s)
    return torch.randint(0, 30522, (b, s), generator=g), torch.ones(b, s, dtype=torch.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--sizes", default="1x16,1x128,4x128,8x256")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "bert_base"))
    a = ap.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",")]
    torch.manual_seed(0)
    model = _Encoder(a.layers).eval()
    dims = {"ids": {0: bladepack.Dim("batch", 1, 16), 1: bladepack.Dim("seq", 2, 512)}}
    dims["mask"] = dims["ids"]
    samples = [_inputs(2, 9), _inputs(3, 17)]
    runners: dict[str, Runner] = {}
    for name, dense in (("bladepack", True), ("BLAS linear layers", False)):
        options = bladepack.CompileOptions.from_env(dense_layers=dense, quiet=True)
        art = bladepack.optimize(model, samples, dims, options=options)
        m = bladepack.load(art.to_bytes())
        runners[name] = lambda x, m=m: m.run([t.numpy() for t in x])
    path = Path(tempfile.mkdtemp()) / "bert.onnx"
    axes = {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
    torch.onnx.export(
        model, samples[0], str(path), input_names=["ids", "mask"], output_names=["out"], dynamic_axes=axes, dynamo=False
    )
    errors: dict[str, str] = {}
    onnx_peers(["ort", "openvino"], path, runners, errors)

    def eager(x: Any) -> Any:
        with torch.no_grad():
            return model(*x)

    runners["eager"] = eager
    rows = []
    for b, s in sizes:
        x = _inputs(b, s)
        with torch.no_grad():
            want = model(*x).numpy()
        got = np.asarray(runners["bladepack"](x)[0])
        err = float(np.abs(got - want).max() / (1 + np.abs(want).max()))
        row = measure(runners, x, a.repeat, errors, f"{b}x{s}")
        rows.append({"size": [b, s], "us": row, "max_rel_err": err})
        print(b, s, {k: round(v) if v else v for k, v in row.items()}, f"err {err:.1e}", flush=True)
    peers = [p for p in runners if p != "bladepack"]
    lines = [
        f"# A BERT-base-sized encoder on the CPU ({machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__})",
        "",
        f"`python -m bench.bert_base --layers {a.layers}`: Hugging Face BertModel, hidden 768, 12 heads, "
        f"feed-forward 3072, {a.layers} layers, random weights. Median latency per call; (x) is the peer's "
        'time over bladepack\'s: above 1, bladepack is faster. "BLAS linear layers" is the same model '
        "optimized with dense_layers=False (how BERT-base's linear layers ran before Note [Dense weight panels]).",
        "",
        "| batch x seq | bladepack µs | " + " | ".join(f"{p} µs (x)" for p in peers) + " | max rel. error vs eager |",
        "|---|---|" + "---|" * len(peers) + "---|",
    ]
    for r in rows:
        us = r["us"]
        ours = us["bladepack"]
        cells = [f"{us[p]:.0f} ({us[p] / ours:.2f}x)" if us.get(p) else "failed" for p in peers]
        lines.append(
            f"| {r['size'][0]} x {r['size'][1]} | {ours:.0f} | " + " | ".join(cells) + f" | {r['max_rel_err']:.1e} |"
        )
    lines.append("")
    lines.append(
        "Geomean (x): "
        + ", ".join(
            f"{p} {geomean([r['us'][p] / r['us']['bladepack'] for r in rows if r['us'].get(p)]):.2f}x" for p in peers
        )
    )
    if errors:
        lines += ["", *(f"- {p}: {e}" for p, e in errors.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    report = {"machine": machine(), "platform": platform.platform(), "layers": a.layers, "rows": rows, "errors": errors}
    Path(a.out + ".md").write_text(text)
    Path(a.out + ".json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
