"""Serving with trust (serving/trust.py) and a server that stays up (Note [Supervised server]).

`triton-repo` / `serve` / the Ray deployment refuse an artifact that is not the pinned file or not
signed by a trusted key before a server starts, record the choice in config.pbtxt, and every model
instance (Python backend, C++ backend, Ray replica) checks it again on the file it loads. A request
that crashes Triton's HTTP front end gets the server restarted, and valid requests succeed after it;
a bad index in a request is a 400 with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bladepack.artifact.signing import generate_key, sign_file
from bladepack.loader import TrustError
from bladepack.serving.triton_repo import write_repository
from bladepack.serving.trust import ServingTrust
from tests.test_serving import ROOT, _fake_requests, _fake_triton, start_serve, tagger  # noqa: F401 (a fixture)

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def signed(tagger: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: F811
    d = tmp_path_factory.mktemp("serving-trust")
    generate_key(d / "k")
    generate_key(d / "other")
    sign_file(tagger, d / "k", d / "signed.bpk")
    return {"dir": d, "signed": d / "signed.bpk", "key": d / "k.pub", "other": d / "other.pub"}


def test_triton_repo_checks_and_records_the_trust(signed: dict[str, Path], tmp_path: Path) -> None:
    pin = hashlib.sha256(signed["signed"].read_bytes()).hexdigest()
    trust = ServingTrust.of(pin, [signed["key"]])
    config = write_repository(signed["signed"], tmp_path, "tg", trust=trust)
    text = (tmp_path / "tg" / "config.pbtxt").read_text()
    assert text == config.text()
    assert f'parameters {{ key: "sha256" value: {{ string_value: "{pin}" }} }}' in text
    assert f'key: "trusted_keys" value: {{ string_value: "{trust.trusted_keys[0]}" }}' in text
    for wrong, message in [
        (ServingTrust.of("0" * 64), "not the pinned 0000"),
        (ServingTrust.of(None, [signed["other"]]), "not among the trusted keys"),
    ]:
        with pytest.raises(TrustError, match=message):
            write_repository(signed["signed"], tmp_path / "refused", "tg", trust=wrong)
    assert not (tmp_path / "refused").exists()
    with pytest.raises(ValueError, match="sha256 must be 64 hex digits"):
        ServingTrust.of("abc")
    r = subprocess.run(
        [sys.executable, "-m", "bladepack", "triton-repo", str(signed["signed"]), str(tmp_path / "cli")]
        + ["--trusted-key", str(signed["other"])],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 1 and r.stderr.startswith("bladepack: error: ") and "not among the trusted keys" in r.stderr


def _parameters(model_dir: Path) -> dict[str, Any]:
    """config.pbtxt's parameters as Triton gives them to a backend in JSON."""
    text = (model_dir / "config.pbtxt").read_text()
    found = re.findall(r'parameters \{ key: "(\w+)" value: \{ string_value: "([^"]*)"', text)
    return {k: {"string_value": v} for k, v in found}


def _cpp_backend(release: Path, model_dir: Path, tmp: Path) -> Any:
    """One request through the C++ backend on the fake server, with the config's parameters."""
    reqs, _ = _fake_requests(np.random.default_rng(0))
    env = {**os.environ, "TRITON_FAKE_PARAMETERS": json.dumps(_parameters(model_dir))}
    return _fake_triton(release, model_dir, reqs[:1], tmp, env=env)


def _python_backend(model_dir: Path) -> Any:
    """initialize() of the Python backend's model with a stand-in triton_python_backend_utils."""
    from bladepack.serving.triton_python import BladepackTritonModel

    config = {"max_batch_size": 16, "dynamic_batching": {}, "parameters": _parameters(model_dir)}
    model = BladepackTritonModel()
    sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
    try:
        model.initialize({"model_config": json.dumps(config), "model_repository": str(model_dir), "model_version": "1"})
    finally:
        del sys.modules["triton_python_backend_utils"]
    return model


