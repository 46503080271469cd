"""Triton's CPU interpreter (TRITON_INTERPRET=1), where the fused decoder's kernels run without a
GPU: the one fix it needs under numpy >= 2.4. Book: chapter 9 (the fused step)."""
import os


def fix_interpreter():
    """Under TRITON_INTERPRET=1, let Triton 3.6's interpreter run with numpy >= 2.4: it turns a
    scalar kernel argument used as a loop bound into an int with int() of a 1-element array, which
    numpy 2.4 refuses (triton-lang/triton#9171, fixed by #9172: Triton 3.7 squeezes it). Wraps its
    tensor patching to take the element explicitly. Idempotent; nothing off the interpreter,
    without triton, or where Triton has no such hook. The interpreter patches each kernel as it
    runs, so any time before the first kernel will do."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "fastgen_fix", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.fastgen_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor
