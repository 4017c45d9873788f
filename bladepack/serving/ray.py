"""Ray Serve: an artifact as a replicated deployment with cross-request batching.

In: an artifact path and the deployment's choices (replicas, device, batch limits). Out:
`deployment(...)`, a Ray Serve application (`serve.run(app)` starts it), whose replicas each load the
artifact once with the torch-free loader. Callers use a handle (`handle.infer.remote(arrays)`:
the input arrays in signature order, or a dict by name; the result is the list of outputs) or HTTP
(a KServe v2 JSON body at the route prefix: serving/v2_json.py; input errors answer 400).

Batching follows Note [Serving batches] (serving/batching.py): `@serve.batch` collects concurrent
calls on a replica, and only requests that agree on every dim but a proven batch-like axis 0 share a
call; the batch limit is the dim's range maximum (or `max_batch_size`, if smaller). An artifact with
no such dim runs each call alone. `ray` is imported here only: the loader never needs it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from bladepack.artifact.format import read
from bladepack.errors import InputError
from bladepack.loader import load
from bladepack.options import LoaderOptions
from bladepack.serving.batching import DEFAULT_MAX_BATCH, BatchLayout, default_pad_budget, run_requests
from bladepack.serving.trust import ServingTrust
from bladepack.serving.v2_json import decode_request, encode_response


class BladepackReplica:
    """One replica: the loaded artifact and its batching rule."""

    def __init__(
        self,
        model_path: str,
        name: str,
        device: str,
        max_batch: int,
        wait_s: float,
        trust: ServingTrust,
        padding: bool = True,
        pad_budget: float = 1.0,
    ) -> None:
        # a server process starts here: the environment's options; the trust checked again, in the replica
        self._module = load(model_path, device, **trust.load_arguments(), options=LoaderOptions.from_env())
        manifest = self._module.manifest
        self._name = name
        self._layout = (
            BatchLayout.from_manifest(manifest, padding, pad_budget, device == "cpu")  # Note [Packed merging]
            if max_batch > 1
            else BatchLayout(None, 1, None, "off")
        )
        self._inputs = list(manifest["inputs"])
        self._outputs = [t["name"] for t in manifest["outputs"]]
        self._batched.set_max_batch_size(max(max_batch, 1))  # type: ignore[attr-defined]  # serve.batch's setters
        self._batched.set_batch_wait_timeout_s(wait_s)  # type: ignore[attr-defined]

    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH, batch_wait_timeout_s=0.002)
    async def _batched(self, requests: list[list[np.ndarray]]) -> list[list[np.ndarray] | Exception]:
        return await asyncio.to_thread(run_requests, self._layout, self._module.run, requests, self._module.run_packed)

    async def infer(self, inputs: list[np.ndarray] | dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs for one request (inputs in signature order, or by name)."""
        if isinstance(inputs, dict):
            names = [t["name"] for t in self._inputs]
            if sorted(inputs) != sorted(names):
                raise InputError(f"request inputs {sorted(inputs)}; the model's inputs are {names}")
            inputs = [inputs[n] for n in names]
        arrays = [np.asarray(x) for x in inputs]
        if self._layout.dim is None:
            result = (await asyncio.to_thread(run_requests, self._layout, self._module.run, [arrays]))[0]
        else:
            result = await self._batched(arrays)
        if isinstance(result, Exception):
            raise result
        return result

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            arrays = decode_request(await request.json(), self._inputs)
            outs = await self.infer(arrays)
        except InputError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        except ValueError as e:  # a body that is not JSON
            return JSONResponse({"error": f"bad request: {e}"}, status_code=400)
        return JSONResponse(encode_response(self._name, self._outputs, outs))


def deployment(
    model_path: str | os.PathLike[str],
    *,
    name: str | None = None,
    num_replicas: int = 1,
    device: str = "cpu",
    max_batch_size: int | None = None,
    batch_wait_timeout_s: float = 0.002,
    num_cpus: float = 1.0,
    sha256: str | None = None,
    trusted_keys: Sequence[Any] | None = None,
    padding: bool = True,
    pad_budget: float | None = None,
) -> Any:
    """A Ray Serve application serving the artifact (`serve.run(app, route_prefix=...)` starts it).
    `device` "cuda" gives each replica one GPU; `max_batch_size` 1 turns batching off; `padding` False
    merges only requests whose shapes agree, `pad_budget` (None: the device's, Note [Padded merging])
    bounds a merged group's padding; `sha256` /
    `trusted_keys` as for `bladepack.load`, checked here and by every replica (serving/trust.py)."""
    path = Path(model_path).resolve()
    trust = ServingTrust.of(sha256, trusted_keys)
    trust.check(path)  # an untrusted artifact fails here, before any replica starts
    bpk = read(str(path))  # a missing or corrupt artifact fails here, not in every replica
    model = name or path.stem
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda (each replica gets its own GPU), got {device!r}")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    top = max(BatchLayout.from_manifest(bpk.manifest).limit(max_batch_size), 1)
    options: dict[str, Any] = {"num_cpus": num_cpus}
    if device == "cuda":
        options["num_gpus"] = 1
    cls = serve.deployment(
        name=model, num_replicas=num_replicas, ray_actor_options=options, max_ongoing_requests=max(2 * top, 8)
    )(BladepackReplica)
    budget = default_pad_budget(device) if pad_budget is None else pad_budget
    BatchLayout.from_manifest(bpk.manifest, padding, budget)  # a bad budget fails here, not in every replica
    return cls.bind(str(path), model, device, top, batch_wait_timeout_s, trust, padding, budget)
