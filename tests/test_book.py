"""The book is held to its lessons. These tests read the committed notebooks, which carry the outputs of
the canonical H200 run, and fail when a chapter's saved outputs contradict what it teaches, or when the
rendered page would show a reader something broken. The numbers come from `fastgen_lib.book.record`."""
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Chapters whose rewrite waits for device time (outputs of an older run): the static-page checks name
# them as skipped, not passed. None today.
PENDING = set()


def current(paths):
    return [pytest.param(p, id=p.stem, marks=pytest.mark.skip(reason="previous run's outputs: "
                                                              "re-executed in the next canonical run"))
            if p.stem in PENDING else pytest.param(p, id=p.stem) for p in paths]


def cells(path):
    return json.loads(path.read_text())["cells"]


def records(stem):
    """The numbers a chapter recorded for its lesson: {name: value}."""
    out = {}
    for c in cells(ROOT / "notebooks" / f"{stem}.ipynb"):
        for o in c.get("outputs", []):
            meta = o.get("metadata", {}).get("scrapbook")
            if meta:
                prefix = meta.get("mime_prefix", "")
                out[meta["name"]] = float(o["data"][prefix + "text/plain"])
    return out


# chapter, what it teaches, the check on its recorded numbers
LESSONS = [
    ("01_naive", "the naive loop's GPU work grows like N^2 (fitted on the longer N)",
     lambda r: 1.6 <= r["ch1_gpu_exponent"] <= 2.4),
    ("01_naive", "the wall time grows more slowly than the GPU work: a fixed host cost per step",
     lambda r: r["ch1_wall_exponent"] < r["ch1_gpu_exponent"]),
    ("02_kv_cache", "the KV cache makes a step faster where the re-run tokens matter",
     lambda r: r["ch2_kv_speedup"] > 1.1),
    ("02_kv_cache", "at batch 1 the eager step is host-bound: the GPU is busy under half of it",
     lambda r: r["ch2_kernel_fraction_b1"] < 0.5),
    ("02_kv_cache", "memory numbers start clean (no leftover inactive split from earlier cells)",
     lambda r: r["ch2_before_inactive_split_mb"] < 100),
    ("03_expandable_segments", "the measured run starts from a clean allocator",
     lambda r: r["ch3_leftover_inactive_split_mb"] < 100),
    ("04_static_cache", "unused cache positions cost time: at batch 32, 1024 slots are slower than 128",
     lambda r: r["ch4_step_ms_b32_L1024"] > 1.2 * r["ch4_step_ms_b32_L128"]),
    ("05_compiled", "one_query attention makes the float32 compiled step faster at batch 1",
     lambda r: r["ch5_one_query_gain_b1"] > 0),
    ("06_hidden_sync", "compiled's loop syncs the host once per decode step (N - 1 = 99 of them)",
     lambda r: r["ch6_syncs_in_compiled_loop"] == 99),
    ("07_interleaved", "deferred and interleaved give compiled's tokens, bit for bit",
     lambda r: r["ch7_all_equal_to_compiled"] == 1),
    ("07_interleaved", "the deferred check shrinks the gap between steps; two streams shrink it further",
     lambda r: r["ch7_gap_between_steps_us_interleaved"] < r["ch7_gap_between_steps_us_deferred"]
     < r["ch7_gap_between_steps_us_compiled"]),
    ("07_interleaved", "removing the host's wait makes a step faster at batch 1 and batch 8",
     lambda r: r["ch7_interleave_gain_b1"] > 0 and r["ch7_interleave_gain_b8"] > 0),
    ("07_interleaved", "a host with work per token (a text streamer) slows compiled; interleaved hides it",
     lambda r: r["ch7_stream_gain_b1"] > 0.05
     and r["ch7_stream_cost_us_interleaved"] < 0.25 * r["ch7_stream_cost_us_compiled"]),
    ("07_interleaved", "a pinned flag read without its event wait is stale; with the wait, never",
     lambda r: r["ch7_stale_reads_without_wait"] > 0 and r["ch7_stale_reads_with_wait"] == 0),
    ("08_results", "the article's ~5x over the naive loop at batch 32 holds",
     lambda r: r["ch8_interleaved_vs_naive_b32"] >= 5),
    ("09_fused", "the fused step gives model.generate's float32 tokens",
     lambda r: r["ch9_tokens_equal"] == 1),
    ("09_fused", "50 kernels instead of 160 make the batch-1 float32 step faster than interleaved",
     lambda r: r["ch9_fused_kernels_per_step"] <= 70 and r["ch9_speedup_b1_float32"] > 1),
    ("09_fused", "the fused step beats model.generate's (static cache) over 2.5x in every dtype and "
     "batch", lambda r: r["ch9_min_x_vs_generate"] > 2.5),
    ("09_fused", "a batch-1 GEMV alone costs its bytes at the copy bandwidth plus a fixed 2-4 us",
     lambda r: 2 < r["ch9_gemv_fixed_us"] < 4),
    ("09_fused", "kernels that start early (PDL) make the batch-1 float32 step faster, same tokens",
     lambda r: r["ch9_pdl_saved_b1_float32"] > 0.05 and r["ch9_pdl_same_tokens"] == 1),
    ("09_fused", "reading more before the PDL waits makes the batch-1 float32 step faster, same "
     "tokens", lambda r: r["ch9_early_reads_saved_b1_float32"] > 0.05
     and r["ch9_early_reads_same_tokens_float32"] == 1),
    ("09_fused", "reading the epilogue's own inputs before the wait makes the batch-1 step faster "
     "in both dtypes, same tokens", lambda r: r["ch9_epilogue_saved_b1_float32"] > 0.03
     and r["ch9_epilogue_saved_b1_bfloat16"] > 0.03 and r["ch9_epilogue_same_tokens"] == 1),
    ("09_fused", "at batch 32 in float32, one TF32 product in place of three saves over 10% of "
     "the step, and its tokens part from model.generate's",
     lambda r: r["ch9_tf32_all_ms_b32"] < 0.9 * r["ch9_tf32x3_ms_b32"]
     and r["ch9_tf32_all_same_tokens"] == 0),
    ("09_fused", "attention and c_proj in one kernel make the batch-1 float32 step faster, same "
     "tokens", lambda r: r["ch9_joined_saved_b1_float32"] > 0.03
     and r["ch9_joined_same_tokens"] == 1),
    ("09_fused", "at batch 1, GEMVs that read all of K as one tile make the step faster than the "
     "split, in both dtypes", lambda r: r["ch9_whole_k_saved_float32"] > 0.05
     and r["ch9_whole_k_saved_bfloat16"] > 0.05),
    ("09_fused", "at batch 1, weights with K contiguous in narrower tiles make the step faster "
     "in both dtypes", lambda r: r["ch9_layout_saved_float32"] > 0.01
     and r["ch9_layout_saved_bfloat16"] > 0.03),
    ("09_fused", "a kernel's hand-off costs over 2 us with no bytes; a grid barrier under half",
     lambda r: r["ch9_handoff_us_pdl"] > 2 and r["ch9_barrier_us"] < r["ch9_handoff_us_pdl"] / 2),
    ("09_fused", "an unsplit GEMV hands off in under half a split one's time; spinning on a count "
     "is slower than the PDL wait", lambda r: r["ch9_whole_us"] < r["ch9_handoff_us_pdl"] / 2
     and r["ch9_flag_us"] > r["ch9_whole_us"]),
    ("09_fused", "one persistent kernel is slower than the PDL chain; its phases alone take most of it",
     lambda r: r["ch9_persistent_us_float32"] > r["ch9_pdl_chain_us_float32"]
     and r["ch9_persistent_phases_us_float32"] > 0.75 * r["ch9_pdl_chain_us_float32"]),
    ("10_gpu_loop", "gpu_loop gives model.generate's tokens, as fused does",
     lambda r: r["ch10_tokens_equal"] == 1),
    ("10_gpu_loop", "one graph launch per call, and the decode steps add no host wait",
     lambda r: r["ch10_graph_launches_gpu_loop"] == 1 and r["ch10_decode_waits_gpu_loop"] == 0),
    ("10_gpu_loop", "the host's CPU time grows with the tokens under fused, not under gpu_loop",
     lambda r: r["ch10_host_cpu_growth_ms_fused_b1"] > 2
     and r["ch10_host_cpu_growth_ms_gpu_loop_b1"] < 0.1 * r["ch10_host_cpu_growth_ms_fused_b1"]),
    ("10_gpu_loop", "a busy host slows fused's batch-1 step by over 30%, gpu_loop's by under 10%",
     lambda r: r["ch10_busy_slowdown_fused_b1"] > 0.3 and r["ch10_busy_slowdown_gpu_loop_b1"] < 0.1),
    ("10_gpu_loop", "a host-driven loop launches a step past the stop, gpu_loop no launch",
     lambda r: r["ch10_extra_launches_fused"] == 1 and r["ch10_extra_launches_gpu_loop"] == 0),
]


