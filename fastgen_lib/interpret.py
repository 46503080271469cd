"""Triton's CPU interpreter (TRITON_INTERPRET=1), where the fused decoder's kernels run without a
GPU (the CPU tests, and a reader without one): the two fixes it needs. Book: chapter 9."""
import os


def fix_interpreter():
    """Under TRITON_INTERPRET=1, patch Triton's interpreter where it fails on the fused kernels;
    idempotent, and nothing off the interpreter or without Triton. The interpreter reads the
    patches as each kernel runs, so any time before the first kernel will do."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.language import core, semantic
        from triton.runtime import interpreter
    except ImportError:
        return
    _index_of_one_element(interpreter)
    if hasattr(semantic, "TritonSemantic"):
        _constexpr_of_tensor(core, semantic.TritonSemantic)


def _index_of_one_element(interpreter):
    """Triton 3.6 turns a scalar kernel argument used as a loop bound into an int with int() of a
    1-element array, which numpy >= 2.4 refuses (triton-lang/triton#9171, fixed by #9172 in 3.7):
    take the element explicitly."""
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "fastgen_fix", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.fastgen_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _constexpr_of_tensor(core, semantic):
    """Triton 3.7-3.9: a constexpr global times a tensor (the GELU's `SQRT_2_OVER_PI * (...)`)
    is a constexpr holding a tensor, which `to_tensor` unwraps once and then refuses (3.6 unwraps
    it fully; compiled kernels never see it): unwrap it first."""
    original = semantic.to_tensor
    if getattr(original, "fastgen_fix", False):
        return

    def to_tensor(self, x, *args, **kwargs):
        if isinstance(x, core.constexpr) and isinstance(x.value, core.tensor):
            x = x.value
        return original(self, x, *args, **kwargs)

    to_tensor.fastgen_fix = True
    semantic.to_tensor = to_tensor
