"""Lazy access to jax-triton, bridging its 0.3 (``out_shape=``) and 0.4 (``out_type=``) APIs.

jax-triton cannot be imported without a GPU jaxlib, so nothing here runs at import time.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def jax_triton():
    """The ``jax_triton`` module, or ``None`` when it is missing or cannot load here."""
    import os

    before = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton as jt  # noqa: PLC0415 - deliberately lazy
    except Exception:  # noqa: BLE001 - ImportError, or a jaxlib without GPU support
        return None
    finally:
        # jax-triton blanks TRITON_CACHE_DIR at import, which makes every later
        # torch-launched Triton compile in this process fail ("Could not create or locate
        # cache dir"); put back what the process had.
        if os.environ.get("TRITON_CACHE_DIR") != before:
            if before is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = before
    return jt


@functools.cache
def _out_keyword() -> str:
    params = inspect.signature(jax_triton().triton_call).parameters
    return "out_type" if "out_type" in params else "out_shape"


def triton_call(*args: Any, out: Any, **kwargs: Any) -> Any:
    """``jax_triton.triton_call`` with the output description passed under either name."""
    jt = jax_triton()
    if jt is None:
        from dpx.errors import DpxValueError

        raise DpxValueError("impl='triton' needs jax-triton and a GPU jaxlib "
                            "(pip install 'dpx[jax-gpu]'); use impl='xla' elsewhere")
    return jt.triton_call(*args, **{_out_keyword(): out}, **kwargs)
