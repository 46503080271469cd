"""Figures. Every figure carries its conditions (GPU, versions, dtype, workload) in a footer."""
import os

import matplotlib

if os.environ.get("MPLBACKEND") is None and not os.environ.get("DISPLAY") and "ipykernel" not in os.sys.modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .measure import fit_exponent  # noqa: E402

ORDER = ["naive", "kv_cache", "static_cache", "compiled", "deferred", "interleaved", "hf_dynamic", "hf_static"]
COLORS = dict(zip(ORDER, plt.get_cmap("tab10").colors))


def footer(fig, cond, extra=""):
    """Write the conditions under a figure: GPU, torch, transformers, dtype, then `extra`."""
    if hasattr(cond, "iloc"):  # a DataFrame: take its first row
        cond = cond.iloc[0].to_dict()
    parts = [str(cond.get("gpu", "")), f"torch {cond.get('torch', '')}",
             f"transformers {cond.get('transformers', '')}", str(cond.get("dtype", ""))]
    if isinstance(cond.get("alloc_conf"), str) and cond["alloc_conf"]:  # a CSV's empty cell reads back as NaN
        parts.append(f"PYTORCH_ALLOC_CONF={cond['alloc_conf']}")
    if cond.get("repeats") == cond.get("repeats") and cond.get("repeats") is not None:
        parts.append(f"prompt {cond.get('prompt_len')}, median of {cond['repeats']} runs after a warm-up")
    fig.text(0.01, 0.005, " | ".join(p for p in parts if p) + (f" | {extra}" if extra else ""),
             fontsize=7, color="0.35", ha="left", va="bottom")
    fig.subplots_adjust(bottom=0.2)
    return fig


def scaling(df, x="new_tokens", y="median_s", by="method", cond=None, ax=None):
    """Time against length on log-log axes, one line per method, with the fitted exponent in the legend
    (fitted on the longer half of the lengths)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.5, 4.2))
    for name, g in df.groupby(by, sort=False):
        g = g.sort_values(x)
        tail = g[g[x] >= g[x].median()]
        k = fit_exponent(tail[x], tail[y]) if len(tail) >= 2 else float("nan")
        ax.loglog(g[x], g[y], "o-", color=COLORS.get(name), label=f"{name}: time ~ N^{k:.2f}")
    xs = np.array(sorted(df[x].unique()), float)
    y0 = df[y].min()
    ax.loglog(xs, y0 * (xs / xs[0]) ** 2, ":", color="0.6", label="slope 2")
    ax.loglog(xs, y0 * (xs / xs[0]), "--", color="0.6", label="slope 1")
    ax.set(xlabel="new tokens N", ylabel="seconds per generate call", title="Time against length")
    ax.legend(fontsize=8)
    footer(fig, cond if cond is not None else df, f"batch {df['batch'].iloc[0]}, prompt {df['prompt_len'].iloc[0]}")
    return fig


def ladder_bars(df, cond=None, ax=None, title=None):
    """ms per step for each method (median, with min-max whiskers), the bandwidth floor as a line."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 4))
    d = df.set_index("method").reindex([m for m in ORDER if m in set(df.method)])
    ms = d.ms_per_step
    lo = ms - d.min_s / d.new_tokens * 1e3
    hi = d.max_s / d.new_tokens * 1e3 - ms
    ax.bar(d.index, ms, yerr=[lo.clip(lower=0), hi.clip(lower=0)], color=[COLORS[m] for m in d.index], capsize=3)
    for i, v in enumerate(ms):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    if "floor_ms_per_step" in d:
        ax.axhline(d.floor_ms_per_step.min(), color="k", ls="--", lw=1, label="bandwidth floor")
        ax.legend(fontsize=8)
    ax.set(ylabel="ms per step (one token per row)",
           title=title or f"batch {d.batch.iloc[0]}, {d.max_new_tokens.iloc[0]} new tokens")
    ax.tick_params(axis="x", rotation=30)
    footer(fig, cond if cond is not None else df, f"median of {d.repeats.iloc[0]} runs, whiskers min-max")
    return fig


def memory_timeline(timelines, cond=None, title="Allocated vs reserved over the decode"):
    """`timelines`: {label: DataFrame(event, allocated, reserved)} from `measure.allocator_timeline`."""
    fig, axes = plt.subplots(1, len(timelines), figsize=(5.5 * len(timelines), 3.8), squeeze=False)
    for ax, (label, t) in zip(axes[0], timelines.items()):
        ax.plot(t.event, t.reserved / 2**20, label="reserved", color="tab:red")
        ax.plot(t.event, t.allocated / 2**20, label="allocated", color="tab:blue")
        ax.fill_between(t.event, t.allocated / 2**20, t.reserved / 2**20, color="tab:red", alpha=0.15,
                        label="reserved - allocated")
        ax.set(title=label, xlabel="allocator event", ylabel="MiB")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    footer(fig, cond or {})
    return fig


def gpu_timeline(traces, cond=None, window_us=None, title="GPU timeline (like an Nsight Systems row)"):
    """`traces`: {label: intervals DataFrame from `measure.profile_decode`}. One row per label and stream;
    a bar per kernel or copy; white space is the GPU idling. `window_us` zooms to the first microseconds."""
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 1.3 + 1.0 * len(traces)), squeeze=False)
    for ax, (label, iv) in zip(axes[:, 0], traces.items()):
        t0 = iv.start_us.min() if len(iv) else 0
        streams = sorted(iv.stream.unique(), key=str)
        for row, s in enumerate(streams):
            g = iv[iv.stream == s]
            colors = ["tab:orange" if c != "kernel" else "tab:green" for c in g.cat]
            ax.broken_barh(list(zip(g.start_us - t0, g.end_us - g.start_us)), (row, 0.8), facecolors=colors)
        ax.set_yticks([r + 0.4 for r in range(len(streams))], [f"stream {s}" for s in streams], fontsize=7)
        ax.set_title(label, fontsize=9, loc="left")
        if window_us:
            ax.set_xlim(0, window_us)
    axes[-1, 0].set_xlabel("µs (green: kernels, orange: copies)")
    fig.suptitle(title)
    footer(fig, cond or {})
    fig.tight_layout(rect=(0, 0.05, 1, 1))
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
