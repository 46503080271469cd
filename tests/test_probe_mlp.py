"""tools/probe_mlp.py: GPT-2's MLP as one Triton kernel, an experiment kept out of the library (it
measured slower than the two GEMVs, results/h200/fused/mlp/). Its kernel against PyTorch, and a
step built on it against model.generate, so that the measured variant is a correct one. Without
CUDA the kernel runs under Triton's CPU interpreter (tests/conftest.py)."""
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")

import torch.nn.functional as F  # noqa: E402

import fastgen_lib as fg  # noqa: E402
from fastgen_lib import fused  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("probe_mlp", ROOT / "tools" / "probe_mlp.py")
probe_mlp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe_mlp)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
# width, hidden size, block_j, group: 16 programs in one group; 64 in 16 groups; 20 in groups
# of 8, 8, 4; on a GPU also GPT-2 124M's MLP (the interpreter pays per program)
SPLITS = [(64, 256, 16, 16), (64, 256, 4, 4), (64, 320, 16, 8)]
SPLITS += [(768, 3072, 16, 16)] if DEVICE == "cuda" else []


def tool(name):
    """tools/NAME.py as a module (tools/ on the path while it imports, for its `step_ab`)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "tools"))


def rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


@pytest.mark.parametrize("E, Fh, block_j, group", SPLITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 3])
def test_mlp_kernel(B, dtype, E, Fh, block_j, group):
    # x += GELU(LN(x) @ Wf + bf) @ Wp + bp, in place, twice with the same scratch: each counter is
    # reset
    torch.manual_seed(0)
    x = rand(B, E, dtype=dtype, scale=3.0) + 1.5
    ln = torch.nn.LayerNorm(E, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(rand(E, dtype=dtype) + 1)
        ln.bias.copy_(rand(E, dtype=dtype))
    Wf, bf = rand(E, Fh, dtype=dtype, scale=E ** -0.5), rand(Fh, dtype=dtype, scale=0.1)
    Wp, bp = rand(Fh, E, dtype=dtype, scale=Fh ** -0.5), rand(E, dtype=dtype, scale=0.1)
    floats, counters = probe_mlp.mlp_scratch(B, E, Fh, block_j, group)
    scratch = (torch.empty(floats, device=DEVICE),
               torch.zeros(counters, dtype=torch.int32, device=DEVICE))
    for _ in range(2):
        with torch.no_grad():
            want = x + F.gelu(ln(x) @ Wf + bf, approximate="tanh") @ Wp + bp
        got = probe_mlp.mlp(x, Wf, Wp, bp, fused.fold_layernorm(ln, Wf, bf), scratch,
                            block_j, group)
        assert got.data_ptr() == x.data_ptr() and got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
        assert not scratch[1].any()


def test_mlp_step_gives_model_generate_tokens():
    # the probe's step (each MLP one kernel) on the seam: left padding, rows that stop apart
    from fastgen_lib import decoders, stops
    from fastgen_lib.models import EOS
    from fastgen_lib.reference import hf_generate
    from fastgen_lib.steps import GenConfig
    model = fg.load_model("tiny", device=DEVICE)
    fg.set_eos_bias(model, 0.6)
    ids, mask = fg.make_batch(4, 8, mixed=True, seed=4, device=DEVICE)
    ref = hf_generate(model, ids, mask, 24, EOS, EOS, cache_implementation="static")
    stop = [int((r == EOS).nonzero()[0]) if (r == EOS).any() else None for r in ref[:, 8:]]
    assert len(set(stop)) >= 2
    gen = GenConfig(24, (EOS,), EOS, False, 1.0, None, 0, None)
    step = probe_mlp.mlp_step(4, 4, 4)  # 64 programs in 16 groups
    out = decoders.decode(model, ids, mask, gen, step, stops.interleaved)
    assert torch.equal(out, ref), (out, ref)
    assert any(type(s) is step for s in model.__dict__["_fastgen_steps"].values())


def test_step_ab_compares_patched_steps_on_the_tiny_model():
    # tools/step_ab.py, which the step probes share, with probe_early_kv's and probe_gemv_tiles'
    # patched steps: the library's step (early_kv=True) beside one with other GEMV tiles and
    # early_kv=False, the same tokens as each other and as model.generate, both attentions called,
    # the tiles in force (a larger scratch: more splits), and the library's defaults put back after
    early = tool("probe_early_kv")
    with_early_kv, with_tiles = early.with_early_kv, early.with_tiles
    compare_steps = tool("step_ab").compare_steps
    defaults = (fused.default_tiles, fused.attention)
    seen = set()  # the early_kv of every attention call: the library's step and the patched one

    def spy(*args, **kw):
        seen.add(kw.get("early_kv"))
        return defaults[1](*args, **kw)
    fused.attention = spy
    try:
        patched = with_early_kv(with_tiles(32, 64), False)
        assert patched.__name__ == "k32_p64_late_kv"
        model = fg.load_model("tiny", device=DEVICE)
        df = compare_steps({"default": fused.FusedStep, "patched": patched}, (torch.float32,),
                           (2,), "step", same_as="default", N=4, size="tiny", device=DEVICE,
                           repeats=1)
    finally:
        fused.attention = defaults[1]
    assert seen == {True, False}
    assert list(df.step) == ["default", "patched"] and (df.ms_per_step > 0).all()
    assert df.tokens_equal_default.all() and df.tokens_equal_model_generate.all()
    assert (fused.default_tiles, fused.attention) == defaults
    from fastgen_lib.models import EOS
    from fastgen_lib.steps import GenConfig
    gen = GenConfig(4, (EOS,), EOS, False, 1.0, None, 0, None)
    tiled = with_tiles(8, 64)(model, 2, 20, gen)  # (the lm_head's own: 16-row tiles of K)
    assert tiled.buf.scratch[0].numel() > fused.Buffers(model, 2, 20).scratch[0].numel()


def test_probe_whole_k_step_reads_all_of_k_as_one_tile_on_the_tiny_model():
    # tools/probe_whole_k.py's patched steps at batch 1: every GEMV but the lm_head reads its
    # whole K as one tile (no split: split 1, ONE_TILE), with model.generate's tokens, and
    # fused.layer_tiles put back after
    probe, compare_steps = tool("probe_whole_k"), tool("step_ab").compare_steps
    NAMES, whole_k, with_tiles = probe.NAMES, probe.whole_k, probe.with_tiles
    saved_tiles, saved_gemv = fused.layer_tiles, fused.gemv
    calls = []

    def spy(x, weight, *args, **kw):
        calls.append((tuple(weight.shape), kw.get("block_k"), kw.get("block_n")))
        return saved_gemv(x, weight, *args, **kw)
    fused.gemv = spy
    try:
        df = compare_steps({"default": fused.FusedStep, "a16w8_p16w8": with_tiles("a16w8_p16w8")},
                           (torch.float32,), (1,), "tiles", same_as="default", N=4,
                           size="tiny", device=DEVICE, repeats=1)
    finally:
        fused.gemv = saved_gemv
    assert fused.layer_tiles is saved_tiles and "a16w8_p8w16" in NAMES
    assert whole_k("a16w8_pd")(1, 3072, 768, torch.float32) == {}  # mlp.c_proj split
    assert df.tokens_equal_default.all() and df.tokens_equal_model_generate.all()
    whole = {shape for shape, k, n in calls if k == 4096 and n == 16}
    assert whole == {(64, 192), (64, 256), (256, 64)}  # tiny's qkv, c_fc, mlp.c_proj
    lm_head = [k for shape, k, n in calls if shape[1] > 1000]
    assert lm_head and all(k is None for k in lm_head)  # the lm_head as it is


def test_probe_attention_proj_steps_give_model_generate_tokens_on_the_tiny_model():
    # tools/probe_attention_proj.py's steps at batch 1: the two-kernel forms (`separate`, and
    # `separate_whole_k` with one attention program per row and head and an unsplit c_proj)
    # in place of fused.attention_proj, with model.generate's tokens; the kernels they call
    # are the ones named (spies), and attention_proj is put back after
    probe, compare_steps = tool("probe_attention_proj"), tool("step_ab").compare_steps
    separate, separate_whole_k = probe.separate, probe.separate_whole_k
    with_attention_proj = probe.with_attention_proj
    saved = (fused.attention_proj, fused.attention)
    blocks = []

    def spy(*args, **kw):
        blocks.append(kw.get("block_s", 32))
        return saved[1](*args, **kw)
    fused.attention = spy
    try:
        df = compare_steps({"default": fused.FusedStep,
                            "separate": with_attention_proj("separate", separate),
                            "separate_whole_k": with_attention_proj("separate_whole_k",
                                                                    separate_whole_k)},
                           (torch.float32,), (1,), "step", same_as="default", N=4,
                           size="tiny", device=DEVICE, repeats=1)
    finally:
        fused.attention = saved[1]
    assert (fused.attention_proj, fused.attention) == saved
    assert set(blocks) == {32, 128}  # `separate`'s attention, then separate_whole_k's
    assert df.tokens_equal_default.all() and df.tokens_equal_model_generate.all()


def test_probe_b32_tiles_patches_its_choice_at_its_batch_only(monkeypatch):
    # tools/probe_b32_tiles.py: each shape's fastest tiles (or fastest unsplit) from a sweep's
    # rows, patched into fused.layer_tiles at the probe's batch only; a step with them (the
    # batch set to 2, tiny's shapes) has model.generate's tokens, the chosen split in force
    import pandas as pd
    probe, compare_steps = tool("probe_b32_tiles"), tool("step_ab").compare_steps
    rows = pd.DataFrame([
        dict(name="a", K=64, N=192, block_n="default", block_k=None, split=3, num_warps=None,
             us=1.0),
        dict(name="a", K=64, N=192, block_n=16, block_k=32, split=2, num_warps=4, us=2.0),
        dict(name="a", K=64, N=192, block_n=32, block_k=32, split=1, num_warps=8, us=3.0),
        dict(name="p", K=256, N=64, block_n=16, block_k=32, split=1, num_warps=4, us=1.0)])
    best, unsplit = probe.fastest(rows), probe.fastest(rows, unsplit=True)
    assert best[(64, 192)] == dict(block_n=16, block_k=32, split=2, num_warps=4)
    assert unsplit[(64, 192)]["split"] == 1 and unsplit[(256, 64)] == best[(256, 64)]
    monkeypatch.setattr(probe, "B", 2)
    tiles = probe.patched(best)
    assert tiles(2, 64, 192, torch.float32)["split"] == 2
    assert tiles(1, 64, 192, torch.float32) == fused.layer_tiles(1, 64, 192, torch.float32)
    saved_tiles, saved_gemv = fused.layer_tiles, fused.gemv
    splits = []

    def spy(x, weight, *args, **kw):
        splits.append((tuple(weight.shape), kw.get("split")))
        return saved_gemv(x, weight, *args, **kw)
    monkeypatch.setattr(fused, "gemv", spy)
    step = tool("step_ab").with_attr(fused.FusedStep, "best", fused, "layer_tiles", tiles)
    df = compare_steps({"default": fused.FusedStep, "best": step}, (torch.float32,), (2,),
                       "tiles", same_as="default", N=4, size="tiny", device=DEVICE, repeats=1)
    assert fused.layer_tiles is saved_tiles
    assert df.tokens_equal_default.all() and df.tokens_equal_model_generate.all()
    assert ((64, 192), 2) in splits and ((256, 64), 1) in splits


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_probe_b32_rows_kernel_matches_torch(rows):
    # tools/probe_b32_rows.py's GEMV (all of K in registers, the batch `rows` rows at a time):
    # batch 5 (not a multiple of rows), 48 columns in tiles of 16, K = 80 (padded to 128)
    probe = tool("probe_b32_rows")
    torch.manual_seed(0)
    x, w, b = rand(5, 80, dtype=torch.float32), rand(80, 48, dtype=torch.float32), \
        rand(48, dtype=torch.float32)
    y = torch.empty(5, 48, device=DEVICE)
    probe.rows_gemv(x, w, b, y, block_n=16, rows=rows)
    torch.testing.assert_close(y, x @ w + b, **TOL[torch.float32])



def test_probe_layout_steps_read_k_contiguous_weights_on_the_tiny_model():
    # tools/probe_layout.py's patched steps at batch 1: the layer GEMVs (qkv, c_fc,
    # mlp.c_proj) read copies of their weights with K contiguous, with their tiles; with an
    # "l" part the lm_head reads all of K as one tile, its per-tile maxima sized to match
    # (a large tile: the interpreter pays per program); model.generate's tokens, and the
    # library's gemv, gemv_tiles and layer_tiles put back after
    probe, compare_steps = tool("probe_layout"), tool("step_ab").compare_steps
    saved = (fused.layer_tiles, fused.gemv, fused.gemv_tiles)
    probe.COPIES.clear()
    name = "a8w4_p4w8_l8192w4"
    assert probe.groups(name)["l"] == dict(block_k=4096, block_n=8192, num_warps=4)
    df = compare_steps({"default": fused.FusedStep, name: probe.with_layout(name)},
                       (torch.float32,), (1,), "layout", same_as="default", N=4,
                       size="tiny", device=DEVICE, repeats=1)
    assert (fused.layer_tiles, fused.gemv, fused.gemv_tiles) == saved
    assert df.tokens_equal_default.all() and df.tokens_equal_model_generate.all()
    copies = [c for _, c in probe.COPIES.values()]
    assert {tuple(c.shape) for c in copies} == {(64, 192), (64, 256), (256, 64)}
    assert len(copies) == 3 * 2 and all(c.stride(0) == 1 for c in copies)  # tiny: 2 layers
    model = fg.load_model("tiny", device=DEVICE)
    from fastgen_lib.models import EOS
    from fastgen_lib.steps import GenConfig
    step = probe.with_layout(name)(model, 1, 20, GenConfig(4, (EOS,), EOS, False, 1.0, None,
                                                           0, None))
    assert step.buf.top.shape == (1, -(-model.config.vocab_size // 8192))
    assert probe.kt("a8w4_p2w8")(1, 3072, 768, torch.float32) == dict(
        block_k=4096, block_n=2, num_warps=8)
    assert probe.kt("lib")(1, 768, 2304, torch.float32) == fused.layer_tiles(
        1, 768, 2304, torch.float32)
    assert probe.kt("a8w4_p2w8")(32, 768, 2304, torch.float32) == {}
