"""The .bpk container: round trip, determinism, atomic write and every kind of damage."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from bladepack.artifact import format as fmt
from samples.mlp import MLP


def test_round_trip_file_and_bytes(mlp_artifact, tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    data = path.read_bytes()
    assert data == mlp_artifact.to_bytes()
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    a, b = bladepack.load(path)(x), bladepack.load(data)(x)
    assert isinstance(a, np.ndarray) and np.array_equal(a, b)
    assert not [p for p in tmp_path.iterdir() if p.name != "m.bpk"], "temporary files left behind"


def test_sections_are_aligned_and_weights_zero_copy(mlp_artifact, tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    f = fmt.read(path)
    for entry in f.manifest["sections"]:
        assert (f.data_start + entry["offset"]) % 64 == 0
    m = bladepack.load(path)
    w = next(iter(m._manifest.weights.values()))
    assert not w.flags.owndata and not w.flags.writeable  # a view of the memory map


def test_identical_inputs_give_identical_bytes() -> None:
    def build() -> bytes:
        torch.manual_seed(3)
        model = MLP().eval()
        g = torch.Generator().manual_seed(1)
        return bladepack.optimize(
            model, [(torch.randn(2, 64, generator=g),), (torch.randn(5, 64, generator=g),)]
        ).to_bytes()

    assert build() == build()


@pytest.fixture
def good(mlp_artifact) -> bytes:
    return mlp_artifact.to_bytes()


def test_bad_magic(good: bytes) -> None:
    with pytest.raises(bladepack.BpkFormatError, match="bad magic"):
        bladepack.load(b"PK\x03\x04" + good[4:])
    with pytest.raises(bladepack.BpkFormatError, match="bad magic"):
        bladepack.load(b"hello")


def test_newer_major_version(good: bytes) -> None:
    bad = good[:8] + struct.pack("<H", fmt.FORMAT_MAJOR + 1) + good[10:]
    with pytest.raises(bladepack.BpkFormatError, match=r"newer than this loader supports"):
        bladepack.load(bad)


@pytest.mark.parametrize("cut", [0, 10, 63, 64, 200, -1, -100])
def test_truncated(good: bytes, tmp_path: Path, cut: int) -> None:
    data = good[:cut] if cut >= 0 else good[: len(good) + cut]
    path = tmp_path / "t.bpk"
    path.write_bytes(data)
    with pytest.raises(bladepack.BpkFormatError, match="truncated|empty file|checksum"):
        bladepack.load(path)


def test_manifest_checksum_mismatch(good: bytes) -> None:
    bad = bytearray(good)
    bad[fmt.HEADER_SIZE + 20] ^= 0xFF
    with pytest.raises(bladepack.BpkFormatError, match="manifest checksum mismatch"):
        bladepack.load(bytes(bad))


def test_section_checksum_mismatch(good: bytes) -> None:
    f = fmt.read(good)
    entry = f.manifest["sections"][0]
    bad = bytearray(good)
    bad[f.data_start + entry["offset"] + 5] ^= 0x01
    with pytest.raises(bladepack.BpkFormatError, match=f"checksum mismatch in section '{entry['name']}'"):
        bladepack.load(bytes(bad))
    bladepack.load(bytes(bad), verify=False)  # opting out of section hashing loads it


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no artifact"):
        bladepack.load(tmp_path / "nope.bpk")


def test_malformed_manifest_is_a_format_error(mlp_artifact) -> None:
    manifest, sections = mlp_artifact._parts()
    del manifest["plan"]
    data = b"".join(bytes(c) for c in fmt.encode(manifest, sections))
    with pytest.raises(bladepack.BpkFormatError, match="malformed manifest"):
        bladepack.load(data)


def test_shape_program_out_of_range_register_rejected(mlp_artifact) -> None:
    manifest, sections = mlp_artifact._parts()
    code = bytearray(manifest["shape_program"]["code"])
    code[8:16] = struct.pack("<q", 10**6)  # destination register of the first instruction
    manifest["shape_program"]["code"] = bytes(code)
    data = b"".join(bytes(c) for c in fmt.encode(manifest, sections))
    with pytest.raises(bladepack.BpkFormatError, match="register out of range"):
        bladepack.load(data)
