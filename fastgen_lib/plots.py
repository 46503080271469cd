"""Figures. Every figure carries its conditions (GPU, versions, dtype, workload) in a footer."""
import os

import matplotlib
import matplotlib.pyplot as plt  # matplotlib picks its backend: Agg where there is no display
import numpy as np

from .measure import fit_exponent
from .registry import METHODS

ORDER = list(METHODS)  # every figure's order, colours and labels: the registry's
COLORS = {n: m.color for n, m in METHODS.items()}
LABELS = {n: m.label for n, m in METHODS.items()}


def footer(fig, cond, extra=""):
    """Write the conditions under a figure: GPU, torch, transformers, dtype, then `extra`."""
    if hasattr(cond, "iloc"):  # a DataFrame: take its first row
        cond = cond.iloc[0].to_dict()
    parts = [str(cond.get("gpu", "")), f"torch {cond.get('torch', '')}",
             f"transformers {cond.get('transformers', '')}",
             str(cond.get("dtype", "")).replace("torch.", "")]
    if isinstance(cond.get("weights"), str) and cond["weights"] != "?":
        parts.append(f"{cond['weights']} weights")
    if isinstance(cond.get("alloc_conf"), str) and cond["alloc_conf"]:  # a CSV's empty cell reads back as NaN
        parts.append(f"PYTORCH_ALLOC_CONF={cond['alloc_conf']}")
    if cond.get("repeats") == cond.get("repeats") and cond.get("repeats") is not None:
        parts.append(f"prompt {cond.get('prompt_len')}, median of {cond['repeats']} runs after a warm-up")
    parts = [p for p in parts if p] + ([extra] if extra else [])
    width = int(fig.get_figwidth() * 15)  # characters of 8-point text that fit across the figure
    lines = [parts[0]]
    for p in parts[1:]:  # whole parts per line, " | " between them
        if len(lines[-1]) + 3 + len(p) > width:
            lines.append(p)
        else:
            lines[-1] += " | " + p
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=8, color="0.35", ha="left", va="bottom")
    fig.subplots_adjust(bottom=0.2 + 0.04 * (len(lines) - 1))
    return fig


def plain_log_labels(ax, xs):
    """Log-log axes labelled in plain numbers: the measured lengths `xs` on x; on y 0.1, 1, 10 and,
    on minor ticks, 2 and 5 times those, not powers of ten."""
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if round(v / 10 ** np.floor(np.log10(v))) in (2, 5) else ""))