def test_every_instance_checks_the_file_it_loads(
    signed: dict[str, Path],
    tagger: Path,  # noqa: F811
    tmp_path: Path,
    release: Path,
) -> None:
    """The repository's model.bpk replaced after triton-repo checked it: both backends refuse it at
    instance load, with the loader's words; the checked file loads."""
    trust = ServingTrust.of(None, [signed["key"]])
    for backend in ("python", "cpp"):
        write_repository(signed["signed"], tmp_path, backend, backend=backend, trust=trust)
    _python_backend(tmp_path / "python")  # the signed file loads
    proc, got = _cpp_backend(release, tmp_path / "cpp", tmp_path)
    assert proc.returncode == 0 and isinstance(got[0], list), proc.stderr
    for backend in ("python", "cpp"):
        shutil.copyfile(tagger, tmp_path / backend / "1" / "model.bpk")  # the same model, unsigned
    with pytest.raises(TrustError, match="is not signed; trusted keys: ") as e:
        _python_backend(tmp_path / "python")
    proc, _ = _cpp_backend(release, tmp_path / "cpp", tmp_path)
    assert proc.returncode == 3 and f"load error: INVALID_ARG {tmp_path / 'cpp' / '1' / 'model.bpk'}: " in proc.stderr
    assert str(e.value).split(" is not signed")[1] in proc.stderr, (proc.stderr, str(e.value))


def test_cpp_backend_refuses_malformed_trusted_keys(signed: dict[str, Path], tmp_path: Path, release: Path) -> None:
    write_repository(signed["signed"], tmp_path, "m", backend="cpp")
    reqs, _ = _fake_requests(np.random.default_rng(0))
    env = {**os.environ, "TRITON_FAKE_PARAMETERS": '{"trusted_keys":{"string_value":"abc"}}'}
    proc, _ = _fake_triton(release, tmp_path / "m", reqs[:1], tmp_path, env=env)
    assert proc.returncode == 3 and "trusted_keys parameter must list Ed25519 public keys" in proc.stderr


def test_ray_deployment_refuses_an_untrusted_artifact(signed: dict[str, Path]) -> None:
    pytest.importorskip("ray")
    from bladepack.serving.ray import deployment

    with pytest.raises(TrustError, match="not the pinned"):
        deployment(signed["signed"], sha256="0" * 64)
    deployment(signed["signed"], trusted_keys=[signed["key"]])  # builds the application; nothing starts


def _post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.serving
def test_serve_restarts_triton_after_requests_that_crash_it(signed: dict[str, Path]) -> None:
    """The reported requests (shapes whose element count overflows, or is far beyond the body) crash
    the bundled tritonserver's JSON front end; `bladepack serve` restarts it, says how it ended, and
    the next valid request succeeds. Also: a bad index is 400 with the reason."""
    proc, (http, _, _), _ = start_serve(signed["signed"], "--trusted-key", str(signed["key"]), stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{http}/v2/models/tg/infer"
    ids = {"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}
    mask = {"name": "mask", "shape": [1, 3], "datatype": "BOOL", "data": [True, True, False]}
    valid = json.dumps({"inputs": [ids, mask]}).encode()
    try:
        assert _post(url, valid)[0] == 200
        status, text = _post(url, json.dumps({"inputs": [{**ids, "data": [1, 10**9, 3]}, mask]}).encode())
        assert status == 400 and "index out of range" in text and "1000000000 is not in [0, 49]" in text, text
        # a malformed body never reaches a backend: Triton's front end answers it, with its reason, as 500
        status, text = _post(url, b'{"inputs": [')
        assert status in (400, 500) and "failed to parse the request JSON" in text, (status, text)
        for shape in ([2147483648, 2147483648], [65536, 65536]):
            bad = {"name": "ids", "shape": shape, "datatype": "INT64", "data": list(range(10))}
            with contextlib.suppress(urllib.error.URLError, ConnectionError):  # the server died answering it
                _post(url, json.dumps({"inputs": [bad, mask]}).encode())
            deadline = time.monotonic() + 180
            while True:  # restarted, or never down: valid traffic flows again
                try:
                    if _post(url, valid)[0] == 200:
                        break
                except (urllib.error.URLError, ConnectionError):
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not come back"
                time.sleep(0.5)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 0, err
    restarts = re.findall(r"bladepack: tritonserver (was killed by SIG\w+|exited with status \d+); restarting it", err)
    assert restarts, err  # the reported crashes crash this server too: each is restarted and said
    assert err.count("tritonserver is ready again") == len(restarts), err
