"""`bladepack inspect`: a stable JSON summary of an artifact and a readable text form. Loader-safe.

In: a manifest (from `bladepack.artifact.read`). Out: a dict with the keys documented in
docs/format.md (format_version, producer, inputs, outputs, symbols, plan, kernels, gemm_configs,
cpu_libraries, reference_steps, cuda_images, cuda_reference_steps, cuda_arena_bytes, cuda_graphs, weights_bytes,
arena_bytes), and its text rendering.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from bladepack.artifact.native_plan import declined
from bladepack.dtypes import DType


def manifest_summary(m: dict[str, Any]) -> dict[str, Any]:
    steps = m["plan"]["steps"]
    convs = {s["out"]: str(s.get("attrs", {}).get("weight_layout", "")) for s in steps if s.get("op") == "conv2d"}
    weights_bytes = sum(DType(w["dtype"]).itemsize * _prod(w["shape"]) for w in m["weights"])
    return {
        "format_version": ".".join(str(v) for v in m["format_version"]),
        "producer": dict(m["producer"]),
        "inputs": [{"name": t["name"], "dtype": t["dtype"], "shape": list(t["shape"])} for t in m["inputs"]],
        "outputs": [{"name": t["name"], "dtype": t["dtype"], "shape": list(t["shape"])} for t in m["outputs"]],
        "symbols": {s["name"]: {"min": s["min"], "max": s["max"]} for s in m["symbols"]},
        "out_of_range": _policies(m),
        "padding": _padding(m),
        "packed": _packed(m),
        "reference_cases": _reference_cases(m),
        "source_program": _source_program(m),
        "plan": {"steps": len(steps), "by_kind": dict(sorted(Counter(s["op"] for s in steps).items()))},
        "kernels": [
            {
                "name": k["name"],
                "target": k["target"],
                "arch": k.get("arch"),
                "kind": k.get("kind"),
                "conv": _conv_kernel(k, convs),
                "ops": len(k.get("nodes", ())),
                "variants": [v["name"] for v in k.get("variants", [])],
                "loc": k.get("loc", ""),
            }
            for k in m["kernels"]
        ],
        "gemm_configs": list(m["gemm_configs"]),
        "cpu_libraries": [lib["isa"] for lib in m.get("native_cpu", {}).get("libraries", [])],
        "reference_steps": _reference_steps(m, "native_cpu"),
        "cpu_new_shapes": _new_shapes(m),
        "branches": _branches(m),
        "cuda_images": [i["arch"] for i in m.get("native_cuda", {}).get("images", [])],
        "cuda_reference_steps": _reference_steps(m, "native_cuda"),
        "cuda_arena_bytes": m.get("native_cuda", {}).get("arena_bytes_expr"),
        "cuda_graphs": _cuda_graphs(m),
        "weights_bytes": weights_bytes,
        "weights": len(m["weights"]),
        "arena_bytes": m["arena_bytes"]["expr"],
        "shape_program": {
            "instructions": len(m["shape_program"]["code"]) // 40,
            "registers": m["shape_program"]["num_registers"],
            "guards": len(m["shape_program"]["messages"]),
        },
    }


# Which kernel runs a convolution, by the packed weight it reads (opset/attrs.py Conv2dAttrs)
_CONV_KERNELS = {
    "ihwo": "direct",
    "blocks": "wide",  # before format 1.14
    "tap_panels": "wide",
    "winograd": "winograd",
    "hwio_winograd": "winograd or direct",
    "panels": "dense",
}


def _conv_kernel(kernel: dict[str, Any], convs: dict[Any, str]) -> str | None:
    """For a kernel computing a convolution on a packed weight: which convolution kernel it is (Note
    [Direct convolution], [Wide convolutions], [Winograd convolutions], [Dense layers]); else None.
    `convs`: each conv2d step's result value -> its weight layout."""
    for v in kernel.get("nodes", ()):
        if v in convs:
            return _CONV_KERNELS.get(convs[v])
    return None


