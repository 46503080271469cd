import os
import threading

import pytest
import torch

if not torch.cuda.is_available():
    # the fused decoder's Triton kernels run under Triton's CPU interpreter, which must be on
    # before anything imports triton (torch.compile does): triton.language's own @jit helpers are
    # made when triton is imported, and the interpreter cannot call compiled ones.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _fix_interpreter_for_numpy_2_4():
    """Triton 3.6's CPU interpreter turns a scalar kernel argument used as a loop bound into an int with
    int() of a 1-element array, which numpy >= 2.4 refuses (triton-lang/triton#9171, fixed upstream by
    #9172). Under TRITON_INTERPRET=1 only, wrap its tensor patching to take the element explicitly."""
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor
    if getattr(original, "fastgen_fix", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.fastgen_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _fix_interpreter_constexpr_of_tensor():
    """Under Triton 3.7-3.9's CPU interpreter, a constexpr global times a tensor (the fused GELU's
    `SQRT_2_OVER_PI * (...)`) is a constexpr holding a tensor, whose `to_tensor` unwraps it once and
    then refuses the tensor (3.6 unwraps it fully; compiled kernels never see it). Unwrap it first."""
    from triton.language import core, semantic
    original = semantic.TritonSemantic.to_tensor
    if getattr(original, "fastgen_fix", False):
        return

    def to_tensor(self, x, *args, **kwargs):
        if isinstance(x, core.constexpr) and isinstance(x.value, core.tensor):
            x = x.value
        return original(self, x, *args, **kwargs)

    to_tensor.fastgen_fix = True
    semantic.TritonSemantic.to_tensor = to_tensor


if os.environ.get("TRITON_INTERPRET") == "1":
    try:  # the tests' business, not the library's
        _fix_interpreter_for_numpy_2_4()
        _fix_interpreter_constexpr_of_tensor()
    except ImportError:  # no triton: the fused tests skip
        pass


def pytest_collection_modifyitems(config, items):
    # GPU tests run on the H200 through the device tool; on a machine without CUDA they skip cleanly.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_threads():
    """`run(model, batches, rounds, **kw)`: every batch in a thread of its own, `rounds`
    `fg.generate` calls each, all started together -> ({thread: [outputs]}, [exceptions])."""
    import fastgen_lib as fg

    def run(model, batches, rounds, **kw):
        got, errors = {i: [] for i in range(len(batches))}, []
        start = threading.Barrier(len(batches))

        def work(i):
            try:
                start.wait()
                for _ in range(rounds):
                    got[i].append(fg.generate(model, *batches[i], **kw))
            except Exception as e:  # noqa: BLE001 (the test reports it)
                errors.append(e)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got, errors
    return run