@pytest.mark.parametrize("stem, lesson, check", LESSONS, ids=[f"{s}: {l}" for s, l, _ in LESSONS])
def test_saved_outputs_show_the_lesson(stem, lesson, check):
    r = records(stem)
    assert r, f"{stem} recorded no numbers: were its outputs committed?"
    assert check(r), f"{stem}: the saved outputs contradict '{lesson}': {r}"


STOPS = r"EOS at new token \(0: the prefill's; None: never\): \[(.*?)\]"


def test_chapter_3_expandable_segments_hold_less_memory_unused():
    # the lesson in the table's own rows: memory held but unused and peak reserved both fall (its
    # inactive-split rows cannot show it: the allocator leaves expandable segments out of them)
    table = next("".join(o["data"]["text/plain"]) for c in cells(ROOT / "notebooks/"
                 "03_expandable_segments.ipynb") if c.get("id") == "ch3-05"
                 for o in c.get("outputs", []) if "text/plain" in o.get("data", {}))
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:] if line.strip()}
    for row in ("peak_reserved_minus_allocated_mb", "peak_reserved_mb"):
        default, expandable = map(float, rows[row])
        assert expandable < default, (row, default, expandable)
    assert rows["setting_took_effect"] == ["True", "True"], rows["setting_took_effect"]


