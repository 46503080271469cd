"""The benchmark: our decoders beside `model.generate` (its default cache, and its static cache, which
compiles itself on CUDA), in one process, on the same prompts, tokens checked. Book: chapter 8."""
import itertools

import pandas as pd
from tqdm.auto import tqdm

from . import measure
from .decoders import generate
from .models import prompts_for, stop_ids
from .reference import first_divergence, hf_generate
from .registry import METHODS, have

HF_METHODS = {n: m.reference for n, m in METHODS.items() if not m.step}  # model.generate's rows
LADDER = [n for n, m in METHODS.items() if m.chapter <= 8]  # the article's ladder (chapter 8)
HEADLINE = [n for n, m in METHODS.items() if m.headline]  # the default run
STATIC = {n for n, m in METHODS.items() if m.static}  # attend over all T+N slots (the floor's bytes)
GPU_RESULTS = "results/h200/ (chapter 8: notebooks/08_results.ipynb)"
LEGEND = {  # what `summary`'s columns mean
    "ttft_ms": "time to first token (the prefill and one token choice), ms",
    "ms_per_step": "each later decode step, ms (whole call minus ttft, over the other steps)",
    "floor_ms_per_step": "the bytes a step must read / the measured bandwidth (x_floor: ratio)",
    "tokens_per_s": "new tokens of all rows per second of the whole call",
    "x_vs_hf_static": "whole-call speedup over model.generate with its static cache",
    "tokens_match": "the same tokens as model.generate (like with like: Method.reference)",
}


def legend(df):
    """`LEGEND`'s lines for the columns `summary(df)` shows, and how the rows were timed."""
    lines = [f"{k}: {v}" for k, v in LEGEND.items() if k in summary(df)]
    return "\n".join(lines + ["median of alternated rounds after a warm-up; the first call "
                               "(compiling) is timed apart"])


def runnable(names):
    """The methods of `names` whose needs this machine has (in registry order)."""
    return [n for n in METHODS if n in names and all(map(have, METHODS[n].needs))]


def method_call(model, ids, mask, method, max_new_tokens):
    """`call(n)` for one of METHODS: `n` new tokens, on a cache sized for `max_new_tokens`."""
    eos, pad = stop_ids(model)
    if METHODS[method].step:
        return measure.decoder_call(model, ids, mask, method, max_new_tokens, eos_token_id=eos,
                                    pad_token_id=pad)

    def call(n=max_new_tokens):
        return hf_generate(model, ids, mask, n, eos, pad, **HF_METHODS[method])
    call.decode_attention = model.config._attn_implementation  # model.generate runs the model's own
    return call


def ladder(model, batch=1, prompt_len=16, max_new_tokens=100, methods=LADDER, repeats=10,
           bandwidth=None, progress=True):
    """Every method on one workload, timed alternated (`measure.measure_calls`). Adds: tokens_match
    (equal to `model.generate`'s default, token for token; for a mismatch, the top-2 logit gap that
    decided it), speedups over naive and over hf_static, and the memory-bandwidth floor per step
    beside the measured time."""
    ids, mask = prompts_for(model, batch, prompt_len, seed=batch)
    ref = hf_generate(model, ids, mask, max_new_tokens, *stop_ids(model))
    calls = {m: method_call(model, ids, mask, m, max_new_tokens) for m in methods}
    timed = len(calls) * (2 if max_new_tokens > 1 else 1)
    bar = tqdm(total=len(calls) + timed * (1 + repeats), unit="call", disable=not progress,
               desc=f"batch {batch}, {max_new_tokens} tokens, {model.dtype}".replace("torch.", ""))
    with bar:
        rows, outs = measure.measure_calls(model, ids, calls, max_new_tokens, repeats,
                                           progress=bar.update)
    for row in rows:
        div = first_divergence(model, ids, mask, ref, outs[row["method"]])
        row["tokens_match"] = div is None
        row["divergence"] = "" if div is None else str(div)
    df = pd.DataFrame(rows)
    return add_ratios_and_floor(df, model, bandwidth)


def add_ratios_and_floor(df, model, bandwidth=None):
    """Speedups within each workload (same batch, length, dtype) and the bandwidth floor per step, from
    `model`'s bytes (`measure.bytes_per_step`): rows of another dtype than the model's get NaN."""
    keys = ["batch", "prompt_len", "max_new_tokens", "dtype"]
    for base in ("naive", "hf_static", "hf_dynamic"):
        t = df[df.method == base].set_index(keys)["median_s"]
        df[f"x_vs_{base}"] = [t.get(tuple(r[k] for k in keys), float("nan")) / r.median_s for _, r in df.iterrows()]
    if bandwidth:
        dtype = str(model.dtype).replace("torch.", "")
        df["floor_ms_per_step"] = [
            measure.floor_ms(model, r.batch, r.prompt_len + (r.max_new_tokens if r.method in STATIC
                                                             else r.max_new_tokens / 2), bandwidth)
            if r["dtype"] == dtype else float("nan") for _, r in df.iterrows()]
        df["x_floor"] = df.ms_per_step / df.floor_ms_per_step
    return df