def scaling(df, x="new_tokens", y="median_s", by="method", cond=None, ax=None):
    """Time against length on log-log axes, one line per method, with the fitted exponent in the legend
    (fitted on the longer half of the lengths)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.5, 4.2))
    for name, g in df.groupby(by, sort=False):
        g = g.sort_values(x)
        tail = g[g[x] >= g[x].median()]
        k = fit_exponent(tail[x], tail[y]) if len(tail) >= 2 else float("nan")
        ax.loglog(g[x], g[y], "o-", color=COLORS.get(name), label=f"{name}: time ~ $N^{{{k:.2f}}}$")
    xs = np.array(sorted(df[x].unique()), float)
    y0 = df[y].min()
    ax.loglog(xs, y0 * (xs / xs[0]) ** 2, ":", color="0.6", label="slope 2")
    ax.loglog(xs, y0 * (xs / xs[0]), "--", color="0.6", label="slope 1")
    ax.set(xlabel="new tokens N", ylabel="seconds per generate call", title="Time against length")
    plain_log_labels(ax, xs)
    ax.legend(fontsize=8)
    footer(fig, cond if cond is not None else df, f"batch {df['batch'].iloc[0]}, prompt {df['prompt_len'].iloc[0]}")
    return fig


def ladder_bars(df, cond=None, ax=None, title=None):
    """`step_bars` for a ladder: the methods in the book's order, titled by the workload. A CSV of the
    first protocol (bench_version 1) has no quartiles: its whiskers are min-max of whole calls."""
    d = df.set_index("method").reindex([m for m in ORDER if m in set(df.method)]).reset_index()
    if "ms_per_step_q1" not in d:
        d = d.assign(ms_per_step_q1=d.min_s / d.new_tokens * 1e3,
                     ms_per_step_q3=d.max_s / d.new_tokens * 1e3)
    title = title or f"batch {d.batch.iloc[0]}, {d.max_new_tokens.iloc[0]} new tokens"
    return step_bars(d, title, cond=cond, ax=ax)


def memory_timeline(timelines, cond=None, title="Allocated vs reserved over the decode"):
    """`timelines`: {label: DataFrame(event, allocated, reserved)} from `memory.allocator_timeline`,
    side by side on one memory scale that starts near the lowest allocation (the weights), so that the
    steps of reserved memory show."""
    n = len(timelines)
    fig, axes = plt.subplots(1, n, figsize=(min(4.2 * n, 8.4), 3.8), squeeze=False, sharey=True)
    lo = min(t.allocated.min() for t in timelines.values()) / 2**20
    hi = max(t.reserved.max() for t in timelines.values()) / 2**20
    for ax, (label, t) in zip(axes[0], timelines.items()):
        ax.plot(t.event, t.reserved / 2**20, label="reserved", color="tab:red")
        ax.plot(t.event, t.allocated / 2**20, label="allocated", color="tab:blue")
        ax.fill_between(t.event, t.allocated / 2**20, t.reserved / 2**20, color="tab:red", alpha=0.15,
                        label="reserved - allocated")
        ax.set_title(label, fontsize=10)
        ax.set(xlabel="allocator event")
    axes[0][0].set(ylabel="MiB", ylim=(lo - 0.1 * (hi - lo), hi + 0.05 * (hi - lo)))
    fig.suptitle(title.replace("torch.", ""), fontsize=10, y=0.98)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.93))  # one legend, above the panels
    footer(fig, cond or {})
    fig.subplots_adjust(top=0.76, wspace=0.08)
    return fig


def gpu_timeline(traces, cond=None, window_us=None, title="GPU timeline (like an Nsight Systems row)"):
    """`traces`: {label: intervals DataFrame from `traces.profile_decode`}. One row per label and stream;
    a bar per kernel or copy; white space is the GPU idling. `window_us` zooms to the first microseconds.
    The rows share one time axis, so equal widths are equal times. Streams are named A, B, ... in the
    order they first run work (CUDA's stream ids say nothing to a reader)."""
    fig, axes = plt.subplots(len(traces), 1, figsize=(8, 1.6 + 1.2 * len(traces)), squeeze=False,
                             sharex=True)
    for ax, (label, iv) in zip(axes[:, 0], traces.items()):
        t0 = iv.start_us.min() if len(iv) else 0
        streams = list(iv.groupby("stream").start_us.min().sort_values().index)
        for row, s in enumerate(streams):
            g = iv[iv.stream == s]
            colors = ["tab:orange" if c != "kernel" else "tab:green" for c in g.cat]
            edges = ["tab:orange" if c != "kernel" else "none" for c in g.cat]  # a 2 µs copy shows
            ax.broken_barh(list(zip(g.start_us - t0, g.end_us - g.start_us)), (row, 0.8), facecolors=colors,
                           edgecolors=edges, linewidth=0.8)
        ax.set_yticks([r + 0.4 for r in range(len(streams))],
                      [f"stream {chr(65 + r)}" for r in range(len(streams))], fontsize=9)
        ax.invert_yaxis()  # stream A on top
        ax.set_title(label, fontsize=10, loc="left")
        if window_us:
            ax.set_xlim(0, window_us)
    axes[-1, 0].set_xlabel("µs (green: kernels, orange: copies)")
    fig.suptitle(title)
    footer(fig, cond or {}, "profiled with torch.profiler: its gaps run longer than unprofiled ones")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def sweep_lines(df, cond=None):
    """Tokens/s against batch, one panel per number of new tokens, one line per method."""
    ns = sorted(df.max_new_tokens.unique())
    fig, axes = plt.subplots(1, len(ns), figsize=(4.2 * len(ns), 3.8), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], ns):
        g = df[df.max_new_tokens == n]
        for m in [m for m in ORDER if m in set(g.method)]:
            h = g[g.method == m].sort_values("batch")
            ax.loglog(h.batch, h.tokens_per_s, "o-", color=COLORS[m], label=m)
        ax.set(title=f"{n} new tokens", xlabel="batch")
    axes[0, 0].set_ylabel("tokens / s")
    # one legend for the figure: a panel may lack methods the sweep skipped at that length
    present = [m for m in ORDER if m in set(df.method)]
    handles = [plt.Line2D([], [], color=COLORS[m], marker="o", label=m) for m in present]
    fig.legend(handles=handles, loc="upper center", ncol=len(present), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 0.92))
    footer(fig, cond if cond is not None else df)
    return fig


