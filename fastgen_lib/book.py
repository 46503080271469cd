"""The setup cell of every chapter, after its install cell:
`settings = fastgen_lib.book.setup_book()`. Seeds, display widths, plot style, and one line saying
where this runs (device, versions, real or random weights)."""
import os
import random
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Settings:
    size: str          # "124m" on a GPU, "tiny" on a CPU (FASTGEN_SIZE overrides)
    device: str        # "cuda" or "cpu"
    smoke: bool        # FASTGEN_SMOKE=1: CI's quick run, few tokens
    gpu: bool

    def tokens(self, n):
        """A token count for this run: `n` normally, at most 8 in a smoke run."""
        return min(n, 8) if self.smoke else n

    def pick(self, full, smoke):
        """`full` normally, `smoke` in a smoke run (lists of lengths, batch sizes, repeats...)."""
        return smoke if self.smoke else full


def setup_book(seed=0):
    import matplotlib.pyplot as plt
    import pandas as pd
    import transformers

    from .models import default_size
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    pd.set_option("display.width", 120)
    pd.set_option("display.precision", 3)
    plt.rcParams.update({"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3})
    gpu = torch.cuda.is_available()
    s = Settings(size=default_size(), device="cuda" if gpu else "cpu",
                 smoke=os.environ.get("FASTGEN_SMOKE") == "1", gpu=gpu)
    where = torch.cuda.get_device_name() if gpu else "CPU (no CUDA GPU: tiny model, CPU timings)"
    print(f"{where} | torch {torch.__version__} | transformers {transformers.__version__} | "
          f"model size {s.size}" + (" | SMOKE RUN (few tokens)" if s.smoke else ""))
    return s


def record(name, value):
    """Keep a number a chapter's lesson rests on in the notebook's outputs, where the book's tests read
    it (tests/test_book.py) and the page does not show it: the format of myst-nb's `glue(...,
    display=False)`, written here so that running a chapter needs no myst-nb."""
    from IPython.display import display
    display({"application/papermill.record/text/plain": repr(value)}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}})


def source(obj, start=None, stop=None):
    """The source of library object `obj` (a Triton kernel's too), or only its lines from the first
    that contains `start` up to the first after it that contains `stop` (not included), dedented.
    What a chapter prints with `show` is the library's own code: tests/test_book.py checks it."""
    import inspect
    import textwrap
    lines = inspect.getsource(getattr(obj, "fn", obj)).splitlines()
    if start is not None:
        i = next(k for k, line in enumerate(lines) if start in line)
        j = next((k for k in range(i + 1, len(lines)) if stop is not None and stop in lines[k]),
                 len(lines))
        lines = lines[i:j]
    return textwrap.dedent("\n".join(lines))


def show(obj, start=None, stop=None):
    """Print `source(obj, start, stop)`."""
    print(source(obj, start, stop))


def results_path(name):
    """The committed result `results/<name>` (a file or a folder) of a clone of the book's repository,
    found from the working directory (a chapter runs in notebooks/, the install cell moves to the
    clone's root) or from the package's folder (an editable install). Installing the library alone
    leaves results/ out: then a FileNotFoundError says so and how to get it."""
    from pathlib import Path
    here = Path.cwd()
    for root in (here, here.parent, Path(__file__).resolve().parents[1]):
        if (root / "results" / name).exists():
            return root / "results" / name
    raise FileNotFoundError(
        f"results/{name} is not here: the book's saved results come with a clone of its "
        "repository, not with the installed library. Clone the repository (the first cell of "
        "every chapter does it where fastgen_lib is not importable) and run the chapter there.")
