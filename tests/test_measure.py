"""The measuring toolkit on the CPU: timing, rows, floor arithmetic, trace gaps on synthetic traces."""
import time

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

import fastgen_lib as fg
from fastgen_lib import bench, measure, memory, plots, traces


@pytest.fixture(scope="module")
def model():
    return fg.load_model("tiny", device="cpu")


def test_time_call_excludes_warmup_and_counts_repeats():
    # the two warm-up calls are slow, the timed ones are not. A round where the host ran slow is
    # left out and another one runs (compare's pace_slack), so more than 4 calls may be timed
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= 2:
            time.sleep(0.2)
        return len(calls)
    times, out = measure.time_call(fn, repeats=4, warmup=2)
    assert len(times) == 4 and all(0 <= t < 0.1 for t in times)
    assert len(calls) >= 6 and out == len(calls)


def test_compare_without_the_pace_filter_runs_exactly_the_rounds_asked_for():
    calls = []
    times, out, stats = measure.compare({"fn": lambda: calls.append(1) or len(calls)}, repeats=4,
                                        warmup=2, pace_slack=None)
    assert len(times["fn"]) == 4 and len(calls) == 6 and out["fn"] == 6 and stats["rounds"] == 4


def test_measure_row_carries_conditions(model):
    ids, mask = fg.make_batch(2, 6)
    row = measure.measure(model, ids, mask, "kv_cache", 5, repeats=3)
    for key in ("gpu", "torch", "transformers", "dtype", "batch", "prompt_len", "new_tokens", "method",
                "median_s", "min_s", "max_s", "ms_per_step", "tokens_per_s", "first_call_s"):
        assert key in row
    assert row["min_s"] <= row["median_s"] <= row["max_s"]
    assert row["batch"] == 2 and row["new_tokens"] == 5 and row["dtype"] == "float32"
    assert row["tokens_per_s"] == pytest.approx(2 * 5 / row["median_s"])
    assert row["decode_attention"] == "sdpa"  # an eager decoder runs the model's own attention
    assert "decode_attention" not in measure.conditions(model)  # a row's, from its decoder: not the model's


def test_compiled_rows_name_the_compiled_steps_attention(model):
    ids, mask = fg.make_batch(2, 6)
    assert measure.measure(model, ids, mask, "interleaved", 3, repeats=1)["decode_attention"] == "one_query"
    row = measure.measure(model, ids, mask, "compiled", 3, repeats=1, decode_attention="math")
    assert row["decode_attention"] == "math"


