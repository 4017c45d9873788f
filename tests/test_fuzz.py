"""Structural fuzzing of both loaders (Note [Plan checks], Note [Kernel operand checks]): manifests
mutated at random (scripts/mutation_campaign.py: integers set to edge values, lists cut or grown, keys
dropped, values retyped or nested), every checksum recomputed, each run in its own process by the Python
loader and by bpk-run, and all of them in one process by fuzz_replay (cpp_runtime/fuzz: the libFuzzer
target's body, which also prepares and runs every plan that passes the checks). Every case must run or
be refused with a bladepack error: no signal, no hang, no stray exception.

BLADEPACK_FUZZ_SEED picks another seed (the failure message names the one that failed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import bladepack
from scripts import mutation_campaign
from tests import cpp_build


def _campaign(art: bladepack.api.Artifact, count: int, work: Path) -> None:
    seed = int(os.environ.get("BLADEPACK_FUZZ_SEED", "0"))
    build = cpp_build.build("release")
    inputs = [np.linspace(-1, 1, 5 * 64, dtype=np.float32).reshape(5, 64)]
    cases = mutation_campaign.make_cases(art.to_bytes(), inputs, count, seed, work)
    results = mutation_campaign.run_cases(cases, str(build / "bpk-run"), 2, work)
    bad = [r for r in results if r[1] in ("stray", "crash", "hang")]
    assert not bad, f"BLADEPACK_FUZZ_SEED={seed}:\n{mutation_campaign.report(results)}"
    outcomes = {r[1] for r in results}
    assert {"ok", "refused"} <= outcomes, outcomes  # the mutations reach both ends
    r = subprocess.run(
        [str(build / "fuzz_replay"), *map(str, cases.files)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0 and f"{count} inputs" in r.stdout, (seed, r.returncode, r.stderr[-3000:])


def test_mutated_manifests_never_crash_a_loader(mlp_artifact: bladepack.api.Artifact, tmp_path: Path) -> None:
    _campaign(mlp_artifact, 60, tmp_path)


@pytest.mark.exhaustive
def test_mutation_campaign(mlp_artifact: bladepack.api.Artifact, tmp_path: Path) -> None:
    _campaign(mlp_artifact, 500, tmp_path)
