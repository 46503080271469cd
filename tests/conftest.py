import os

import pytest
import torch

if not torch.cuda.is_available():
    # the fused decoder's Triton kernels run under Triton's CPU interpreter, which must be on
    # before anything imports triton (torch.compile does): triton.language's own @jit helpers are
    # made when triton is imported, and the interpreter cannot call compiled ones.
    os.environ.setdefault("TRITON_INTERPRET", "1")


from fastgen_lib.interpret import fix_interpreter  # noqa: E402  (after TRITON_INTERPRET is set)

fix_interpreter()  # Triton's interpreter under numpy >= 2.4; the fused decoder calls it too


def pytest_collection_modifyitems(config, items):
    # GPU tests run on the H200 through the device tool; on a machine without CUDA they skip cleanly.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