def save_bench_figures(df, out, name):
    """The benchmark's figures next to its CSV: one ladder per (batch, length, dtype) cell, and for a
    sweep, tokens/s against batch per dtype."""
    for (b, n, d), g in df.groupby(["batch", "max_new_tokens", "dtype"]):
        if name == "ladder" or (n == 100 and b in (1, 32)):
            fig = ladder_bars(g)
            fig.savefig(os.path.join(out, f"{name}_b{b}_n{n}_{d}.png"), dpi=120)
            plt.close(fig)
    if name == "sweep":
        for d, g in df.groupby("dtype"):
            fig = sweep_lines(g)
            fig.savefig(os.path.join(out, f"sweep_tokens_per_s_{d}.png"), dpi=120)
            plt.close(fig)


# --- chapter 8 and the book's front page ---------------------------------------------------------------

DTYPE_COLORS = {"float32": "tab:blue", "bfloat16": "tab:orange", "float16": "tab:green"}


def ladder_overview(df, title=None):
    """Decode ms per step (median, whiskers: IQR) of every method on a log axis: one panel per batch size,
    one bar per dtype, our decoders above `model.generate`, each dtype's bandwidth floor a dashed line."""
    batches = sorted(df.batch.unique())
    dtypes = [d for d in DTYPE_COLORS if d in set(df.dtype)]
    methods = [m for m in ORDER if m in set(df.method)]
    height = 1.4 + len(batches) * (0.5 + 0.17 * len(methods) * len(dtypes))
    fig, axes = plt.subplots(len(batches), 1, figsize=(8, height), sharex=True, squeeze=False)
    h = 0.8 / len(dtypes)
    for ax, b in zip(axes[:, 0], batches):
        for j, d in enumerate(dtypes):
            g = df[(df.batch == b) & (df.dtype == d)].set_index("method").reindex(methods)
            y = np.arange(len(methods)) + (j - (len(dtypes) - 1) / 2) * h
            ms = g.ms_per_step
            err = None
            if "ms_per_step_q1" in g:
                err = [(ms - g.ms_per_step_q1).clip(lower=0), (g.ms_per_step_q3 - ms).clip(lower=0)]
            ax.barh(y, ms, height=h, color=DTYPE_COLORS[d], xerr=err, log=True,
                    error_kw={"lw": 0.8, "capsize": 2, "ecolor": "0.25"})
            for yi, v in zip(y, ms):
                if v == v:
                    ax.text(v * 1.12, yi, f"{v:.2f}" if v < 10 else f"{v:.1f}", va="center", fontsize=8)
            if "floor_ms_per_step" in g and g.floor_ms_per_step.notna().any():
                ax.axvline(g.floor_ms_per_step.min(), color=DTYPE_COLORS[d], ls="--", lw=1.2,
                           zorder=0.5)
        ax.set_yticks(range(len(methods)), [LABELS.get(m, m) for m in methods], fontsize=9)
        ax.set_ylim(len(methods) - 0.5, -0.5)
        ours = sum(not m.startswith("hf_") for m in methods)
        if 0 < ours < len(methods):
            ax.axhline(ours - 0.5, color="0.4", lw=0.8)
        ax.set_title(f"batch {b}", fontsize=10, loc="left")
        ax.grid(axis="y", visible=False)
    lo = np.nanmin([df.ms_per_step.min()] + ([df.floor_ms_per_step.min()] if "floor_ms_per_step" in df else []))
    axes[0, 0].set_xlim(lo / 2, df.ms_per_step.max() * 4)
    axes[0, 0].xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axes[-1, 0].set_xlabel("ms per decode step, log scale (bar: median; whiskers: interquartile range)",
                           fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=DTYPE_COLORS[d], label=d) for d in dtypes]
    if "floor_ms_per_step" in df and df.floor_ms_per_step.notna().any():
        handles += [plt.Line2D([], [], color=DTYPE_COLORS[d], ls="--", label=f"bandwidth floor, {d}")
                    for d in dtypes]
    r = df.iloc[0]
    fig.suptitle(title or f"GPT-2 {r.get('params_m', 0):.0f}M, prompt {r.prompt_len}, "
                 f"{r.max_new_tokens} new tokens: decode time per step", fontsize=11)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.38 / height))
    rounds = ", ".join(f"batch {b}: {int(g.repeats.iloc[0])}" for b, g in df.groupby("batch"))
    cond = {k: r.get(k) for k in ("gpu", "torch", "transformers")}
    cond["dtype"] = " and ".join(dtypes)
    footer(fig, cond, f"median of alternated rounds ({rounds})")
    fig.subplots_adjust(left=0.3, right=0.97, top=1 - 0.95 / height, bottom=0.7 / height, hspace=0.12)
    return fig


