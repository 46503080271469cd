"""Issue 14: what a kernel boundary costs the fused step, without its weights. Each fused kernel
waits for the one ahead, reads its input from L2, leaves partial sums, counts itself in, and the
last program of a tile adds the partials: about 5 us a kernel at batch 1, for 1-2 us of bytes.
This probe times that skeleton alone, in one CUDA graph of 50 or 100 kernels (the slope: us per
kernel), and against it phases inside one persistent kernel (one program per SM, a grid-wide
barrier between phases: the design of a "megakernel"), which pass x along without partial sums:

  empty      one program: wait for the kernel ahead, y = x + 1 over 768 values
  handoff    the GEMV's skeleton: tiles x splits programs, each reads its 64 values of x (L2),
             stores a partial sum, counts itself in (atomic); the last of a tile's splits reads
             the tile's partials and writes its 64 values of y = x + 1
  barrier    one kernel, one program per SM, 50 or 100 phases: read its share of x (8 values
             on 132 SMs), write y = x + 1,
             then a grid-wide barrier (an atomic count and a spin), x and y swapped
  whole      the skeleton of a GEMV that does not split K (the step's at batch 1): each of
             144 programs reads all of x (L2) and writes its columns of y = x + 1; with PDL
             it waits for the kernel ahead to finish (gdc_wait)
  flag       the same, but each kernel waits for a count instead: every program of the
             kernel ahead adds 1 once its columns are stored (release), and the programs of
             this one spin until the count reaches the grid's size (acquire), then let the
             kernel after launch. No wait for the kernel ahead to exit and flush

each with programmatic dependent launches (PDL) and without (the barrier: one launch). Every chain's
result is checked (x0 + number of kernels or phases). GPU only (the barrier spins: Triton's CPU
interpreter runs one program at a time).
Usage: python tools/probe_chain.py OUT_CSV"""
import statistics
import sys

import pandas as pd
import torch
import triton
import triton.language as tl

from fastgen_lib import fused

N = 768  # GPT-2's width: x and y, float32


@triton.jit
def _handoff_kernel(x_ptr, y_ptr, part_ptr, lock_ptr, N, SPLIT: tl.constexpr,
                    BLOCK: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0)
    s = tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    ks = (s * BLOCK + tl.arange(0, BLOCK)) % N                   # this split's values of x
    partial = tl.sum(tl.load(x_ptr + ks), axis=0)
    tl.store(part_ptr + t * SPLIT + s, partial)
    last = True
    if SPLIT > 1:
        tl.debug_barrier()
        last = tl.atomic_add(lock_ptr + t, 1, sem="acq_rel") == SPLIT - 1
    if last:
        total = 0.0
        for i in tl.static_range(SPLIT):  # in order, from L2: written by other programs
            total += tl.load(part_ptr + t * SPLIT + i, cache_modifier=".cg")
        cols = t * BLOCK + tl.arange(0, BLOCK)
        ok = cols < N
        tl.store(y_ptr + cols, tl.load(x_ptr + cols, mask=ok) + 1.0, mask=ok)
        tl.store(part_ptr + t * SPLIT, total)  # keeps the partials' reads
        if SPLIT > 1:
            tl.atomic_xchg(lock_ptr + t, 0)


@triton.jit
def _barrier_kernel(buf_ptr, cnt_ptr, N, PHASES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    cols = (pid * BLOCK + tl.arange(0, BLOCK)) % (2 * N)
    ok = (pid * BLOCK + tl.arange(0, BLOCK)) < N
    for ph in range(PHASES):
        src = buf_ptr + (ph % 2) * N
        dst = buf_ptr + (1 - ph % 2) * N
        x = tl.load(src + cols, mask=ok, other=0.0, cache_modifier=".cg")
        tl.store(dst + cols, x + 1.0, mask=ok)
        tl.debug_barrier()  # every thread's store is issued before the count moves
        seen = tl.atomic_add(cnt_ptr, 1, sem="acq_rel") + 1
        while seen < (ph + 1) * P:
            seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
    tl.debug_barrier()
    if tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel") == P - 1:  # the last one out resets
        tl.atomic_xchg(cnt_ptr, 0)
        tl.atomic_xchg(cnt_ptr + 1, 0)


@triton.jit
def _whole_kernel(x_ptr, y_ptr, cnt_ptr, N, KID, COLS: tl.constexpr, BLOCK: tl.constexpr,
                  FLAG: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0)
    P = tl.num_programs(0)
    if FLAG:  # the count of the kernel ahead (the first kernel: none); no gdc_wait at all
        if KID > 0:
            seen = tl.load(cnt_ptr + KID - 1, volatile=True)
            while seen < P:
                seen = tl.load(cnt_ptr + KID - 1, volatile=True)
            tl.atomic_add(cnt_ptr + KID - 1, 0, sem="acquire")  # its stores are seen after
    elif PDL:
        tl.extra.cuda.gdc_wait()
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    xs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + xs, mask=xs < N, other=0.0, cache_modifier=".cg")  # all of x
    cols = t * COLS + tl.arange(0, COLS)
    ok = cols < N
    y = tl.load(x_ptr + cols, mask=ok, other=0.0, cache_modifier=".cg") + 1.0
    tl.store(y_ptr + cols, y + 0.0 * tl.sum(x, axis=0), mask=ok)
    if FLAG:
        tl.debug_barrier()  # every thread's store is issued before the count moves
        tl.atomic_add(cnt_ptr + KID, 1, sem="release")


