"""Access to jax-triton, bridging its 0.3 (``out_shape=``) and 0.4 (``out_type=``) APIs:
checked on jax-triton 0.3.1 with jax 0.11.2 and Triton 3.6 (CUDA, H200); 0.4's argument
name is taken from its signature but untested (pyproject admits 0.3.x).

jax-triton cannot be imported without a GPU jaxlib, so it is imported on first use, not
when dpx_jax is. jax-triton 0.3.x sets ``TRITON_CACHE_DIR`` to ``""`` when imported
(0.4.x removes it), which makes Triton compiles launched afterwards from torch in the same
process fail; a process that uses both should import ``jax_triton`` first and then set
``TRITON_CACHE_DIR`` again itself (dpx writes no environment variable).
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

from dpx.errors import DpxValueError

__all__ = ["jax_triton", "triton_call"]


def jax_triton() -> ModuleType | None:
    """The ``jax_triton`` module, or ``None`` when it is missing or cannot load here."""
    try:
        return importlib.import_module("jax_triton")
    except Exception:  # noqa: BLE001 - ImportError, or a jaxlib without GPU support
        return None


def triton_call(*args: Any, out: Any, **kwargs: Any) -> Any:
    """``jax_triton.triton_call`` with the output description passed under either name."""
    jt = jax_triton()
    if jt is None:
        raise DpxValueError("impl='triton' needs jax-triton and a GPU jaxlib "
                            "(pip install 'dpx[jax-gpu]'); use impl='xla' elsewhere")
    params = inspect.signature(jt.triton_call).parameters
    keyword = "out_type" if "out_type" in params else "out_shape"
    return jt.triton_call(*args, **{keyword: out}, **kwargs)
