"""GPT-2's decode step as Triton kernels (chapter 9); README.md: the kernels of a step, the modules,
and the measurements that chose the tiles. Off CUDA, set TRITON_INTERPRET=1 before importing
triton: the kernels then run on CPU tensors (the tests), with IEEE dots and no PDL."""
from ..interpret import fix_interpreter
from .fold import fold_layernorm, fold_layernorms, step_weights
from .kernels import (_attention_kernel, _attention_proj_kernel, _gemv_kernel, attention,
                      attention_proj, gemv, greedy_tail)
from .step import Buffers, FusedStep, fused_decode_step, fused_forward, supports_pdl
from .tiles import (INTERPRET, LOCKS, attention_blocks, default_tiles, gemv_tiles, head_tiles,
                    layer_tiles, scratch_size, sm_count)

fix_interpreter()  # under TRITON_INTERPRET=1: Triton's interpreter mended, before any kernel