def sweep_tokens(df, methods=("compiled", "deferred", "interleaved", "hf_static"), new_tokens=100,
                 dtype="float32"):
    """Tokens per second against batch size (log-log) at one length and dtype, one line per method; the
    dotted line is what the first method would reach if a step cost the same at every batch size."""
    g = df[(df.max_new_tokens == new_tokens) & (df.dtype == dtype) & df.method.isin(methods)]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    present = [m for m in ORDER if m in set(g.method)]
    grid = sorted(g.batch.unique())
    for m in present:
        h = g[g.method == m].sort_values("batch")
        part = len(h) < len(grid)  # a method the sweep ran at a few batch sizes only: no line between
        label = LABELS.get(m, m) + (f" (batch {', '.join(map(str, h.batch))} only)" if part else "")
        ax.loglog(h.batch, h.tokens_per_s, "o" if part else "o-", color=COLORS[m], label=label)
    if present:
        h = g[g.method == present[0]].sort_values("batch")
        ax.loglog(h.batch, h.tokens_per_s.iloc[0] * h.batch / h.batch.iloc[0], ":", color="0.5",
                  label=f"{present[0]}, if a step cost the same at every batch")
    batches = sorted(g.batch.unique())
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("batch (rows generated together)", fontsize=9)
    ax.set_ylabel("tokens / s (all rows, whole call)", fontsize=9)
    ax.set_title(f"Tokens per second against batch: {dtype}, {new_tokens} new tokens", fontsize=10)
    ax.legend(fontsize=8)
    footer(fig, g if len(g) else {}, f"batch {', '.join(map(str, batches))}")
    fig.subplots_adjust(left=0.13, right=0.97, top=0.92, bottom=0.17)
    return fig