def test_compare_alternates_and_rows_split_prefill_from_decode(model):
    order = []
    times, out, _ = measure.compare({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                    repeats=3, warmup=1, pace_slack=None)
    assert order == ["a", "b"] * 4 and len(times["a"]) == len(times["b"]) == 3
    ids, mask = fg.make_batch(2, 6)
    row = measure.measure(model, ids, mask, "kv_cache", 6, repeats=3)
    assert row["q1_s"] <= row["median_s"] <= row["q3_s"] and row["ttft_ms"] > 0
    assert row["ms_per_step_q1"] <= row["ms_per_step"] <= row["ms_per_step_q3"]
    assert row["ms_per_step"] < 1e3 * row["median_s"] / 5  # decode per step excludes the prefill


def test_compare_leaves_out_rounds_where_the_host_ran_slow(monkeypatch):
    def paces(values):  # host_pace returns these, and keeps the process's best as the real one does
        it = iter(values)

        def pace():
            p = next(it)
            measure._BEST_PACE[0] = min(measure._BEST_PACE[0], p)
            return p
        monkeypatch.setattr(measure, "_BEST_PACE", [float("inf")])
        monkeypatch.setattr(measure, "host_pace", pace)

    # two readings a round: round 2 ends slow, rounds 4 and 5 run slow throughout
    paces([1.0, 1.0, 1.0, 1.9, 1.0, 1.0, 1.8, 1.8, 1.7, 1.0] + [1.0] * 20)
    calls = []
    times, _, st = measure.compare({"a": lambda: calls.append(len(calls))}, repeats=4, warmup=0)
    assert st == {"rounds": 7, "full_pace": True, "pace_ratio": 1.0}
    assert len(calls) == 7 and len(times["a"]) == 4  # 3 rounds left out, 3 more run
    # slow from the first round: the process's best pace, seen earlier, is the reference
    paces([1.0] + [1.6] * 100)
    measure.host_pace()
    times, _, st = measure.compare({"a": lambda: None}, repeats=3, warmup=0, max_rounds=5)
    assert st["rounds"] == 5 and not st["full_pace"] and len(times["a"]) == 3  # the cap: best-paced
    assert st["pace_ratio"] == pytest.approx(1.6)
    # a reading after every call: the host slow between a and b leaves that round out
    paces([1.0, 1.0, 1.0, 1.0, 1.7, 1.0] + [1.0] * 20)
    times, _, st = measure.compare({"a": lambda: None, "b": lambda: None}, repeats=2, warmup=0)
    assert st["rounds"] == 3 and len(times["a"]) == len(times["b"]) == 2
    paces([])  # pace_slack=None keeps every round and reads no pace (an empty list: none to read)
    times, _, st = measure.compare({"a": lambda: None}, repeats=3, warmup=0, pace_slack=None)
    assert st["rounds"] == 3 and len(times["a"]) == 3
    for bad in ({"pace_slack": 0.9}, {"max_rounds": 2}, {"repeats": 0}):
        with pytest.raises(ValueError):
            measure.compare({"a": lambda: None}, **{"repeats": 3, **bad})


def test_fit_exponent_recovers_slopes():
    n = [50, 100, 200, 400]
    assert measure.fit_exponent(n, [3e-6 * x**2 for x in n]) == pytest.approx(2.0)
    assert measure.fit_exponent(n, [1e-3 * x for x in n]) == pytest.approx(1.0)


def _gpt2_bytes(cfg, batch, context, nbytes):
    """The floor's former formula, GPT-2's alone: layers (12h^2 + 13h) + vocab h + positions h + 2h
    parameters (the tied embedding once), and keys and values of 2 x layers x batch x context x h."""
    h, layers = cfg.n_embd, cfg.n_layer
    params = layers * (12 * h * h + 13 * h) + cfg.vocab_size * h + cfg.n_positions * h + 2 * h
    return (params + 2 * layers * batch * context * h) * nbytes


def test_bytes_per_step_counts_gpt2_weights_and_cache(model):
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: one tensor, read once
    for batch, context in ((1, 0), (2, 7), (8, 100)):
        assert measure.bytes_per_step(model, batch, context) == _gpt2_bytes(model.config, batch, context, 4)
    bf16 = fg.load_model("tiny", device="cpu", dtype=torch.bfloat16)
    assert measure.bytes_per_step(bf16, 8, 100) == _gpt2_bytes(bf16.config, 8, 100, 2)
    assert measure.floor_ms(model, 1, 0, bandwidth=4e12) == pytest.approx(
        _gpt2_bytes(model.config, 1, 0, 4) / 4e12 * 1e3)
    big = fg.load_model("124m", weights="random", device="cpu")
    assert measure.bytes_per_step(big, 1, 0) == 124_439_808 * 4  # GPT-2 small, tied embedding once
    assert measure.bytes_per_step(big, 8, 100) == _gpt2_bytes(big.config, 8, 100, 4)


@pytest.mark.parametrize("tied", [True, False])
def test_bytes_per_step_reads_kv_heads_of_a_grouped_query_model(tied):
    from transformers import LlamaConfig, LlamaForCausalLM
    V, h, inter, layers, heads, kv_heads = 100, 64, 96, 2, 4, 2
    cfg = LlamaConfig(vocab_size=V, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied)
    m = LlamaForCausalLM(cfg)
    hd = h // heads
    # q and o: h x h; k and v: h x (kv heads x head size); MLP: 3 h x inter; two norms a layer, one final
    per_layer = 2 * h * h + 2 * h * kv_heads * hd + 3 * h * inter + 2 * h
    params = V * h * (1 if tied else 2) + layers * per_layer + h
    assert measure.bytes_per_step(m, 1, 0) == params * 4
    kv = 2 * layers * 8 * 100 * kv_heads * hd  # the cache holds kv heads, not attention heads
    assert measure.bytes_per_step(m, 8, 100) == (params + kv) * 4
    assert measure.bytes_per_step(m.to(torch.bfloat16), 8, 100) == (params + kv) * 2


def _trace(events):
    return {"traceEvents": [dict(ph="X", cat=c, name=n, ts=s, dur=d, args={"stream": st, "correlation": corr})
                            for c, n, s, d, st, corr in events]}


def test_gpu_gaps_on_a_synthetic_trace():
    # three kernels, one overlapping on another stream; two gaps of 10 and 30 us
    iv = traces.trace_intervals(_trace([("kernel", "a", 0, 10, 7, 1), ("kernel", "b", 5, 10, 8, 2),
                                          ("kernel", "c", 25, 5, 7, 3), ("gpu_memcpy", "d", 60, 40, 7, 4),
                                          ("cpu_op", "x", 0, 500, 0, 5)]))
    assert list(iv.name) == ["a", "b", "c", "d"]
    g = traces.gpu_gaps(iv, steps=2)
    assert g["span_us"] == 100 and g["busy_us"] == 60 and g["idle_us"] == 40
    assert sorted(g["gaps_us"]) == [10, 30] and g["idle_per_step_us"] == 20 and g["busy_fraction"] == 0.6


def test_gpu_timeline_names_streams_in_order_of_first_work():
    # stream 69 runs first, then stream 7: rows "stream A" (69) and "stream B" (7), A on top
    iv = traces.trace_intervals(_trace([("kernel", "a", 20, 10, 7, 1), ("kernel", "b", 0, 10, 69, 2),
                                          ("gpu_memcpy", "c", 30, 2, 7, 3)]))
    empty = iv.iloc[:0]
    fig = plots.gpu_timeline({"two streams": iv, "nothing recorded": empty}, cond={"gpu": "test"})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stream A", "stream B"]
    bars = {round(b.get_paths()[0].vertices[:, 1].min(), 1): b for b in ax.collections}
    assert ax.yaxis_inverted() and len(bars) == 2  # row 0 (A) holds stream 69's kernel, at t = 0
    assert bars[0.0].get_paths()[0].vertices[:, 0].min() == 0
    assert "profiled" in fig.texts[-1].get_text()
    plt.close(fig)


def test_between_steps_groups_kernels_by_graph_launch():
    # two "steps" of 8 kernels (correlation 1 and 2) separated by a 50 us stall
    ev = [("kernel", f"k{i}", i * 2, 1, 7, 1) for i in range(8)] + \
         [("kernel", f"k{i}", 65 + i * 2, 1, 7, 2) for i in range(8)]
    iv = traces.trace_intervals(_trace(ev))
    s = traces.between_steps(iv)
    assert s["steps"] == 2 and s["kernels_per_step"] == 8
    assert s["gap_between_steps_us_total"] == 65 - 15
    assert traces.gpu_gaps(iv)["idle_us"] > s["gap_between_steps_us_total"]  # bubbles inside steps count too
    # two graphs in turn (interleaved's), of 10 and 8 kernels: a mean, not the median's 10
    ev = [("kernel", f"k{i}", 100 * c + i * 2, 1, 7, c) for c in (1, 2, 3) for i in range(10 - 2 * (c == 2))]
    assert traces.between_steps(traces.trace_intervals(_trace(ev)))["kernels_per_step"] == 28 / 3


def test_trace_intervals_keeps_only_what_generate_launched():
    trace = _trace([("kernel", "inside", 10, 1, 7, 1), ("kernel", "outside", 30, 1, 7, 2)])
    trace["traceEvents"] += [dict(ph="X", cat="user_annotation", name="fastgen.interleaved", ts=0, dur=20),
                             dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=5, dur=1,
                                  args={"correlation": 1}),
                             dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=25, dur=1,
                                  args={"correlation": 2})]
    assert list(traces.trace_intervals(trace, annotation="fastgen.").name) == ["inside"]


