"""Benchmarks: measured, printed and compared with transformers in one process (see bench/decode.py)."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The processor's model name, as the benchmarks and the model card report the machine."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return names[0] if names else platform.processor() or "unknown CPU"
