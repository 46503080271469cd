"""The command line: `python -m fastgen_lib {check,generate,bench,memory,profile} --help`."""
import argparse
import json
import os
import sys
import time

import torch


def cmd_check(args):
    """One line: is this machine ready for the book's GPU chapters?"""
    from . import models
    problems, notes = [], []
    if not torch.cuda.is_available():
        problems.append("no CUDA GPU (chapters 1-4 still run on the CPU with FASTGEN_SIZE=tiny)")
    else:
        notes.append(torch.cuda.get_device_name())
        try:
            x = torch.ones(8, device="cuda")
            torch.compile(lambda t: t * 2 + 1)(x)
            torch.cuda.synchronize()
        except Exception as exc:  # torch.compile needs Triton and a C compiler
            problems.append(f"torch.compile fails ({type(exc).__name__}: {str(exc)[:80]})")
    try:
        models.load_tokenizer()
    except Exception as exc:
        problems.append(f"tokenizer files: {exc}")
    import transformers
    notes += [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    if transformers.__version__ != "5.17.0":
        notes.append("(the book was built with transformers 5.17.0)")
    line = ("READY: " if not problems else "NOT READY: ") + "; ".join(problems + notes)
    print(line)
    return 0 if not problems else 1


def cmd_generate(args):
    from . import decoders, models
    tok = models.load_tokenizer()
    model = models.load_model(args.size, dtype=getattr(torch, args.dtype), weights=args.weights)
    enc = tok(args.prompt, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"].to(model.device), enc["attention_mask"].to(model.device)
    kw = dict(decoder=args.decoder, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
              temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    t0 = time.perf_counter()
    decoders.generate(model, ids, mask, **kw)  # first call: compiles and captures where the decoder does
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = decoders.generate(model, ids, mask, **kw)
    sync()
    dt = time.perf_counter() - t0
    n = out.shape[1] - ids.shape[1]
    for text in tok.batch_decode(out, skip_special_tokens=True):
        print(text)
        print("-" * 40)
    print(f"{args.decoder} on {model.device} ({model.fastgen_weights} weights): {n} tokens in {dt * 1e3:.1f} ms = "
          f"{dt / n * 1e3:.2f} ms/token (first call, with compilation: {first:.1f} s)")
    return 0


def cmd_bench(args):
    import pandas as pd

    from . import bench, measure, plots
    from .models import default_size, load_model
    methods = args.methods or bench.METHODS
    for m in methods:
        if m not in bench.METHODS:
            sys.exit(f"unknown method {m!r}: choose from {', '.join(bench.METHODS)}")
    size = args.size or default_size()
    if args.merge:  # no measuring: CSVs from earlier runs (e.g. a sweep split over GPUs) -> one CSV + figures
        missing = [f for f in args.merge if not os.path.exists(f)]
        if missing or not args.out:
            sys.exit(f"--merge needs existing CSVs and --out (missing: {', '.join(missing) or 'none'})")
        frames = [pd.read_csv(f) for f in args.merge]
        joined = pd.concat(frames)
        on_gpu = not joined.gpu.str.startswith("CPU").any()
        args.sweep, bw = any("sweep" in os.path.basename(f) for f in args.merge), None
        size = "124m" if on_gpu and joined.params_m.min() > 100 else "tiny"
    else:
        print(json.dumps(measure.conditions()), f"size={size}", " ".join(sys.argv), sep="\n")
        bw, frames = measure.measure_bandwidth(), []
    for dtype in [] if args.merge else args.dtype:
        model = load_model(size, dtype=getattr(torch, dtype))
        if not args.sweep:
            frames += [bench.ladder(model, b, args.prompt_len, n, methods, args.repeats, bw)
                       for b in args.batch for n in args.new_tokens]
            continue
        # float32 is the article's setting and gets the whole grid; other dtypes the 100-token column
        ns = args.new_tokens if dtype == args.dtype[0] else [n for n in args.new_tokens if n == 100]
        partial = None
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            partial = os.path.join(args.out, f"sweep_partial_{dtype}.csv")
        if ns:
            frames.append(bench.sweep(model, args.batch, ns, methods, args.repeats, args.prompt_len, bw,
                                      skip=bench.default_skip, checkpoint=partial))
    df = pd.concat(frames, ignore_index=True)
    if bw:
        print(f"measured device-to-device bandwidth: {bw / 1e12:.2f} TB/s")
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.3g}".format):
        for (b, n, d), g in df.groupby(["batch", "max_new_tokens", "dtype"]):
            print(f"\nbatch {b}, prompt {g.prompt_len.iloc[0]}, {n} new tokens, {d}:")
            print(bench.summary(g).drop(columns=["batch"]).to_string(index=False))
        print("\nclaims:" + ("" if (torch.cuda.is_available() or args.merge) and size == "124m" else
                             f" (stated for GPT-2 124M on a GPU; with the {size} model on this "
                             f"{'GPU' if torch.cuda.is_available() else 'CPU'} they only show that the code runs)"))
        print(bench.claims(df).to_string(index=False))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = "sweep" if args.sweep else "ladder"
        df.to_csv(os.path.join(args.out, f"{name}.csv"), index=False)
        bench.claims(df).to_csv(os.path.join(args.out, f"{name}_claims.csv"), index=False)
        plots.save_bench_figures(df, args.out, name)
        print(f"wrote {args.out}/{name}.csv and figures")
    bad = df[~df.tokens_match]
    if len(bad):
        print(f"\nWARNING: {len(bad)} rows differ from model.generate:\n{bad[['method', 'batch', 'divergence']]}")
    return 0


def cmd_memory(args):
    """Fragmentation of one decoder in this process (run it under a PYTORCH_ALLOC_CONF of your choice)."""
    from . import measure
    from .decoders import generate
    from .models import load_model, make_batch
    model = load_model(args.size, dtype=getattr(torch, args.dtype[0]))
    ids, mask = make_batch(args.batch[0], args.prompt_len, device=model.device)
    call = lambda: generate(model, ids, mask, decoder=args.decoder, max_new_tokens=args.new_tokens[0])  # noqa
    call()  # warm-up: compile and capture outside the measured run
    stats, _ = measure.memory_run(call, history=False)
    times, _ = measure.time_call(call, repeats=args.repeats, warmup=0)
    stats.update(decoder=args.decoder, batch=args.batch[0], new_tokens=args.new_tokens[0],
                 median_s=sorted(times)[len(times) // 2], min_s=min(times), max_s=max(times),
                 env_alloc_conf=os.environ.get("PYTORCH_ALLOC_CONF", ""))
    print(json.dumps(stats) if args.json else stats)
    return 0


def cmd_profile(args):
    from . import measure
    from .decoders import generate
    from .models import load_model, make_batch
    model = load_model(args.size, dtype=getattr(torch, args.dtype[0]))
    ids, mask = make_batch(args.batch[0], args.prompt_len, device=model.device)
    call = lambda: generate(model, ids, mask, decoder=args.decoder, max_new_tokens=args.new_tokens[0])  # noqa
    call()
    iv = measure.profile_decode(call, path=args.trace)
    gaps = measure.gpu_gaps(iv, steps=args.new_tokens[0])
    gaps.pop("gaps_us")
    print(json.dumps({"decoder": args.decoder, **gaps, **measure.between_steps(iv)}))
    if args.kernels:
        print(measure.top_kernels(iv).to_string())
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fastgen_lib", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    from .decoders import DECODERS

    def common(sp, batch=(1,), new_tokens=(100,)):
        sp.add_argument("--size", choices=["124m", "tiny"], default=None,
                        help="model size (default: FASTGEN_SIZE, else 124m on CUDA and tiny on a CPU)")
        sp.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"])
        sp.add_argument("--batch", type=int, nargs="+", default=None, help=f"default: {' '.join(map(str, batch))}")
        sp.add_argument("--new-tokens", type=int, nargs="+", default=None,
                        help=f"default: {' '.join(map(str, new_tokens))}")
        sp.set_defaults(default_batch=list(batch), default_new_tokens=list(new_tokens))
        sp.add_argument("--prompt-len", type=int, default=16)
        sp.add_argument("--repeats", type=int, default=5)

    sub.add_parser("check", help="one line: is this machine ready?")
    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("--prompt", nargs="+", default=["The quick brown fox"])
    g.add_argument("--decoder", choices=list(DECODERS), default="interleaved")
    g.add_argument("--max-new-tokens", type=int, default=40)
    g.add_argument("--size", choices=["124m", "tiny"], default=None)
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--weights", default="auto", choices=["auto", "pretrained", "random"])
    g.add_argument("--sample", action="store_true")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    b = sub.add_parser("bench", help="the ladder of decoders beside model.generate")
    common(b, batch=(1, 32), new_tokens=(100,))
    b.add_argument("--methods", nargs="+", default=None, help="default: all decoders, hf_dynamic, hf_static")
    b.add_argument("--sweep", action="store_true",
                   help="the grid: batch x new tokens for the first dtype, the 100-token column for the others "
                        "(eager methods only where cheap: see bench.default_skip)")
    b.add_argument("--out", default=None, help="folder for the CSV and figures (e.g. results/h200)")
    b.add_argument("--merge", nargs="+", default=None, metavar="CSV",
                   help="measure nothing: join these ladder/sweep CSVs into one, with its claims and figures, in --out")
    m = sub.add_parser("memory", help="fragmentation of one decoder in this process")
    common(m, batch=(8,), new_tokens=(200,))
    m.add_argument("--decoder", choices=list(DECODERS), default="kv_cache")
    m.add_argument("--json", action="store_true")
    pr = sub.add_parser("profile", help="GPU idle time of one decoder from a profiler trace")
    common(pr, batch=(1,), new_tokens=(50,))
    pr.add_argument("--decoder", choices=list(DECODERS), default="interleaved")
    pr.add_argument("--trace", default=None, help="where to keep the Chrome trace")
    pr.add_argument("--kernels", action="store_true", help="also print the kernels that take the time")
    args = p.parse_args(argv)
    if hasattr(args, "default_batch"):
        sweep = getattr(args, "sweep", False)
        args.batch = args.batch or ([1, 4, 8, 16, 32] if sweep else args.default_batch)
        args.new_tokens = args.new_tokens or ([50, 100, 200, 400] if sweep else args.default_new_tokens)
    return {"check": cmd_check, "generate": cmd_generate, "bench": cmd_bench, "memory": cmd_memory,
            "profile": cmd_profile}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
