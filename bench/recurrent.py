"""CPU benchmark of recurrent layers (Note [Recurrent kernel]): bladepack against PyTorch eager, ONNX
Runtime and OpenVINO on LSTM and GRU encoders of common sizes, and against eager and torch.compile on
Mamba-2 mixers (Note [Mamba-2 as a selective scan]), at batch sizes and sequence lengths that change
per call.

In: the models below at their shapes. Out: a markdown table of median latencies and ratios (peer time
/ bladepack time: above 1, bladepack is faster) with each peer's largest error against eager, printed,
and bench/results/recurrent.{json,md}. Every runner measures in this one process, interleaved per
shape (Note [Rounds] in bench/cpu_samples.py); the ONNX peers run torch's TorchScript ONNX export of
the same model with dynamic batch and sequence axes (not for Mamba-2: its chunked scan pads the
sequence by a Python-computed amount, which the export fixes at the sample's length).

    python -m bench.recurrent [--models lstm,gru,bilstm,mamba2] [--peers eager,compile,ort,openvino]
        [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import bladepack
from bench.cpu_samples import Runner, geomean, max_errors, measure, onnx_peers, torch_peers

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((1, 32), (1, 256), (8, 64), (32, 128))  # (batch, sequence length)


class _Encoder(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)[0]


class _Classifier(nn.Module):
    """A bidirectional LSTM whose last states feed a linear head (a text / sequence classifier)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(64, 128, batch_first=True, bidirectional=True)
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(x)
        return self.head(torch.cat([h[0], h[1]], dim=-1))


class _Mamba2(nn.Module):
    """Two Mamba-2 blocks of Mamba2-130m's width (hidden 768, 24 heads of 64, state 128, chunks of
    256) fed embeddings, through Hugging Face's torch path."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        cfg = transformers.Mamba2Config(
            hidden_size=768, num_hidden_layers=2, state_size=128, head_dim=64, num_heads=24, expand=2,
            n_groups=1, chunk_size=256, vocab_size=16, use_cache=False,
        )  # fmt: skip
        self.m = transformers.Mamba2Model(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(inputs_embeds=x, use_cache=False).last_hidden_state


@dataclass(frozen=True)
class Model:
    build: Callable[[], nn.Module]
    features: int
    title: str
    onnx: bool = True


MODELS = {
    "lstm": Model(lambda: _Encoder(nn.LSTM(128, 256, num_layers=2, batch_first=True)), 128, "LSTM 2 x 256, input 128"),
    "gru": Model(lambda: _Encoder(nn.GRU(128, 256, num_layers=2, batch_first=True)), 128, "GRU 2 x 256, input 128"),
    "bilstm": Model(_Classifier, 64, "bidirectional LSTM 128 + linear head, input 64"),
    "mamba2": Model(_Mamba2, 768, "Mamba-2 2 x 768 (24 heads of 64, state 128)", onnx=False),
}


def _onnx(model: nn.Module, sample: torch.Tensor) -> Path:
    path = Path(tempfile.mkdtemp()) / "model.onnx"
    torch.onnx.export(
        model,
        (sample,),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch", 1: "seq"}},
        dynamo=False,
    )
    return path


def run(names: list[str], peers: list[str], repeat: int) -> dict[str, Any]:
    report: dict[str, Any] = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "models": {},
    }
    for name in names:
        spec = MODELS[name]
        torch.manual_seed(0)
        model = spec.build().eval()
        g = torch.Generator().manual_seed(1)
        samples = [(torch.randn(b, s, spec.features, generator=g),) for b, s in ((2, 5), (3, 7))]
        with torch.no_grad():
            loaded = bladepack.load(bladepack.optimize(model, samples).to_bytes())
            runners: dict[str, Runner] = {"bladepack": lambda x: loaded(*x)}
            errors: dict[str, str] = {}
            torch_peers(peers, model, samples, runners, errors)
            if spec.onnx and ("ort" in peers or "openvino" in peers):
                onnx_peers(peers, _onnx(model, samples[0][0]), runners, errors)
            rows = []
            for b, s in SHAPES:
                x = (torch.randn(b, s, spec.features, generator=g),)
                err = max_errors(runners, x, errors)
                rows.append({"shape": [b, s], **measure(runners, x, repeat, errors, f"at {(b, s)}"), "max_error": err})
        report["models"][name] = {"title": spec.title, "rows": rows, "errors": errors, "peers": list(runners)}
        print(f"{name}: done", flush=True)
    return report


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# Recurrent layers on CPU ({m['cpu']}, {m['threads']} threads, torch {report['torch']})",
        "",
        "Median latency per call; (x) is the peer's time over bladepack's: above 1, bladepack is faster.",
    ]
    summary: dict[str, list[float]] = {}
    for r in report["models"].values():
        peers = [p for p in r["peers"] if p != "bladepack"]
        lines += [
            "",
            f"### {r['title']}",
            "",
            "| (batch, seq) | bladepack µs | " + " | ".join(f"{p} µs (x)" for p in peers) + " |",
        ]
        lines.append("|---" * (2 + len(peers)) + "|")
        for row in r["rows"]:
            bp = row.get("bladepack")
            cells = [str(tuple(row["shape"])), f"{bp:.0f}" if bp else "failed"]
            for p in peers:
                t = row.get(p)
                if t and bp:
                    cells.append(f"{t:.0f} ({t / bp:.2f}x)")
                    summary.setdefault(p, []).append(t / bp)
                else:
                    cells.append("failed")
            lines.append("| " + " | ".join(cells) + " |")
        worst = {p: max((row["max_error"].get(p, 0.0) for row in r["rows"]), default=0.0) for p in r["peers"]}
        lines.append(
            "\nlargest error vs eager, |y - eager| / (1 + max |eager|): "
            + ", ".join(f"{p} {v:.1e}" for p, v in worst.items() if p != "eager")
        )
        for peer, err in r["errors"].items():
            lines.append(f"\n{peer}: {err}")
    lines += ["", "## Geomean ratio over every model and shape", ""]
    lines += [f"- vs {p}: {geomean(v):.2f}x ({len(v)} points)" for p, v in summary.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--peers", default="eager,ort,openvino")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS / "recurrent"))
    a = ap.parse_args()
    report = run(a.models.split(","), a.peers.split(","), a.repeat)
    text = markdown(report)
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