def _policies(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per dynamic dim, the out-of-range policies a loader accepts (Note [Batch-like dims])."""
    proofs = m.get("batch_dims")
    out = {}
    for sym in m["symbols"]:
        proof = (proofs or {}).get(sym["name"])
        if proofs is None:
            out[sym["name"]] = {"policies": ["error"], "why": "built before batch-dim proofs"}
        elif proof is None:
            out[sym["name"]] = {"policies": ["error"], "why": "no input binds it"}
        elif proof.get("split"):
            out[sym["name"]] = {"policies": ["error", "split"], "inputs": proof["inputs"], "outputs": proof["outputs"]}
        else:
            out[sym["name"]] = {"policies": ["error"], "why": proof.get("reason", "")}
    return out


def _padding(m: dict[str, Any]) -> dict[str, Any] | None:
    """Note [Padding proofs]: per dim that is not batch-like, whether requests of different lengths
    may be padded to one, with the pad values, the output axes to trim and the masks (None: the
    artifact predates the proofs, format 1.5)."""
    proofs = m.get("padding_dims")
    if proofs is None:
        return None
    out: dict[str, Any] = {}
    for name, proof in sorted(proofs.items()):
        if proof.get("padding"):
            out[name] = {k: proof[k] for k in ("inputs", "outputs", "masks", "rows")}
        else:
            out[name] = {"padding": False, "why": proof.get("reason", "")}
    return out


def _packed(m: dict[str, Any]) -> dict[str, Any] | None:
    """Note [Packed sequences]: the packed form (format 1.8), or None."""
    rec = m.get("packed")
    if rec is None:
        return None
    plan = rec["plan"]
    tokens = next((s for s in plan["symbols"] if s["name"] == rec["tokens"]), {"min": 1, "max": None})
    return {
        "symbol": rec["symbol"],
        "rows": rec["rows"],
        "tokens": {"min": tokens["min"], "max": tokens["max"]},
        "inputs": {n: list(a) for n, a in rec["inputs"].items()},
        "outputs": {n: list(a) for n, a in rec["outputs"].items()},
        "steps": len(plan["plan"]["steps"]),
        "kernels": len(plan.get("kernels", [])),
        "libraries": [lib["isa"] for lib in plan.get("native_cpu", {}).get("libraries", [])],
        "cuda": plan.get("native_cuda") is not None,  # a CUDA packed plan (built with a CUDA target)
    }


def _source_program(m: dict[str, Any]) -> dict[str, Any] | None:
    """Note [Extending an artifact]: what `bladepack extend` rebuilds from, or None."""
    sp = m.get("source_program")
    if sp is None:
        return None
    own = sorted({w["section"] for w in sp["weights"].values() if w.get("section", "").startswith("program/")})
    packed = sum(1 for w in sp["weights"].values() if "packed" in w)  # Note [Derived source weights]
    return {
        "frontend": sp["frontend"],
        "targets": sp["targets"],
        "weights_kept_apart": len(own),
        "weights_unpacked": packed,
    }


def _reference_cases(m: dict[str, Any]) -> dict[str, Any] | None:
    """Note [Reference cases]: the oracle, each case's dims, and how many coverage items they reach."""
    rec = m.get("reference_cases")
    if rec is None:
        return None
    ran = {i for c in rec["cases"] for i in c["covers"]}
    oracles: dict[str, int] = {}
    for c in rec["cases"]:  # extend's new cases name their own oracle; carried ones have the record's
        name = str(c.get("oracle", rec["oracle"]))
        oracles[name] = oracles.get(name, 0) + 1
    return {
        "oracle": rec["oracle"],
        "oracles": oracles,
        "budget": rec["budget"],
        "cases": [c["dims"] for c in rec["cases"]],
        "covered": len(ran),
        "uncovered": rec["uncovered"],
    }


def _branches(m: dict[str, Any]) -> list[dict[str, Any]]:
    """Run-time branches (docs/format.md "Run-time branches"): per predicate, its kind, where it came
    from, and how many steps and launches per plan run only when it is true / false."""
    steps = m["plan"]["steps"]
    by_out = {s["out"]: s for s in steps}
    full_of = {
        s["attrs"]["value"]["r"]: s for s in steps if s["op"] == "full" and isinstance(s["attrs"].get("value"), dict)
    }
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for s in steps:
        for c in s.get("when", ()):
            kind, key = ("shape", c["r"]) if "r" in c else ("data", c["v"])
            row = rows.get((kind, key))
            if row is None:
                origin = full_of.get(key, {}) if kind == "shape" else by_out.get(key, {})
                row = {"kind": kind, "key": key, "op": origin.get("op"), "loc": origin.get("loc", ""), "steps": [0, 0]}
                rows[(kind, key)] = row
            row["steps"][0 if c["is"] else 1] += 1
    inputs = {t["id"]: k for k, t in enumerate(m["inputs"])}
    for plan in ("native_cpu", "native_cuda"):
        nat = m.get(plan) or {}
        # a launch names a data predicate by its address: [0, arena offset], or an input's slot
        where = {b["id"]: [0, b["offset"]] for b in nat.get("buffers", [])}
        where.update((vid, [1 + k, 0]) for vid, k in inputs.items())
        for row in rows.values():
            row[plan] = [0, 0]
            for lr in nat.get("launches", []):
                for c in lr.get("when", ()):
                    if (row["kind"] == "shape" and c.get("r") == row["key"]) or (
                        row["kind"] == "data" and "ptr" in c and list(c["ptr"]) == where.get(row["key"])
                    ):
                        row[plan][0 if c["is"] else 1] += 1
    return list(rows.values())


def _reference_steps(m: dict[str, Any], plan: str) -> list[dict[str, Any]]:
    """Steps of a native plan left to the Python reference executor (the C++ runtime refuses them; on
    CUDA they run on the host between copies)."""
    steps = {s["out"]: s for s in m["plan"]["steps"]}
    out = []
    for lr in m.get(plan, {}).get("launches", []):
        if lr["op"] == "ref":
            st = steps.get(lr["node"], {})
            out.append(
                {"node": lr["node"], "op": st.get("op"), "reason": lr.get("reason", ""), "loc": st.get("loc", "")}
            )
    return out


# Note [Staging or patching] in loader/cuda_graphs.py
_STAGED = (
    "staged: a call copies each input into the graph's buffer and each output out (a device copy each); "
    "device tensors above 4 MiB per launch run plain launches in place"
)


def _cuda_graphs(m: dict[str, Any]) -> dict[str, str] | None:
    """Whether the loaders replay the CUDA plan as graphs (Note [CUDA graphs] in loader/cuda_graphs.py):
    "always", "some" (signatures that reach a branch read on the host run plain launches) or "never"
    (a step runs on the host), with the reason."""
    plan = m.get("native_cuda")
    if not plan:
        return None
    steps = {s["out"]: s for s in m["plan"]["steps"]}
    for lr in plan.get("launches", []):
        if lr["op"] == "ref":
            st = steps.get(lr["node"], {})
            return {"captured": "never", "reason": f"step %{lr['node']} {st.get('op')} runs on the host"}
    reads = [i for i, lr in enumerate(plan.get("launches", [])) if any("ptr" in c for c in lr.get("when", ()))]
    if reads:
        return {
            "captured": "some",
            "reason": f"a signature that runs launch {reads[0]} (a run-time branch read on the host) uses plain launches",
            "tensors": _STAGED,
        }
    return {
        "captured": "always",
        "reason": "each signature replays as one graph from its second call on a stream",
        "tensors": _STAGED,
    }


def _prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def _new_shapes(m: dict[str, Any]) -> str | None:
    """How the Python loader prepares a CPU plan's new input-shape signatures (Note [Native preparation])."""
    plan = m.get("native_cpu")
    if not plan:
        return None
    why = declined(plan, len(m["inputs"]))
    if why is None:
        return "prepared by the kernel library, one native call each"
    return f"prepared in Python ({why})"


def inspect_text(s: dict[str, Any]) -> str:
    def tensor(t: dict[str, Any]) -> str:
        return f"{t['name']}: {t['dtype']}[{', '.join(str(d) for d in t['shape'])}]"

    lines = [
        f"bladepack artifact, format {s['format_version']}",
        "producer: " + ", ".join(f"{k} {v}" for k, v in s["producer"].items()),
    ]
    if s.get("signature"):
        lines.append(f"signed by Ed25519 key {s['signature']['key_id']} (public key {s['signature']['public_key']})")
    lines += [
        "inputs:",
    ]
    lines += [f"  {tensor(t)}" for t in s["inputs"]]
    lines.append("outputs:")
    lines += [f"  {tensor(t)}" for t in s["outputs"]]
    lines.append("symbols:" if s["symbols"] else "symbols: none (all shapes static)")
    policies = s.get("out_of_range", {})
    for name, r in s["symbols"].items():
        line = f"  {name} in [{r['min']}, {'inf' if r['max'] is None else r['max']}]"
        pol = policies.get(name)
        if pol is not None and "split" in pol["policies"]:
            line += "; above the range: error (default) or split (proven batch-like)"
        elif pol is not None:
            line += f"; above the range: error only (not batch-like: {pol['why']})"
        lines.append(line)
        pad = (s.get("padding") or {}).get(name)
        if pad is not None and pad.get("padding") is False:
            lines.append(f"    padding: not proven ({pad['why']})")
        elif pad is not None:
            pads = ", ".join(f"{n} axis {r['axis']} with {r['pad']:g}" for n, r in pad["inputs"].items())
            trim = ", ".join(f"{n} axis {', '.join(map(str, a))}" for n, a in pad["outputs"].items() if a) or "nothing"
            masks = ", ".join(pad["masks"]) or "none: every op is position-wise or causal"
            rows = f"each {pad['rows']} row its own length" if pad["rows"] else "one length per call"
            lines.append(f"    padding: proven ({rows}); pad {pads}; trim {trim}; masks {masks}")
    pk = s.get("packed")
    if pk is not None:
        hi = "inf" if pk["tokens"]["max"] is None else pk["tokens"]["max"]
        lines.append(
            f"packed form: sequences along {pk['symbol']} concatenated ({pk['rows']} 1), [1, {hi}] tokens; "
            f"{pk['steps']} steps, {pk['kernels']} kernels, CPU libraries {', '.join(pk['libraries']) or 'none'}"
            f"{', a CUDA plan' if pk.get('cuda') else ''} (LoadedModule.run_packed)"
        )
    by_kind = ", ".join(f"{k} {v}" for k, v in s["plan"]["by_kind"].items())
    lines.append(f"plan: {s['plan']['steps']} steps ({by_kind})")
    sp = s["shape_program"]
    lines.append(
        f"shape program: {sp['instructions']} instructions, {sp['registers']} registers, {sp['guards']} guard messages"
    )
    branches = s.get("branches", [])
    lines.append(f"run-time branches: {len(branches) or 'none'}")
    for b in branches:
        what = f"register {b['key']}" if b["kind"] == "shape" else f"%{b['key']} {b['op']}, read on the host"
        counts = f"steps {b['steps'][0]} if true / {b['steps'][1]} if false"
        for plan in ("native_cpu", "native_cuda"):
            if any(b.get(plan, [0, 0])):
                counts += f"; {plan[7:]} launches {b[plan][0]} / {b[plan][1]}"
        lines.append(f"  {b['kind']} predicate ({what}; from {b['loc'] or 'unknown source'}): {counts}")
    libs = ", ".join(s["cpu_libraries"]) or "none (runs on the reference executor)"
    lines.append(f"cpu kernel libraries: {libs}")
    refs = s["reference_steps"]
    if s["cpu_libraries"]:
        lines.append(
            f"reference steps: {len(refs)} (numpy, Python loader only; the C++ runtime refuses the artifact)"
            if refs
            else "reference steps: none (every step runs in the kernel library; the C++ runtime runs it)"
        )
    for r in refs:
        lines.append(f"  %{r['node']} {r['op']}: {r['reason']} (from {r['loc'] or 'unknown source'})")
    if s["cpu_libraries"] and s.get("cpu_new_shapes"):
        lines.append(f"new input shapes (Python loader): {s['cpu_new_shapes']}")
    images = s.get("cuda_images", [])
    lines.append(f"cuda kernel images: {', '.join(images) if images else 'none (no CUDA plan)'}")
    if images:
        crefs = s["cuda_reference_steps"]
        lines.append(
            f"cuda host steps: {len(crefs)} (copied to the host and run by numpy)"
            if crefs
            else "cuda host steps: none (every step runs on the GPU)"
        )
        for r in crefs:
            lines.append(f"  %{r['node']} {r['op']}: {r['reason']} (from {r['loc'] or 'unknown source'})")
        lines.append(f"cuda arena bytes: {s['cuda_arena_bytes']}")
        graphs = s.get("cuda_graphs")
        if graphs:
            lines.append(f"cuda graphs: {graphs['captured']} ({graphs['reason']})")
            if "tensors" in graphs:
                lines.append(f"cuda graph tensors: {graphs['tensors']}")
    lines.append(f"kernels: {len(s['kernels']) or 'none'}")
    for k in s["kernels"]:
        target = f"{k['target']}{'/' + k['arch'] if k['arch'] else ''}"
        kind = f"{k['kind']} ({k['conv']})" if k.get("conv") else k["kind"]
        if kind == "attention_combine":  # Note [Split keys]
            kind += " (the chunks of keys the kernel before it split; launched only at shapes where it splits)"
        elif kind == "reduce_combine":  # Note [Grid reductions]
            kind += " (the parts of the reductions the kernel before it split over blocks; launched only at shapes where it splits)"
        lines.append(f"  {k['name']} [{target}] {kind}, {k['ops']} ops, variants: {', '.join(k['variants'])}")
    lines.append(f"gemm configs: {len(s['gemm_configs']) or 'none'}")
    for gc in s["gemm_configs"]:
        batch = f" x batch [{', '.join(gc['batch'])}]" if gc.get("batch") else ""
        lines.append(
            f"  %{gc['node']} {gc['op']} via {gc['library']} {gc['dtype']}: M={gc['m']} N={gc['n']} K={gc['k']}{batch}"
        )
        if gc.get("epilogue"):  # Note [GEMM epilogue]: stores the end of the chain instead of the product
            lines.append(f"    epilogue: {gc['epilogue']} -> %{gc['out']}")
        if gc["library"] == "cublaslt":  # Note [cuBLASLt GEMMs]
            lines.append("    chosen by: cuBLASLt's heuristic where it runs (per shape and operand alignment)")
        # CUTLASS: the config per range of the key M*N*batch, for every GPU and for compute capability 9.0
        for table, suffix, head in (("dispatch", "", None), ("dispatch_sm90", "_sm90", "on compute capability 9.0")):
            dispatch = gc.get(table, [])
            if not dispatch:
                continue
            indent = "    "
            if head is not None:
                lines.append(f"    {head}:")
                indent = "      "
            for e in dispatch[:-1]:
                top = "inf" if e["key_max"] is None else e["key_max"]
                split = f", split-K {e['split']}" if e["split"] > 1 else ""
                lines.append(f"{indent}{gc['key']} in [{e['key_min']}, {top}], operands aligned: {e['config']}{split}")
            lines.append(f"{indent}otherwise: {dispatch[-1]['config']}")
            tuned = gc.get("tuned_on" + suffix, "cost model")
            lines.append(f"{indent}chosen by: {'the cost model' if tuned == 'cost model' else 'profiling on ' + tuned}")
    rc = s.get("reference_cases")
    if rc is None:
        lines.append("reference cases: none (bladepack verify has nothing to run)")
    else:
        dims = "; ".join(", ".join(f"{k}={v}" for k, v in sorted(c.items())) or "static" for c in rc["cases"])
        oracles = rc.get("oracles") or {rc["oracle"]: len(rc["cases"])}
        if len(oracles) > 1:
            oracle = "oracles " + ", ".join(f"{k} ({v} case{'s' * (v != 1)})" for k, v in oracles.items())
        else:
            oracle = f"oracle {next(iter(oracles), rc['oracle'])}"
        lines.append(
            f"reference cases: {len(rc['cases'])} ({dims}), {oracle}; {rc['covered']} kernel "
            f"variants and GEMM dispatch entries covered, {len(rc['uncovered'])} not"
        )
        lines += [f"  not covered: {u['item']} ({u['why']})" for u in rc["uncovered"]]
    sp = s.get("source_program")
    if sp is None:
        lines.append("program: not kept (bladepack extend cannot rebuild this artifact)")
    else:
        apart = (
            f", {sp['weights_kept_apart']} weights stored again as the front end had them"
            if sp["weights_kept_apart"]
            else ""
        )
        if sp.get("weights_unpacked"):
            apart += f", {sp['weights_unpacked']} read back from the plan's packed copies"
        lines.append(
            f"program: kept from the {sp['frontend']} front end for bladepack extend (built for "
            f"{', '.join(sp['targets'])}{apart})"
        )
    lines.append(f"weights: {s['weights']} tensors, {_human(s['weights_bytes'])}")
    lines.append(f"arena bytes (planned peak, all intermediates): {s['arena_bytes']}")
    return "\n".join(lines) + "\n"