def test_chapter_9_token_check_has_rows_that_stop_apart():
    # the fused step is checked with early stopping: rows stop at different steps, one never, and
    # the tokens are model.generate's
    text = "".join("".join(o.get("text", "")) for c in cells(ROOT / "notebooks/09_fused.ipynb")
                   for o in c.get("outputs", []))
    m = re.search(STOPS, text)
    assert m, "chapter 9's token check printed no stops"
    stops = [s.strip() for s in m.group(1).split(",")]
    assert len(set(stops) - {"None"}) >= 2 and "None" in stops, stops
    assert "equal to model.generate: True" in text


def test_chapter_10_token_checks_stop_apart_and_end_the_call_early():
    # gpu_loop is checked twice: rows that stop apart and rows that never stop, then every row
    # stopping, so that the loop on the GPU ends the call before its budget of 40 tokens
    text = "".join("".join(o.get("text", "")) for c in cells(ROOT / "notebooks/10_gpu_loop.ipynb")
                   for o in c.get("outputs", []))
    runs = re.findall(r"(\d+) new tokens a row\n\s*" + STOPS, text)
    assert len(runs) == 2, f"chapter 10's token checks printed {len(runs)} runs"
    (_, first), (made, second) = [(int(n), [s.strip() for s in m.split(",")]) for n, m in runs]
    assert len(set(first) - {"None"}) >= 2 and "None" in first, first
    assert "None" not in second and int(made) < 40, (made, second)
    assert text.count("equal to model.generate: True") == 4
    assert "equal to model.generate: False" not in text


@pytest.mark.parametrize("path", current(NOTEBOOKS))
def test_no_warning_or_traceback_in_outputs(path):
    for i, c in enumerate(cells(path)):
        for o in c.get("outputs", []):
            assert o["output_type"] != "error", f"cell {i}: {o.get('ename')}"
            assert not (o["output_type"] == "stream" and o["name"] == "stderr"), \
                f"cell {i} writes to stderr: {''.join(o['text'])[:300]}"
            text = json.dumps(o.get("text", "")) + json.dumps(o.get("data", {}).get("text/plain", ""))
            assert not re.search(r"\w*Warning:|Traceback", text), f"cell {i}: {text[:300]}"


@pytest.mark.parametrize("path", current(NOTEBOOKS))
def test_code_fits_the_page(path):
    long = [(i, line) for i, c in enumerate(cells(path)) if c["cell_type"] == "code"
            for line in "".join(c["source"]).splitlines() if len(line) > 88]
    assert not long, f"{len(long)} code lines over 88 characters, first: {long[0]}"


