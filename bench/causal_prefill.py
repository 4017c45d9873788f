"""Causal prefill attention on CPU: sdpa(q, k, v, is_causal=True) over long prompts, the fused attention
kernel (Note [Key bounds]: a block of query rows walks only the keys it can see) against eager (torch's
flash CPU kernel, which skips the masked blocks too), ONNX Runtime and OpenVINO on the ONNX export,
and, with `--baseline`, an artifact of the same model built by another bladepack (before / after in
one process).

    python -m bench.causal_prefill [--peers eager,ort,openvino] [--baseline old.bpk] [--save new.bpk]
    python -m bench.causal_prefill --form transformers    # the mask as transformers builds it

`--form transformers` writes the causal mask as transformers' sdpa_mask does (positions `arange + 0`,
`kv <= q` and'd with the padding mask into one boolean mask, here with no padding) and passes it to sdpa.
`--form padded` is an encoder's attention over a padded batch (no causal mask: the padding masked_fill'd
with the dtype's lowest value, as the encoder sample and BERT write it), the valid lengths spread evenly
up to the longest (Note [Masked key blocks]: the kernel skips key blocks of padding only).
`--form merged` is an attention block after its fused QKV projection: heads split from [b, s, 3 * 512]
by views, causal sdpa, the heads merged back to [b, s, 512] and projected (Note [Attention stores]).
Writes bench/results/causal_prefill[_transformers|_padded|_merged].{md,json}; ratios are peer time / bladepack time.
Runners interleave per shape (Note [Rounds] in bench/cpu_samples.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import bladepack
from bench.cpu_samples import RESULTS, geomean, measure, onnx_peers, torch_peers
from bench.machine import describe, title

HEADS, HEAD = 8, 64
SHAPES = ((1, 256), (1, 512), (1, 1024), (1, 2048), (4, 512))  # (batch, prompt length)
PADDED_SHAPES = ((1, 512), (2, 512), (4, 256), (4, 512), (8, 384))  # --form padded


class CausalAttention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class TransformersMask(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        n = q.shape[2]
        qi, ki = (torch.arange(n) + 0)[None, None, :, None], (torch.arange(n) + 0)[None, None, None, :]
        mask = (torch.ones((), dtype=torch.bool) & (ki <= qi)) & pad.bool()[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class MergedHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(HEADS * HEAD, HEADS * HEAD)

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        b, s, _ = qkv.shape
        q, k, v = (t.view(b, s, HEADS, HEAD).transpose(1, 2) for t in qkv.split(HEADS * HEAD, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, s, HEADS * HEAD))


class PaddedAttention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) / HEAD**0.5
        s = s.masked_fill(pad[:, None, None, :] == 0, torch.finfo(s.dtype).min)
        return torch.matmul(torch.softmax(s, dim=-1), v)


MODELS = {"sdpa": CausalAttention, "transformers": TransformersMask, "padded": PaddedAttention, "merged": MergedHeads}
NAMES = {
    "sdpa": ["q", "k", "v"],
    "transformers": ["q", "k", "v", "pad"],
    "padded": ["q", "k", "v", "pad"],
    "merged": ["qkv"],
}


def dynamic_shapes(form: str) -> dict[str, dict[int, Any]]:
    batch, seq = bladepack.Dim("batch", 1, 16), bladepack.Dim("seq", 1, 4096)
    if form == "merged":
        return {"qkv": {0: batch, 1: seq}}
    dims = {n: {0: batch, 2: seq} for n in ("q", "k", "v")}
    return dims if form == "sdpa" else {**dims, "pad": {0: batch, 1: seq}}


def inputs(g: torch.Generator, batch: int, seq: int, form: str = "sdpa") -> tuple[torch.Tensor, ...]:
    if form == "merged":
        return (torch.randn(batch, seq, 3 * HEADS * HEAD, generator=g),)
    qkv = tuple(torch.randn(batch, HEADS, seq, HEAD, generator=g) for _ in range(3))
    if form == "sdpa":
        return qkv
    # padded: entry i of the batch has ceil(seq * (i + 1) / batch) valid tokens, the longest all of them
    valid = [-(-seq * (i + 1) // batch) for i in range(batch)] if form == "padded" else [seq] * batch
    return (*qkv, (torch.arange(seq)[None, :] < torch.tensor(valid)[:, None]).long())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="eager,ort,openvino")
    ap.add_argument("--baseline", type=Path, help="an artifact of this model built by another bladepack")
    ap.add_argument("--save", type=Path, help="save this bladepack's artifact here (a later run's --baseline)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--form", choices=tuple(MODELS), default="sdpa")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = MODELS[a.form]().eval()
    names = NAMES[a.form]
    g = torch.Generator().manual_seed(0)
    samples = [inputs(g, 2, 9, a.form), inputs(g, 1, 17, a.form)]
    art = bladepack.optimize(model, samples, dynamic_shapes(a.form))
    if a.save:
        art.save(a.save)
    loaded = bladepack.load(art.to_bytes())
    runners: dict[str, Any] = {"bladepack": lambda x: loaded(*x)}
    errors: dict[str, str] = {}
    if a.baseline:
        old = bladepack.load(a.baseline)
        runners["baseline"] = lambda x: old(*x)
    peers = a.peers.split(",")
    torch_peers(peers, model, samples, runners, errors)
    if "ort" in peers or "openvino" in peers:
        path = Path(tempfile.mkdtemp()) / "causal.onnx"
        axes = {n: {0: "batch", 2: "seq"} for n in ("q", "k", "v")} | {
            n: {0: "batch", 1: "seq"} for n in ("pad", "qkv")
        }
        axes = {n: axes[n] for n in names}
        torch.onnx.export(model, samples[0], str(path), input_names=names, dynamic_axes=axes, dynamo=False)
        onnx_peers(peers, path, runners, errors)
    rows = []
    with torch.no_grad():
        for batch, seq in PADDED_SHAPES if a.form == "padded" else SHAPES:
            x = inputs(g, batch, seq, a.form)
            want = model(*x)
            err = float((torch.as_tensor(loaded(*x)) - want).abs().max())
            rows.append(
                {"batch": batch, "seq": seq, "error": err, **measure(runners, x, a.repeat, errors, f"at {seq}")}
            )
    others = [p for p in runners if p != "bladepack"]
    form = {
        "sdpa": "sdpa is_causal",
        "transformers": "a mask built as transformers does",
        "padded": "not causal: a padded batch, valid lengths spread evenly",
        "merged": "heads merged",
    }
    kind = "Padded" if a.form == "padded" else "Causal prefill"
    lines = [
        f"# {kind} attention ({form[a.form]}, {HEADS} heads x {HEAD}), {title(describe(loaded.executor))}",
        "",
        "| batch x seq | bladepack µs | " + " | ".join(f"{p} µs (x)" for p in others) + " | max error |",
        "|---|---|" + "---|" * len(others) + "---|",
    ]
    for r in rows:
        cells = ["n/a" if r.get(p) is None else f"{r[p]:.0f} ({r[p] / r['bladepack']:.2f}x)" for p in others]
        lines.append(
            f"| {r['batch']} x {r['seq']} | {r['bladepack']:.0f} | " + " | ".join(cells) + f" | {r['error']:.1e} |"
        )
    gm = {p: geomean([r[p] / r["bladepack"] for r in rows if r.get(p)]) for p in others}
    lines += ["", "geomean: " + ", ".join(f"vs {p} {v:.2f}x" for p, v in gm.items())]
    lines += [f"\n{p} unavailable: {e}" for p, e in errors.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    stem = "causal_prefill" if a.form == "sdpa" else f"causal_prefill_{a.form}"
    (RESULTS / f"{stem}.md").write_text(text)
    (RESULTS / f"{stem}.json").write_text(
        json.dumps({"machine": describe(loaded.executor), "rows": rows, "errors": errors}, indent=1, default=str)
    )


if __name__ == "__main__":
    main()