def sweep(model, batches=(1, 4, 8, 16, 32), new_tokens=(50, 100, 200, 400), methods=LADDER, repeats=10,
          prompt_len=16, bandwidth=None, skip=None, checkpoint=None):
    """`ladder` over a grid. `skip(method, batch, new_tokens) -> bool` leaves out expensive cells (naive
    at 400 tokens, hf_static's per-shape recompiles) while keeping the grid honest about it. With
    `checkpoint` (a CSV path), the rows so far are written after every cell, so a run cut short keeps them."""
    frames = []
    grid = list(itertools.product(batches, new_tokens))
    for batch, n in tqdm(grid, desc="sweep"):
        ms = [m for m in methods if not (skip and skip(m, batch, n))]
        frames.append(ladder(model, batch, prompt_len, n, ms, repeats, bandwidth, progress=False))
        if checkpoint:
            pd.concat(frames, ignore_index=True).to_csv(checkpoint, index=False)
    return pd.concat(frames, ignore_index=True)


def default_skip(method, batch, new_tokens):
    """The sweep's budget (one H200 call is 10 minutes): the compiled decoders run the whole grid; the
    eager ones, host-bound at a few ms per step whatever the batch, run where they are cheap (naive,
    kv_cache and hf_dynamic up to 100 tokens, static_cache at 100); hf_static, which compiles afresh for
    every shape, at 100 tokens and batch 1 and 32. Skipped cells are absent from the CSV, never guessed."""
    if method in ("compiled", "deferred", "interleaved"):
        return False
    if method == "hf_static":
        return not (new_tokens == 100 and batch in (1, 32))
    if method == "static_cache":
        return new_tokens != 100
    return new_tokens > 100


TARGETS = [
    # (claim, method, baseline, batch, new tokens, at least)
    ("interleaved >= 3x model.generate(static), batch 1", "interleaved", "hf_static", 1, 100, 3.0),
    ("interleaved >= 2x model.generate(static), batch 32", "interleaved", "hf_static", 32, 100, 2.0),
    ("interleaved >= 12x naive, batch 32", "interleaved", "naive", 32, 100, 12.0),
    ("article: ~5x over the baseline, batch 32 / 100 tokens", "interleaved", "naive", 32, 100, 5.0),
]
STEP_TARGETS = [  # the fused step's (issue 14): (claim, method, dtype, batch, at most ms per step)
    ("fused <= 0.25 ms per step, batch 1, float32", "fused", "float32", 1, 0.25),
    ("fused <= 0.15 ms per step, batch 1, bfloat16", "fused", "bfloat16", 1, 0.15),
    ("fused <= 0.6 ms per step, batch 32, float32", "fused", "float32", 32, 0.6),
]


def pace_note(df):
    """A line for the rows whose timing rounds never ran at the host's full pace (`measure.compare`:
    no `repeats` rounds within its slack of the process's best pace), or None. A slow host slows
    what launches from Python (model.generate, the eager decoders) far more than a CUDA graph."""
    if "full_pace" not in df:
        return None
    slow = df[df.full_pace.eq(False)]  # NaN (a merged CSV without it) is not slow
    if not len(slow):
        return None
    return (f"NOTE: the host ran slow in {len(slow)} of {len(df)} rows (pace ratio up to "
            f"{slow.pace_ratio.max():.2f}): the methods that launch from Python read slow "
            "there; measure again on an idle host before quoting them")


def claims(df, dtype="float32", on_gpu=None):
    """The targets and the article's claims, checked against a ladder or sweep DataFrame
    (the fused step's targets, `STEP_TARGETS`, where its rows have `fused`).
    They are stated for a GPU: measured on a CPU (`on_gpu` False; by default, when the
    rows' `gpu` column says "CPU ..."), every row's `holds` is "n/a on CPU"."""
    if on_gpu is None:
        on_gpu = "gpu" not in df or not df.gpu.astype(str).str.startswith("CPU").any()
    rows = []
    d = df[df.dtype == dtype]
    for claim, method, base, batch, n, want in TARGETS:
        cell = d[(d.batch == batch) & (d.max_new_tokens == n)]
        cell = cell.set_index("method")["median_s"]
        if method in cell and base in cell:
            got = cell[base] / cell[method]
            rows.append({"claim": claim, "measured": round(got, 2), "target": want,
                         "holds": got >= want})
        else:
            rows.append({"claim": claim, "measured": None, "target": want, "holds": None})
    for batch in sorted(d.batch.unique()):
        cell = d[(d.batch == batch) & (d.max_new_tokens == 100)]
        cell = cell.set_index("method")["median_s"]
        if "compiled" in cell and "interleaved" in cell:
            gain = 100 * (cell["compiled"] / cell["interleaved"] - 1)
            rows.append({"claim": f"gain of interleaving over the synchronous check, batch "
                                  f"{batch} (article: up to 11.6% at small batch)",
                         "measured": round(gain, 1), "target": None, "holds": None})
    for claim, method, dt, batch, want in STEP_TARGETS:  # where the rows have that method
        cell = df[(df.dtype == dt) & (df.batch == batch) & (df.max_new_tokens == 100)]
        cell = cell.set_index("method")
        if method in cell.index and "ms_per_step" in cell:
            got = float(cell.ms_per_step[method])
            rows.append({"claim": claim, "measured": round(got, 3), "target": want,
                         "holds": got <= want})
    out = pd.DataFrame(rows)
    if not on_gpu and len(out):
        out["holds"] = "n/a on CPU"
    return out


def summary(df):
    """The table people read (`LEGEND` says its columns): one row per method. The CSV keeps the
    rest: quartiles, the whole call's time, the first call with its compilation, the conditions."""
    cols = ["method", "batch", "ttft_ms", "ms_per_step", "floor_ms_per_step", "x_floor",
            "tokens_per_s", "x_vs_hf_static", "tokens_match"]
    return df[[c for c in cols if c in df]]
