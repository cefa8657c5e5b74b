"""16-bit GEMM inputs with float32 accumulation: the arithmetic of ``precision="fp16"``/``"bf16"``.

A tensor-core GEMM (``cublasGemmEx`` with ``CUDA_R_16F`` or ``CUDA_R_16BF`` operands and
``CUBLAS_COMPUTE_32F``) rounds its inputs to the 16-bit format and accumulates their products in
float32. The product of two 16-bit numbers (11- or 8-bit significands) is exact in float32's 24
bits, so rounding the float32 operands to the format and multiplying them with a float32 GEMM gives
that arithmetic up to the order of the float32 additions: this module rounds, on any array module
(NumPy on the CPU, CuPy on a GPU), and both devices then call their float32 GEMM. It is an
emulation: slower than float32 (a rounding pass per operand) and without the tensor cores' speed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import InternalError

#: The 16-bit formats: unit roundoff ``u = 2^-p`` (``p`` significand bits with the hidden one), largest
#: finite value, smallest normal and smallest subnormal (IEEE 754 binary16; bfloat16 has float32's
#: exponent range).
FORMATS = {
    "fp16": {"u": 2.0 ** -11, "max": 65504.0, "min_normal": 2.0 ** -14, "min_subnormal": 2.0 ** -24},
    "bf16": {"u": 2.0 ** -8, "max": float(np.finfo(np.float32).max) * (1 - 2.0 ** -9),
             "min_normal": float(np.finfo(np.float32).tiny), "min_subnormal": 2.0 ** -149},
}


def is_half(mode: str | None) -> bool:
    """Whether a math mode names a 16-bit input format."""
    return mode in FORMATS


def round_to(x: Any, mode: str) -> Any:
    """Float32 array ``x`` rounded to the format ``mode`` (to nearest), as float32.

    ``"fp16"``: a cast to float16 and back (overflow to ``inf``, gradual underflow, as the format).
    ``"bf16"``: Veltkamp's splitting (Dekker 1971), ``c = (2^16 + 1) x; x_hi = c - (c - x)``, which
    rounds float32's 24-bit significand to nearest with 8 bits in float32 arithmetic only (one kernel
    per operation on a GPU, where a fused kernel could reassociate it); valid for ``|x|`` below
    ``2^127 / 2^16``, far above what the solver's scaled operands hold.
    """
    if mode == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if mode == "bf16":
        c = x * np.float32(65537.0)
        return c - (c - x)
    raise InternalError(f"unknown 16-bit format {mode!r}")


__all__ = ["FORMATS", "is_half", "round_to"]
