"""How each fused kernel splits its work over programs, by batch, dtype and GPU (the measurements
that chose it: README.md). Under the CPU interpreter, which pays per program, few large tiles."""
import os

import torch
import triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # kernels run on the CPU (numpy)
LOCKS = 8192  # split-K counters: one per column tile (each kernel resets its own)
# the step's lm_head at batch > 1, by bytes a weight (gemv's own: too many registers; README.md)
HEAD_TILES = {4: dict(block_k=16, block_n=64), 2: dict(block_k=32, block_n=128)}


def sm_count(device):
    """Streaming multiprocessors of `device` (4 on a CPU under the interpreter: small splits)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_tiles(B, dtype):
    """(block_k, programs_per_sm), the GEMV's tiles by default: the fastest measured
    for GPT-2's step on an H200 (results/h200/fused/gemv_tiles/, b32_early/). 128 rows
    of K per tile: most chunks of K are one tile, which a program reads before its PDL
    wait. About two programs per SM; four in float32 at batch > 1, where every chunk of
    GPT-2's layer GEMVs is then one tile (0.748 ms a step at batch 32 against 0.762 with
    32-row tiles, two a chunk, read after the wait)."""
    return (128, 4) if B > 1 and dtype == torch.float32 else (128, 2)


def gemv_tiles(B, K, N, device, block_n=None, block_k=None, programs_per_sm=None,
               dtype=torch.float32, split=None):
    """(block_m, block_n, block_k, split, k_chunk) for x [B, K] @ W [K, N] (W in `dtype`): one row
    per program at batch 1, else a padded tl.dot (16 or 32 rows); K split into `split` chunks of
    `k_chunk` rows (a multiple of block_k) until there are about `programs_per_sm` programs per SM
    (block_k and programs_per_sm default to `default_tiles`), or into `split` chunks if given.
    block_n defaults to 64 columns (under the CPU interpreter, which pays per program: ~4 tiles)."""
    if block_n is None:
        block_n = max(64, triton.next_power_of_2(triton.cdiv(N, 4))) if INTERPRET else 64
    dk, dp = default_tiles(B, dtype)
    block_k = dk if block_k is None else block_k
    programs_per_sm = dp if programs_per_sm is None else programs_per_sm
    block_m = 1 if B == 1 else 16 if B <= 16 else 32
    block_k = min(block_k, triton.next_power_of_2(K))
    tiles = triton.cdiv(N, block_n) * triton.cdiv(B, block_m)
    if split is None:
        split = min(triton.cdiv(programs_per_sm * sm_count(device), tiles), triton.cdiv(K, block_k))
    k_chunk = triton.cdiv(triton.cdiv(K, max(split, 1)), block_k) * block_k
    return block_m, block_n, block_k, triton.cdiv(K, k_chunk), k_chunk


def layer_tiles(B, K, N, dtype):
    """`gemv`'s tiles for a layer's x [B, K] @ W [K, N] in the step (`fused_forward`).
    At batch 1 each program reads all of K as one tile, before its PDL wait: K is not
    split, so after the wait there are no partial sums, no counter and no last program
    adding them up. W with K contiguous (`step_weights`): 8 columns and 4 warps a
    program where K <= 1024, 4 columns and 8 warps above (288 programs for GPT-2's QKV
    projection, 192 for mlp.c_proj), the fastest measured on an H200
    (results/h200/fused/layout/); under the CPU interpreter, which pays per program,
    at most ~4 column tiles, as `gemv_tiles` has. A tile over 128 KB (K padded to a
    power of two; larger models than GPT-2's) and batch > 1: {}, gemv's own tiles,
    split."""
    whole_k = triton.next_power_of_2(K)
    if K <= 1024:
        tiles = dict(block_k=whole_k, block_n=8, num_warps=4)
    else:
        tiles = dict(block_k=whole_k, block_n=4, num_warps=8)
    tile_bytes = whole_k * tiles["block_n"] * (4 if dtype == torch.float32 else 2)
    if INTERPRET:  # ~4 column tiles
        tiles["block_n"] = max(tiles["block_n"], triton.next_power_of_2(N // 4))
    return tiles if B == 1 and tile_bytes <= 128 * 1024 else {}


def head_tiles(B, dtype):
    """`gemv`'s tiles for the step's lm_head (ln_f folded in, argmax after): at batch 1 gemv's own
    ({}), else `HEAD_TILES` (under the CPU interpreter only its block_k: gemv's ~4 column tiles)."""
    if B == 1:
        return {}
    tiles = HEAD_TILES[4 if dtype == torch.float32 else 2]
    return dict(block_k=tiles["block_k"]) if INTERPRET else dict(tiles)


def scratch_size(B, K, N, device, **tiles):
    """Floats of split-K scratch that `gemv` needs for x [B, K] @ W [K, N] (`tiles`: as
    `gemv_tiles`'): the partial sums and, per column tile, the partial LayerNorm sums."""
    _, bn, _, split, _ = gemv_tiles(B, K, N, device, **tiles)
    return split * B * (N + 2 * triton.cdiv(N, bn)) if split > 1 else 1


def attention_blocks(S, block_s=32, max_splits=None):
    """(block_s, splits): keys per program and programs per (row, head) for a cache of S slots
    (at most 64 programs; 1 under the CPU interpreter, which pays per program)."""
    max_splits = max_splits or (1 if INTERPRET else 64)
    block_s = max(block_s, triton.next_power_of_2(triton.cdiv(S, max_splits)))
    return block_s, triton.next_power_of_2(triton.cdiv(S, block_s))

