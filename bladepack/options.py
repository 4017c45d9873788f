"""Environment knobs, read in one place. Loader-safe.

BLADEPACK_DUMP=dir      write the IR after each pass, the plan and the manifest (text) into dir
BLADEPACK_VERIFY=0      skip the IR verifier between passes (on by default)
BLADEPACK_CACHE_DIR     compiled-kernel cache (default ~/.cache/bladepack)
BLADEPACK_LOG=level     logging level for the `bladepack` logger (default WARNING)
BLADEPACK_NATIVE=0      build no CPU kernel library (the artifact runs on the reference executor)
BLADEPACK_GEMM_CONFIGS=N  at most N aligned CUTLASS configs per GEMM (default 4; the SIMT fallback is extra)
BLADEPACK_GEMM_TUNING   how CUTLASS configs are chosen: auto (profile when a CUDA device answers, else the
                        cost model; the default), profile (a device is required), model (never profile)
BLADEPACK_NVCC_JOBS=N   nvcc processes at once (default 2; an sm_90a CUTLASS unit takes ~3.3 GB)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Options:
    dump_dir: Path | None
    verify: bool
    cache_dir: Path
    log_level: str
    native: bool
    gemm_configs: int = 4
    gemm_tuning: str = "auto"
    nvcc_jobs: int = 2

    @staticmethod
    def from_env() -> Options:
        dump = os.environ.get("BLADEPACK_DUMP")
        cache = os.environ.get("BLADEPACK_CACHE_DIR") or str(Path.home() / ".cache" / "bladepack")
        return Options(
            dump_dir=Path(dump) if dump else None,
            verify=os.environ.get("BLADEPACK_VERIFY", "1") not in ("0", "false", "no"),
            cache_dir=Path(cache),
            log_level=os.environ.get("BLADEPACK_LOG", "WARNING").upper(),
            native=os.environ.get("BLADEPACK_NATIVE", "1") not in ("0", "false", "no"),
            gemm_configs=_positive("BLADEPACK_GEMM_CONFIGS", 4),
            gemm_tuning=_choice("BLADEPACK_GEMM_TUNING", ("auto", "profile", "model")),
            nvcc_jobs=_positive("BLADEPACK_NVCC_JOBS", 2),
        )


def _choice(name: str, allowed: tuple[str, ...]) -> str:
    """The variable's value, one of `allowed` (the first when unset)."""
    raw = os.environ.get(name) or allowed[0]
    if raw not in allowed:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(allowed)}")
    return raw


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: expected a positive integer")
    return int(raw)