def cache_length_lines(df, cond=None, title=None):
    """Chapter 4: decode ms per step against the static cache's length L (`max_cache_len`), one line per
    batch (median, whiskers q1-q3), each with its bandwidth floor (weights + K/V of all L slots) dashed.
    `df`: rows with batch, max_cache_len, ms_per_step(_q1/_q3), floor_ms_per_step, method, new_tokens."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    fig, ax = plt.subplots(figsize=(7.6, 5.2))
    for (batch, g), color in zip(df.groupby("batch"), plt.get_cmap("tab10").colors):
        g = g.sort_values("max_cache_len")
        err = [g.ms_per_step - g.ms_per_step_q1, g.ms_per_step_q3 - g.ms_per_step]
        ax.errorbar(g.max_cache_len, g.ms_per_step, yerr=err, fmt="o-", color=color, capsize=3,
                    label=f"{g.method.iloc[0]} ({g.decode_attention.iloc[0]}), batch {batch}")
        if "floor_ms_per_step" in g and g.floor_ms_per_step.notna().any():
            ax.plot(g.max_cache_len, g.floor_ms_per_step, "--", color=color, alpha=0.7,
                    label=f"bandwidth floor, batch {batch}")
    lengths = sorted(df.max_cache_len.unique())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(v) for v in lengths])
    ax.tick_params(axis="x", which="minor", bottom=False)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    r = df.iloc[0]
    batches = " and ".join(str(b) for b in sorted(df.batch.unique()))
    ax.set(xlabel="cache length L (slots every step attends over)", ylabel="decode ms per step",
           title=title or f"Step time against cache length ({r.get('dtype', '')}, batch {batches})")
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    footer(fig, cond if cond is not None else df, f"{r.new_tokens} new tokens, whiskers q1-q3")
    fig.subplots_adjust(bottom=0.3)  # room for the legend under the axes, then the footer
    return fig


# --- chapters 6 and 7: decode time per step ------------------------------------------------------------

def step_bars(df, title, cond=None, ax=None, log="auto", note=True):
    """Decode ms per step of each row of `df` (a method each): bar = median, whiskers = q1-q3 of the
    per-round values, the bandwidth floor dashed. A log axis when the bars span more than 5x ("auto").
    `note=False` leaves the footer to the caller (one footer for a figure of several panels)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 4))
    d = df.reset_index(drop=True)
    ms = d.ms_per_step.to_numpy(float)
    err = [(ms - d.ms_per_step_q1).clip(lower=0), (d.ms_per_step_q3 - ms).clip(lower=0)]
    x = np.arange(len(d))
    ax.bar(x, ms, yerr=err, color=[COLORS.get(m, "0.5") for m in d.method], capsize=3)
    top = np.fmax(ms, d.ms_per_step_q3.to_numpy(float))  # the label sits above the whisker
    for i, (v, y) in enumerate(zip(ms, top)):  # 3 points above the whisker's cap
        ax.annotate(f"{v:.3f}" if v < 1 else f"{v:.2f}", (i, y), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, list(d.method), rotation=20, fontsize=8)
    if "floor_ms_per_step" in d and d.floor_ms_per_step.notna().any():
        ax.axhline(d.floor_ms_per_step.min(), color="k", ls="--", lw=1, label="bandwidth floor")
        ax.legend(fontsize=8, loc="upper right")
    if log is True or (log == "auto" and np.nanmax(ms) > 5 * np.nanmin(ms)):
        ax.set_yscale("log")
        ax.set_ylim(top=np.nanmax(top) * 2.5)  # room above the labels for the legend
    else:
        ax.set_ylim(0, np.nanmax(top) * 1.3)
    ax.set_ylabel("decode ms per step", fontsize=9)
    ax.set_title(title, fontsize=10)
    if note:
        tokens = f"{d.max_new_tokens.iloc[0]} new tokens, " if "max_new_tokens" in d else ""
        footer(fig, cond if cond is not None else d, f"{tokens}whiskers q1-q3")
    return fig


# --- chapter 1: growth against length ------------------------------------------------------------------

def loglog_growth(df, x, series, title, xlabel, ylabel, cond=None, extra="", slopes=(1, 2),
                  anchor=None, ax=None):
    """Measured series against `x` on log-log axes, where a power law is a straight line. `series`
    maps a legend label to a column of `df`, or to (column, fmt) or (column, fmt, color); a column
    with `<column>_q1` and `<column>_q3` beside it gets q1-q3 error bars, an all-NaN column is left
    out. Grey reference lines of the given `slopes` pass through the last point of the `anchor`
    series (default: the first one drawn)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.5, 4.2))
    d = df.sort_values(x)
    xs = d[x].to_numpy(float)
    drawn = []
    for label, spec in series.items():
        spec = [spec] if isinstance(spec, str) else list(spec)
        col, fmt, color = spec + ["o-", None][len(spec) - 1:]  # defaults for what is left out
        y = d[col].to_numpy(float)
        if np.isnan(y).all():
            continue
        err = None
        if f"{col}_q1" in d and f"{col}_q3" in d:
            err = [(y - d[f"{col}_q1"].to_numpy(float)).clip(0),
                   (d[f"{col}_q3"].to_numpy(float) - y).clip(0)]
        ax.errorbar(xs, y, yerr=err, fmt=fmt, color=color, capsize=3, ms=4, label=label)
        drawn.append(label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    if drawn:
        ref = anchor if anchor in drawn else drawn[0]
        spec = series[ref]
        y = d[spec if isinstance(spec, str) else spec[0]].to_numpy(float)
        for k, ls in zip(slopes, ["--", ":", "-."]):
            ax.plot(xs, y[-1] * (xs / xs[-1]) ** k, ls, color="0.55", lw=1, label=f"slope {k}")
    plain_log_labels(ax, xs)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    footer(fig, cond if cond is not None else df, extra)
    return fig
