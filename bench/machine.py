"""What machine a benchmark ran on: the CPU model, its vector ISA, the kernel library that ran.

In: nothing (reads /proc/cpuinfo where there is one). Out: `describe(executor)`, the `machine` record
the CPU benchmarks write into their results (bench.cpu_samples, bench.onnx_samples, bench.zoo_models,
bench.cpp_runtime), and `title(record)`, the line their markdown starts with. Development machines here
are sometimes AVX-512 Xeons and sometimes AMD EPYCs with or without AVX-512 (issue: the CPU lead on
every x86 machine), so a result says which it came from and which ISA library of the artifact ran.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo, or nothing where there is none."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    """ "AMD EPYC (family 26, model 2)" and the like; the machine type where /proc/cpuinfo is missing."""
    info = _cpuinfo()
    name = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info and "model" in info:
        return f"{name} (family {info['cpu family']}, model {info['model']})"
    return name


def vector_isa() -> str:
    """The widest x86 vector extension the CPU reports: "AVX-512", "AVX2" or "SSE"; else the machine."""
    flags = set(_cpuinfo().get("flags", "").split())
    if not flags:
        return platform.machine()
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"


def describe(executor: str | None = None, threads: int | None = None) -> dict[str, Any]:
    """The record: CPU model, vector ISA, CPUs this process may use, threads, and what ran bladepack's
    kernels (`LoadedModule.executor`, e.g. "native (x86-64-v4)") where known."""
    record: dict[str, Any] = {"cpu": cpu_model(), "isa": vector_isa(), "cpus": len(os.sched_getaffinity(0))}
    if threads is not None:
        record["threads"] = threads
    if executor is not None:
        record["bladepack"] = executor
    return record


def title(record: dict[str, Any]) -> str:
    """One line: "AMD EPYC (family 26, model 2), AVX-512, 2 CPUs, 2 threads, bladepack on native (x86-64-v4)"."""
    parts = [str(record.get("cpu", "?")), str(record.get("isa", "?")), f"{record.get('cpus', '?')} CPUs"]
    if "threads" in record:
        parts.append(f"{record['threads']} threads")
    if "bladepack" in record:
        parts.append(f"bladepack on {record['bladepack']}")
    return ", ".join(parts)
