"""The measurement toolkit on CUDA (issue 3): what the CPU tests (tests/test_measure.py) cannot reach.

GPT-2 124M, random weights, float32. No timing thresholds between decoders (those are the benchmark's job):
these tests check that each tool measures what it says, with outcomes that a broken tool would change."""
import pytest
import torch

import fastgen_lib as fg
from fastgen_lib import measure, memory, traces
from fastgen_lib.models import EOS

pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without CUDA


@pytest.fixture(scope="module")
def model():
    return fg.load_model("124m", device="cuda", weights="random")


def call(model, decoder, batch=8, n=40):
    ids, mask = fg.make_batch(batch, 16, mixed=True, seed=batch, device="cuda")
    return lambda: fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=n, eos_token_id=EOS,
                               pad_token_id=EOS)


def test_time_call_waits_for_the_gpu():
    # ~20 ms of GPU spinning, queued in microseconds: a timer that did not synchronize would report ~0
    cycles = int(20e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)  # clock_rate is in kHz
    times, _ = measure.time_call(lambda: torch.cuda._sleep(cycles), repeats=3)
    assert min(times) > 5e-3, times


def test_bandwidth_is_plausible_for_this_gpu():
    bw = measure.measure_bandwidth()
    assert 1e11 < bw < 2e13, bw
    if "H200" in torch.cuda.get_device_name():  # HBM3e, 4.8 TB/s on paper; a copy reaches ~4.2-4.3
        assert 3.0e12 < bw < 4.8e12, bw


def test_a_timing_row_carries_its_conditions(model):
    ids, mask = fg.make_batch(4, 16, mixed=True, seed=4, device="cuda")
    row = measure.measure(model, ids, mask, "interleaved", 20, repeats=3)
    assert row["gpu"] == torch.cuda.get_device_name() and row["dtype"] == "float32"
    assert row["min_s"] <= row["median_s"] <= row["max_s"] and row["ms_per_step"] > 0
    assert (row["method"], row["batch"], row["prompt_len"], row["new_tokens"]) == ("interleaved", 4, 16, 20)


def test_memory_run_sees_the_dynamic_cache_grow(model):
    kv, st = call(model, "kv_cache", n=100), call(model, "static_cache", n=100)
    kv(), st()  # warm-up
    a, ta = memory.memory_run(kv)
    b, tb = memory.memory_run(st)
    # DynamicCache asks for a slightly larger block every step: new segments during the run; the static
    # cache is allocated once, at its prefill (chapter 4 on the H200: 13 against 1)
    assert a["segment_allocs"] > b["segment_allocs"], (a, b)
    assert a["peak_allocated_mb"] > 0 and a["peak_reserved_mb"] >= a["peak_allocated_mb"]
    assert a["before_inactive_split_mb"] >= 0 and not a["expandable_segments"]
    for t in (ta, tb):
        assert len(t) > 0 and (t.reserved >= t.allocated - 1).all()


def test_fresh_process_applies_the_allocator_setting():
    args = ["--decoder", "kv_cache", "--batch", "8", "--new-tokens", "50", "--size", "124m", "--repeats", "1"]
    default = memory.fresh_process("", args)
    expandable = memory.fresh_process("expandable_segments:True", args)
    assert default["setting_took_effect"] and not default["expandable_segments"], default
    assert expandable["setting_took_effect"] and expandable["expandable_segments"], expandable
    assert expandable["peak_inactive_split_mb"] == 0, expandable  # no split blocks in expandable segments


def test_profile_finds_every_step_and_no_gap_with_interleaved(model):
    n = 24
    f = call(model, "interleaved", batch=1, n=n)
    f()  # compile and capture outside the profile
    iv = traces.profile_decode(f)
    b = traces.between_steps(iv)
    assert b["steps"] == n - 1, b  # one graph replay per step after the prefill's token
    assert b["kernels_per_step"] >= 50, b  # 12 layers of several kernels each
    assert b["in_steps_fraction"] > 0.9, b
    g = traces.gpu_gaps(iv, steps=n - 1)
    assert 0 < g["busy_fraction"] <= 1 and g["busy_us"] <= g["span_us"]
    top = traces.top_kernels(iv)
    assert len(top) > 0 and top["sum"].sum() <= (iv.end_us - iv.start_us).sum() + 1e-6


def test_profile_shows_the_synchronous_gap(model):
    # the same loop with a host wait per step: the median gap between steps is larger than interleaved's
    n = 24
    fc, fi = call(model, "compiled", batch=1, n=n), call(model, "interleaved", batch=1, n=n)
    fc(), fi()
    gc = traces.between_steps(traces.profile_decode(fc))["gap_between_steps_us_median"]
    gi = traces.between_steps(traces.profile_decode(fi))["gap_between_steps_us_median"]
    assert gc > gi, (gc, gi)
