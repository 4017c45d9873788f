"""A Triton Inference Server model configuration (config.pbtxt) generated from an artifact.

In: the artifact's manifest and the serving choices (name, device, instance count, queue delay,
backend). Out: `TritonModelConfig`, whose `text()` is the config.pbtxt.

The artifact decides what a hand-written config would guess: the tensors and their dtypes (Triton's
TYPE_*), dynamic dims as -1, and batching. `max_batch_size` and `dynamic_batching` appear only when
the artifact proves a dim batch-like and every tensor holds it as axis 0 (Note [Serving batches] in
serving/batching.py); the batch dim then leaves each tensor's `dims`. Preferred batch sizes are the
upper ends of the GEMM dispatch intervals over the batch (the sizes where a GEMM's chosen kernel
changes), so the batcher forms batches the tuned kernels were chosen for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bladepack.serving.batching import BatchLayout, default_pad_budget

TRITON_DTYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
}
DEVICES = ("cpu", "cuda")
BACKENDS = ("python", "cpp")


@dataclass(frozen=True)
class TritonModelConfig:
    name: str
    backend: str  # "python": Triton's Python backend (serving/triton_python.py); "cpp": libtriton_bladepack.so
    device: str  # "cpu", "cuda" or "cuda:N"
    instances: int
    max_queue_delay_us: int
    layout: BatchLayout
    max_batch_size: int  # 0: the tensors have no batch dim
    dynamic_batching: bool  # False: each request runs alone (its own batch)
    preferred: tuple[int, ...]
    inputs: tuple[tuple[str, str, tuple[int, ...], bool], ...]  # name, TYPE_*, dims, reshape to []
    outputs: tuple[tuple[str, str, tuple[int, ...], bool], ...]
    parameters: tuple[tuple[str, str], ...] = ()  # more string parameters (serving/trust.py)
    ragged: tuple[str, ...] = ()  # inputs whose padded dims may differ between merged requests
    unpadded: tuple[str, ...] = ()  # dims proven paddable that the pad budget of 1.0 keeps unpadded

    @staticmethod
    def build(
        m: dict[str, Any],
        name: str,
        device: str = "cpu",
        instances: int = 1,
        max_queue_delay_us: int = 100,
        max_batch_size: int | None = None,
        backend: str = "python",
        dynamic_batching: bool = True,
        padding: bool = True,
        pad_budget: float | None = None,
    ) -> TritonModelConfig:
        if device.split(":")[0] not in DEVICES or (":" in device and not device.split(":", 1)[1].isdigit()):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"model name {name!r}: use letters, digits, '_', '.' and '-'")
        if instances < 1:
            raise ValueError(f"instances must be at least 1, got {instances}")
        if device.startswith("cuda") and not m.get("native_cuda"):
            raise ValueError(
                f"model {name!r} has no CUDA kernels; optimize it with targets=('cpu', 'cuda') to serve it on a GPU"
            )
        if max_queue_delay_us < 0:
            raise ValueError(f"max queue delay must be at least 0 µs, got {max_queue_delay_us}")
        unsupported = [f"{t['name']} ({t['dtype']})" for t in (*m["inputs"], *m["outputs"]) if t["dtype"] == "bfloat16"]
        if unsupported and backend == "python":
            raise ValueError(
                f"Triton's Python backend cannot hand bfloat16 tensors to numpy: {', '.join(unsupported)}; "
                "serve this artifact with the C++ backend (--backend cpp)"
            )
        budget = default_pad_budget(device) if pad_budget is None else pad_budget
        # Note [Packed merging]: a CPU instance (either backend) runs the packed form where there is one
        packed = device == "cpu"
        layout = BatchLayout.from_manifest(m, padding, budget, packed)  # Note [Padded merging]
        proven = BatchLayout.from_manifest(m, padding).padded if budget == 1.0 and layout.packed is None else ()
        top = layout.limit(max_batch_size)
        if layout.dim is None and max_batch_size is not None:
            raise ValueError(f"this artifact cannot be batched by the server: {layout.reason}")
        batched = top > 0
        # Note [Padded merging]: Triton's batcher hands requests whose padded dims differ to one execute
        ragged = tuple(
            t["name"]
            for i, t in enumerate(m["inputs"])
            if batched and dynamic_batching and any(d.inputs[i] is not None for d in layout.ragged)
        )
        return TritonModelConfig(
            name,
            backend,
            device,
            instances,
            max_queue_delay_us,
            layout,
            top,
            batched and dynamic_batching,
            preferred_batch_sizes(m, layout, top) if batched else (),
            tuple(_tensor(t, batched) for t in m["inputs"]),
            tuple(_tensor(t, batched) for t in m["outputs"]),
            parameters=(("pad_budget", f"{budget:g}"),) if ragged and layout.packed is None else (),
            ragged=ragged,
            unpadded=tuple(d.dim for d in proven) if batched and dynamic_batching else (),
        )

    def text(self) -> str:
        lines = [
            "# generated by bladepack triton-repo from the artifact's signature",
            f'name: "{self.name}"',
            f'backend: "{"bladepack" if self.backend == "cpp" else "python"}"',
        ]
        if self.max_batch_size and self.dynamic_batching:
            lines.append(f"# the server batches along {self.layout.dim!r} (proven batch-like, axis 0 of every tensor)")
            for d in self.layout.padded:
                lines.append(
                    f"# requests of different {d.dim!r} merge, padded to the longest (proven paddable; "
                    f"pad budget {self.layout.pad_budget:g})"
                )
            if self.layout.packed is not None:
                lines.append(
                    f"# requests of different {self.layout.packed.dim.dim!r} merge packed, with no padding (the "
                    "artifact's packed form, Note [Packed merging])"
                )
            for dim in self.unpadded:
                lines.append(
                    f"# {dim!r} is proven paddable, but only requests of equal {dim!r} merge here: pad budget 1 "
                    "(Note [Padded merging]; --pad-budget 1.5 pads them)"
                )
        elif self.max_batch_size:
            lines.append(f"# {self.layout.dim!r} is the batch dim; dynamic batching is off: each request runs alone")
        else:
            lines.append(f"# no server-side batching: {self.layout.reason}")
        lines.append(f"max_batch_size: {self.max_batch_size}")
        for key, tensors in (("input", self.inputs), ("output", self.outputs)):
            lines.append(f"{key} [")
            body = []
            for tname, ttype, dims, flat in tensors:
                reshape = " reshape: { shape: [ ] }" if flat else ""
                if key == "input" and tname in self.ragged:
                    reshape += " allow_ragged_batch: true"
                body.append(
                    f'  {{ name: "{tname}" data_type: {ttype} dims: [ {", ".join(map(str, dims))} ]{reshape} }}'
                )
            lines.append(",\n".join(body))
            lines.append("]")
        if self.dynamic_batching:
            lines.append("dynamic_batching {")
            if self.preferred:
                lines.append(f"  preferred_batch_size: [ {', '.join(map(str, self.preferred))} ]")
            lines.append(f"  max_queue_delay_microseconds: {self.max_queue_delay_us}")
            lines.append("}")
        kind, _, ordinal = self.device.partition(":")
        group = f"kind: {'KIND_GPU' if kind == 'cuda' else 'KIND_CPU'} count: {self.instances}"
        if ordinal:
            group += f" gpus: [ {ordinal} ]"
        lines.append(f"instance_group [ {{ {group} }} ]")
        for key, value in (("device", kind), *self.parameters):
            lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
        return "\n".join(lines) + "\n"


def _tensor(t: dict[str, Any], batched: bool) -> tuple[str, str, tuple[int, ...], bool]:
    shape = list(t["shape"])[1:] if batched else list(t["shape"])
    dims = tuple(d if isinstance(d, int) else -1 for d in shape)
    flat = batched and not dims  # a [batch] tensor: Triton wants dims [1] reshaped to []
    return t["name"], TRITON_DTYPES[t["dtype"]], (1,) if flat else dims, flat


def preferred_batch_sizes(m: dict[str, Any], layout: BatchLayout, top: int) -> tuple[int, ...]:
    """The batch sizes at which a GEMM's dispatch interval ends, for GEMMs whose dispatch key is
    c * batch (the batch alone decides the kernel), inside [1, top]."""
    if layout.dim is None:
        return ()
    pattern = re.compile(rf"(?:(\d+)\*)?{re.escape(layout.dim)}")
    sizes: set[int] = set()
    for g in m.get("gemm_configs", ()):
        match = pattern.fullmatch(str(g.get("key", "")))
        if match is None:
            continue
        scale = int(match.group(1) or 1)
        for table in ("dispatch", "dispatch_sm90"):
            for e in g.get(table, ()):
                hi = e.get("key_max")
                if isinstance(hi, int) and hi // scale >= layout.min and 1 <= hi // scale <= top:
                    sizes.add(hi // scale)
    return tuple(sorted(sizes))