def test_kernel_ms_per_step_of_several_decoders_profiles_once(monkeypatch):
    # two decoders' calls in one session, their kernels told apart by their generate ranges
    trace = _trace([("kernel", "a", 10, 4, 7, 1), ("kernel", "b", 30, 6, 7, 2),
                    ("kernel", "b2", 40, 10, 7, 3)])
    for name, ts, corr in (("fastgen.naive", 0, 1), ("fastgen.kv_cache", 20, 2),
                           ("fastgen.kv_cache", 20, 3)):
        trace["traceEvents"] += [dict(ph="X", cat="user_annotation", name=name, ts=ts, dur=15),
                                 dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel",
                                      ts=ts + 5, dur=1, args={"correlation": corr})]
    ran, sessions = [], []

    def fake_profile(fn, path=None):
        sessions.append(1)
        fn()
        return trace
    monkeypatch.setattr(traces, "profile_trace", fake_profile)
    ms = traces.kernel_ms_per_step({"naive": lambda: ran.append("naive"),
                                    "kv_cache": lambda: ran.append("kv_cache")}, steps=2)
    assert sessions == [1] and ran == ["naive", "kv_cache"]
    assert ms == {"naive": 4 / 2 / 1e3, "kv_cache": 16 / 2 / 1e3}


def test_profile_decode_runs_on_cpu(model):
    ids, mask = fg.make_batch(1, 4)
    iv = traces.profile_decode(lambda: fg.generate(model, ids, mask, decoder="kv_cache", max_new_tokens=3))
    assert list(iv.columns) == ["name", "stream", "start_us", "end_us", "cat", "correlation"]


