"""Execute the chapter notebooks.

    python scripts/run_notebooks.py --smoke            # CI: tiny model, few tokens, into a temp dir
    python scripts/run_notebooks.py --inplace          # GPU host: overwrite notebooks/ with real outputs

The smoke run never touches the committed notebooks (which carry the outputs of an H200 run, or none
and an "Outputs pending" notice)."""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
    p.add_argument("--smoke", action="store_true", help="FASTGEN_SMOKE=1 FASTGEN_SIZE=tiny, outputs to a temp dir")
    p.add_argument("--inplace", action="store_true", help="write the executed notebooks back")
    p.add_argument("--out", default=None, help="folder for executed copies (default: a temp dir)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    p.add_argument("--allow-errors", action="store_true",
                   help="run every cell even after one fails (errors are listed, the exit code is 1)")
    args = p.parse_args()
    if args.smoke and args.inplace:
        sys.exit("--smoke never overwrites the committed notebooks; drop --inplace")
    if args.smoke:  # one thread: a tiny model gains nothing from more, and a shared CPU loses a lot
        os.environ.update(FASTGEN_SMOKE="1", FASTGEN_SIZE="tiny", OMP_NUM_THREADS="1")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    paths = [Path(n) for n in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    out = Path(args.out or tempfile.mkdtemp(prefix="fastgen-nb-"))
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        try:
            NotebookClient(nb, timeout=args.timeout, kernel_name="python3", store_widget_state=True,
                           allow_errors=args.allow_errors,
                           resources={"metadata": {"path": str(path.parent)}}).execute()
            errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue', '')[:200]}" for i, c in enumerate(nb.cells)
                      for o in c.get("outputs", []) if o.get("output_type") == "error"]
            status = "ok" if not errors else "ERRORS: " + " | ".join(errors)
            if errors:
                failed.append(path.name)
        except Exception as exc:  # keep going: report every notebook
            status = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[-1][:300] if str(exc) else ''}"
            failed.append(path.name)
        target = path if args.inplace and (args.allow_errors or failed[-1:] != [path.name]) else out / path.name
        nbformat.write(nb, target)
        print(f"{path.name}: {status} ({time.perf_counter() - t0:.0f} s) -> {target}", flush=True)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
