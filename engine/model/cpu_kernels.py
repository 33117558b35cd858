"""Whether this machine's CPU kernels are compiled yet, and compiling them ahead of a load: the app calls these
before Model.load so that a first start (a ~1 min compile) can say what it is doing instead of looking stuck.
"""
from __future__ import annotations


def cpu_kernels_built() -> bool:
    """True when the kernels are in torch's extension cache (or disabled): a load will not compile them."""
    from kernels import cpu_ext

    return cpu_ext.built()


def build_cpu_kernels() -> bool:
    """Compile (or load) the kernels now, blocking; False when they cannot be built (torch's paths are used)."""
    from kernels import cpu_ext

    return cpu_ext.available()