def test_allocator_timeline_replays_events():
    snap = {"segments": [{"total_size": 200}],
            "device_traces": [[{"action": "segment_alloc", "size": 200}, {"action": "alloc", "size": 64},
                               {"action": "alloc", "size": 32}, {"action": "free_completed", "size": 64}]]}
    t = memory.allocator_timeline(snap)
    assert list(t.allocated) == [0, 64, 96, 32] and list(t.reserved) == [200, 200, 200, 200]


def test_memory_run_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        memory.memory_run(lambda: None)


def test_ladder_dataframe_and_claims(model):
    df = bench.ladder(model, batch=2, prompt_len=6, max_new_tokens=4, repeats=2, bandwidth=1e11,
                      methods=["naive", "kv_cache", "interleaved", "hf_dynamic", "hf_static"], progress=False)
    assert isinstance(df, pd.DataFrame) and len(df) == 5 and df.tokens_match.all()
    assert df.set_index("method").x_vs_naive["naive"] == pytest.approx(1.0)
    assert (df.floor_ms_per_step > 0).all() and "x_floor" in df
    att = df.set_index("method").decode_attention
    assert att["interleaved"] == "one_query" and att["hf_static"] == att["kv_cache"] == "sdpa"
    c = bench.claims(df)
    assert c.measured.isna().all()  # no batch-32 / 100-token cell here: nothing claimed


def test_claims_on_a_synthetic_sweep():
    rows = [dict(method=m, batch=b, max_new_tokens=100, dtype="float32", median_s=t)
            for b, ts in ((1, dict(naive=6, compiled=1.1, interleaved=1.0, hf_static=3.5)),
                          (32, dict(naive=15, compiled=1.2, interleaved=1.0, hf_static=2.5)))
            for m, t in ts.items()]
    c = bench.claims(pd.DataFrame(rows)).set_index("claim")
    assert c.measured.iloc[0] == 3.5 and c.holds.iloc[0]
    assert c.measured.iloc[2] == 15.0 and c.holds.iloc[2]
    assert c.measured.iloc[4] == pytest.approx(10.0)  # interleaving gain at batch 1, %


def test_claims_check_the_fused_steps_targets():
    # issue 14's per-step targets, where the rows have `fused`: at most 0.25 / 0.15 / 0.6 ms
    rows = [dict(method="fused", batch=b, max_new_tokens=100, dtype=d, median_s=1.0,
                 ms_per_step=ms, gpu="NVIDIA H200")
            for b, d, ms in ((1, "float32", 0.226), (1, "bfloat16", 0.201),
                             (32, "float32", 0.750), (32, "bfloat16", 0.533))]
    c = bench.claims(pd.DataFrame(rows)).set_index("claim")
    fused = c[c.index.str.startswith("fused")]
    assert fused.measured.tolist() == [0.226, 0.201, 0.75]
    assert fused.holds.tolist() == [True, False, False]
    assert not bench.claims(pd.DataFrame(rows[:1]).assign(method="interleaved")).claim.str.startswith(
        "fused").any()  # no fused rows: no fused claims


def test_sweep_checkpoints_after_every_cell(model, tmp_path):
    path = tmp_path / "partial.csv"
    df = bench.sweep(model, batches=(1, 2), new_tokens=(3,), methods=["kv_cache", "naive"], repeats=1,
                     prompt_len=4, skip=lambda m, b, n: m == "naive" and b == 2, checkpoint=path)
    saved = pd.read_csv(path)
    assert len(df) == len(saved) == 3 and set(saved.batch) == {1, 2}
    assert not ((saved.method == "naive") & (saved.batch == 2)).any()  # skipped cells are absent, not guessed


def test_pace_note_names_the_rows_timed_on_a_slow_host():
    rows = pd.DataFrame({"method": ["fused", "hf_static", "fused"],
                         "full_pace": [True, False, False], "pace_ratio": [1.1, 1.9, 1.6]})
    note = bench.pace_note(rows)
    assert note.startswith("NOTE: the host ran slow in 2 of 3 rows") and "1.90" in note
    assert bench.pace_note(rows.assign(full_pace=True)) is None
    # a merged CSV without the column, or with it empty, says nothing
    assert bench.pace_note(rows.drop(columns="full_pace")) is None
    assert bench.pace_note(rows.assign(full_pace=float("nan"))) is None