def whole_chain(n, programs, flag, dev):
    """`n` kernels of `programs` programs, each reading all of x; flag: counts, not PDL waits.
    The counts are zeroed at the start of each run (one memset). Off CUDA (Triton's
    interpreter: one kernel after the other) without PDL."""
    pdl = dev.type == "cuda"
    x = torch.zeros(N, device=dev)
    y = torch.zeros(N, device=dev)
    cnt = torch.zeros(n, dtype=torch.int32, device=dev)
    cols = triton.next_power_of_2(triton.cdiv(N, programs))

    def run():
        cnt.zero_()
        a, b = x, y
        for i in range(n):
            _whole_kernel[(programs,)](a, b, cnt, N, i, COLS=cols,
                                       BLOCK=triton.next_power_of_2(N), FLAG=flag,
                                       PDL=pdl, **({"launch_pdl": True} if pdl else {}))
            a, b = b, a
    return run, x, y


def handoff_chain(n, tiles, split, pdl, dev):
    """A function launching `n` hand-off kernels, x and y swapped each time; returns (fn, x, y)."""
    x = torch.zeros(N, device=dev)
    y = torch.zeros(N, device=dev)
    part = torch.zeros(tiles * split, device=dev)
    locks = torch.zeros(tiles, dtype=torch.int32, device=dev)
    block = 64 if tiles > 1 else triton.next_power_of_2(N)

    def run():
        a, b = x, y
        for _ in range(n):
            _handoff_kernel[(tiles, split)](a, b, part, locks, N, SPLIT=split, BLOCK=block,
                                            PDL=pdl, **({"launch_pdl": True} if pdl else {}))
            a, b = b, a
    return run, x, y


def barrier_chain(n, dev):
    programs = fused.sm_count(dev)
    buf = torch.zeros(2 * N, device=dev)
    cnt = torch.zeros(2, dtype=torch.int32, device=dev)
    block = triton.next_power_of_2(triton.cdiv(N, programs))

    def run():
        _barrier_kernel[(programs,)](buf, cnt, N, PHASES=n, BLOCK=block)
    return run, buf[:N], buf[N:]


def time_graph(make, n, repeats=10, replays=20):
    """(us per replay of the graph of `make(n)`, its output's check)."""
    run, x, y = make(n)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # compile, warm
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    x.zero_()
    y.zero_()
    g.replay()
    torch.cuda.synchronize()
    got = (y if n % 2 else x)
    ok = bool(torch.all(got == n))
    times = []
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / replays)
    return statistics.median(times[1:]), ok


def main(out):
    dev = torch.device("cuda")
    cases = {
        ("empty", 1, 1): lambda pdl: lambda n: handoff_chain(n, 1, 1, pdl, dev),
        ("handoff", 12, 12): lambda pdl: lambda n: handoff_chain(n, 12, 12, pdl, dev),
        ("handoff", 48, 6): lambda pdl: lambda n: handoff_chain(n, 48, 6, pdl, dev),
    }
    rows = []
    for _round in range(2):  # A B A B: every case twice, the later kept
        rows = []
        for (name, tiles, split), make in cases.items():
            for pdl in (False, True):
                t50, ok50 = time_graph(make(pdl), 50)
                t100, ok100 = time_graph(make(pdl), 100)
                rows.append({"chain": name, "programs": tiles * split, "pdl": pdl,
                             "us_per_kernel": (t100 - t50) / 50, "us_50": t50, "us_100": t100,
                             "correct": ok50 and ok100})
        for programs in (144, 288):
            for flag in (False, True):
                t50, ok50 = time_graph(lambda n: whole_chain(n, programs, flag, dev), 50)
                t100, ok100 = time_graph(lambda n: whole_chain(n, programs, flag, dev), 100)
                rows.append({"chain": "flag" if flag else "whole", "programs": programs,
                             "pdl": True, "us_per_kernel": (t100 - t50) / 50, "us_50": t50,
                             "us_100": t100, "correct": ok50 and ok100})
        t50, ok50 = time_graph(lambda n: barrier_chain(n, dev), 50)
        t100, ok100 = time_graph(lambda n: barrier_chain(n, dev), 100)
        rows.append({"chain": "barrier", "programs": fused.sm_count(dev), "pdl": False,
                     "us_per_kernel": (t100 - t50) / 50,
                     "us_50": t50, "us_100": t100, "correct": ok50 and ok100})
    df = pd.DataFrame(rows)
    df.to_csv(out, index=False)
    print(df.round(3).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1])