# Printed lines over 88 characters scroll sideways on the page. Known ones, each with its reason; the
# test fails on a new one, and on a listed cell that no longer prints one (then drop it from here).
WIDE_OUTPUTS = {
    ("06_hidden_sync", "ch06-08"): "transformers' own source, printed as it is",
    # narrowed with the chapter's next run (results/h200/pace/noisy_host/pending_rerun.patch;
    # bench.ladder's progress line is narrowed in the library already)
    ("08_results", "ch08-32"): "two results on one line",
    ("08_results", "ch08-06"): "bench.ladder's progress line lists the methods",
}


@pytest.mark.parametrize("path", current(NOTEBOOKS))
def test_printed_output_fits_the_page(path):
    wide = {c.get("id") for c in cells(path) for o in c.get("outputs", [])
            if o["output_type"] == "stream"
            and any(len(line) > 88 for line in "".join(o["text"]).splitlines())}
    listed = {cid for stem, cid in WIDE_OUTPUTS if stem == path.stem}
    assert not wide - listed, f"cells printing lines over 88 characters: {sorted(wide - listed)}"
    assert not listed - wide, f"no longer wide, drop from WIDE_OUTPUTS: {sorted(listed - wide)}"


def test_the_install_cell_opens_every_chapter():
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    for path in [p for p in NOTEBOOKS if p.stem not in PENDING]:
        first = next(c for c in cells(path) if c["cell_type"] == "code")
        src = "".join(first["source"])
        assert f'REPO = "{url}"' in src and "git clone" in src and "pip install -q -e" in src \
            and 'find_spec("fastgen_lib") is None' in src, f"{path.name}: {src[:200]}"


@pytest.mark.parametrize("path", current(NOTEBOOKS))
def test_solutions_fold_and_widgets_do_not_leave_empty_boxes(path):
    for i, c in enumerate(cells(path)):
        tags = c.get("metadata", {}).get("tags", [])
        if c["cell_type"] == "code" and "solution" in tags:
            assert "hide-cell" in tags, f"cell {i}: a solution shows its output under the question"
        if c["cell_type"] == "code" and "widgets.rerun(" in "".join(c["source"]):
            assert "remove-output" in tags, f"cell {i}: a widget renders as an empty box on the web"


SHOWN = re.compile(r"inspect\.getsource\(((?:decoders|steps|stops|measure|memory|traces|bench|models|reference)"
                   r"\.[\w.]+)\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_code_shown_in_a_chapter_is_the_librarys(path):
    """A chapter that prints a library function's source shows exactly the code the library runs:
    change the function and the chapter must be executed again."""
    import importlib
    import inspect
    for i, c in enumerate(cells(path)):
        if c["cell_type"] != "code":
            continue
        shown = "".join("".join(o.get("text", "")) for o in c.get("outputs", [])
                        if o["output_type"] == "stream")
        for expr in SHOWN.findall("".join(c["source"])):
            module, *attrs = expr.split(".")
            obj = importlib.import_module(f"fastgen_lib.{module}")
            for a in attrs:
                obj = getattr(obj, a)
            assert inspect.getsource(obj).strip() in shown, f"cell {i}: {expr} changed since the run"
        for module, attr, start, stop in SHOW.findall("".join(c["source"])):
            from fastgen_lib.book import source
            obj = importlib.import_module(f"fastgen_lib.{module}")
            for a in attr.split("."):  # a method too: show(gpu_loop.Loop.__init__, ...)
                obj = getattr(obj, a)
            text = source(obj, start or None, stop or None)
            assert len(text) > 200 and text in shown, f"cell {i}: show({module}.{attr}) changed"


# book.show(module.name) or book.show(module.name, "first line's text", "stop line's text")
SHOW = re.compile(r'show\((\w+)\.([\w.]+)(?:, "([^"]*)")?(?:, "([^"]*)")?\)')


def test_show_finds_what_a_chapter_prints():
    from fastgen_lib import book, steps
    src = 'show(steps.choose, "if c.do_sample:", "return nxt")'
    (module, attr, start, stop), = SHOW.findall(src)
    text = book.source(getattr(steps, attr), start, stop)
    assert text.startswith("if c.do_sample:") and "return nxt" not in text and "argmax" in text
    (_, attr, start, stop), = SHOW.findall('show(gpu_loop.Loop.__init__, "to_gpu = ", "self._keep")')
    assert attr == "Loop.__init__" and start == "to_gpu = " and stop == "self._keep"
