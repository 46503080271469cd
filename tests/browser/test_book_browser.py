"""The rendered book in headless Chromium: every page loads, no broken image, no broken internal link,
saved widget state intact. Run: python -m pytest -m browser tests/browser -q

The real book is built strict (`jupyter-book build . -W -n --keep-going`) into `_build/html`, unless
FASTGEN_BOOK_BUILT=1 and `_build/html` (with its index.html) was built after the last change to a source,
in which case it is reused.
FASTGEN_BOOK_ROOT points the test at another book. Screenshots land in artifacts/screenshots/ (git-ignored).
A tiny book built in a temporary folder checks the machinery itself, and a broken hand-made site proves
that the checker reports what it should.
"""
import base64
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import nbformat
import pytest

from browser_check import WIDGET_STATE, WIDGET_VIEW, check_site, pages_from_toc, serve

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
BOOK_ROOT = Path(os.environ.get("FASTGEN_BOOK_ROOT", ROOT)).resolve()
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
SOURCE_SUFFIXES = {".md", ".ipynb", ".yml", ".yaml", ".png", ".svg", ".jpg", ".bib", ".css", ".py"}
NOT_SOURCES = {"_build", ".git", "student", "artifacts", ".ipynb_checkpoints", "__pycache__", "tests",
               ".pytest_cache", ".benchmarks", ".github", ".ci"}


def jupyter_book():
    local = Path(sys.executable).parent / "jupyter-book"
    exe = str(local) if local.exists() else shutil.which("jupyter-book")
    if exe is None:
        pytest.fail("jupyter-book is not installed (pip install -r requirements.txt)")
    return exe


def newest_source(root):
    """mtime of the newest file a book build reads (pages, config, figures, the library it imports)."""
    newest = 0.0
    for path in root.rglob("*"):
        rel = path.relative_to(root).parts
        if path.is_file() and path.suffix in SOURCE_SUFFIXES and not NOT_SOURCES & set(rel):
            newest = max(newest, path.stat().st_mtime)
    return newest


def build_book(root, reuse=False):
    """Build `root` strict into root/_build/html and return that folder; with `reuse`, keep a fresh build."""
    html = root / "_build" / "html"
    index = html / "index.html"
    if reuse and index.exists():
        # Sphinx rewrites only what changed (index.html once): the newest output dates the last build.
        built = max(p.stat().st_mtime for p in html.rglob("*") if p.is_file())
        if built >= newest_source(root):
            print(f"reusing {html} (FASTGEN_BOOK_BUILT=1 and built after the last source change)")
            return html
    if reuse:
        print(f"FASTGEN_BOOK_BUILT=1 but {html} is missing or older than a source: building")
    cmd = [jupyter_book(), "build", str(root), "-W", "-n", "--keep-going"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    out = r.stdout + r.stderr
    warnings = [line for line in out.splitlines() if "WARNING" in line or "ERROR" in line]
    assert r.returncode == 0, (f"{' '.join(cmd)} failed ({r.returncode}):\n" + "\n".join(warnings[:50])
                               + "\n...\n" + out[-3000:])
    return html


def png(width=8, height=6, rgb=(200, 30, 30)):
    """A small valid PNG, made here so the tests need no image library."""
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def widget_notebook():
    """A saved notebook with a figure output and an IntSlider's widget state, as nbclient stores them."""
    v4 = nbformat.v4
    nb = v4.new_notebook()
    layout, style, slider = "a" * 32, "b" * 32, "c" * 32
    base = {"model_module_version": "2.0.0"}
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "widgets": {WIDGET_STATE: {"version_major": 2, "version_minor": 0, "state": {
                       layout: {**base, "model_module": "@jupyter-widgets/base", "model_name": "LayoutModel",
                                "state": {}},
                       style: {**base, "model_module": "@jupyter-widgets/controls",
                               "model_name": "SliderStyleModel", "state": {"description_width": ""}},
                       slider: {**base, "model_module": "@jupyter-widgets/controls",
                                "model_name": "IntSliderModel",
                                "state": {"description": "batch", "value": 8, "max": 64,
                                          "layout": f"IPY_MODEL_{layout}", "style": f"IPY_MODEL_{style}"}},
                   }}}}
    figure = v4.new_code_cell("plot()", execution_count=1)
    figure.outputs = [v4.new_output("display_data", data={
        "image/png": base64.b64encode(png()).decode(), "text/plain": "<Figure>"})]
    view = v4.new_code_cell("slider", execution_count=2)
    view.outputs = [v4.new_output("execute_result", execution_count=2, data={
        "text/plain": "IntSlider(value=8)", WIDGET_VIEW: {"version_major": 2, "version_minor": 0,
                                                          "model_id": slider}})]
    nb.cells = [v4.new_markdown_cell("# Widgets\n\nA figure, then a slider. Back to [the intro](../intro.md)."),
                figure, view]
    return nb


def make_tiny_book(root):
    (root / "chapters").mkdir(parents=True)
    (root / "_config.yml").write_text(textwrap.dedent("""\
        title: Tiny book
        author: fastgen tests
        only_build_toc_files: true
        execute:
          execute_notebooks: "off"
        """))
    (root / "_toc.yml").write_text(textwrap.dedent("""\
        format: jb-book
        root: intro
        parts:
          - caption: Chapters
            numbered: true
            chapters:
              - file: chapters/widgets
              - file: chapters/figure.md
        """))
    (root / "intro.md").write_text("# Intro\n\nRead [the widgets](chapters/widgets.ipynb) and "
                                   "{doc}`chapters/figure`.\n")
    (root / "chapters" / "figure.md").write_text("# Figure\n\n![a red block](red.png)\n\n"
                                                 "See [widgets](widgets.ipynb).\n")
    (root / "chapters" / "red.png").write_bytes(png())
    nbformat.write(widget_notebook(), root / "chapters" / "widgets.ipynb")


def test_book(chromium):
    """The fastgen book itself: every page from _toc.yml."""
    if not (BOOK_ROOT / "_toc.yml").exists():
        pytest.skip(f"no {BOOK_ROOT / '_toc.yml'} yet")
    html = build_book(BOOK_ROOT, reuse=os.environ.get("FASTGEN_BOOK_BUILT") == "1")
    pages = pages_from_toc(BOOK_ROOT / "_toc.yml")
    with serve(html) as url:
        problems = check_site(url, pages, screenshot_dir=SCREENSHOTS)
    assert not problems, "\n".join(problems)
    assert len(list(SCREENSHOTS.glob("*.png"))) >= len(pages) - 1  # index.html only forwards


def test_tiny_book(chromium, tmp_path):
    """The machinery on a book made here: notebook figure, markdown figure, widget state, links."""
    make_tiny_book(tmp_path)
    html = build_book(tmp_path)
    pages = pages_from_toc(tmp_path / "_toc.yml")
    assert pages == ["index.html", "intro.html", "chapters/widgets.html", "chapters/figure.html"]
    shots = tmp_path / "shots"
    logged = []
    with serve(html) as url:
        problems = check_site(url, pages, screenshot_dir=shots, log=logged.append)
    # offline the widget renders nothing: exactly what the book's pages must never show a reader
    assert problems == ["chapters/widgets.html: 1 empty output area(s) (a widget with no static "
                        "fallback?)"]
    assert sorted(p.name for p in shots.glob("*.png")) == ["chapters__figure.png", "chapters__widgets.png",
                                                          "intro.png"]
    assert any("chapters/widgets.html: 1 widget view(s), saved state checked" in m for m in logged)


def test_checker_reports_broken_site(chromium, tmp_path):
    """A hand-made site with one of each fault: the checker names each, and nothing else."""
    (tmp_path / "good.png").write_bytes(png())
    (tmp_path / "other.html").write_text("<!doctype html><title>other</title><p id=top>fine</p>")
    (tmp_path / "index.html").write_text(textwrap.dedent(f"""\
        <!doctype html><title>broken</title>
        <img src="good.png"> <img src="missing.png"> <img src="https://example.invalid/off-site.png">
        <a href="other.html#top">fine</a> <a href="nope.html#x">broken</a>
        <a href="https://example.invalid/">off-site, not followed</a>
        <script type="{WIDGET_STATE}">{{"version_major": 2, "version_minor": 0, "state": {{}}}}</script>
        <script type="{WIDGET_VIEW}">{{"version_major": 2, "version_minor": 0, "model_id": "abc"}}</script>
        <script>throw new Error("boom")</script>
        <div class="cell tag_solution"><div class="cell_input">answer = 42</div></div>
        <details class="sd-dropdown" open><summary>Solution</summary>42</details>
        <div class="cell_output"></div>
        """))
    with serve(tmp_path) as url:
        problems = check_site(url, ["index.html", "other.html", "gone.html"], log=lambda m: None)
    assert sorted(problems) == sorted([
        "index.html: broken image missing.png",
        "index.html: broken internal link /nope.html (HTTP 404)",
        "index.html: widget view abc has no saved state (was the notebook saved with widget state?)",
        "index.html: has widgets but never requests the html-manager script",
        "index.html: uncaught JavaScript error: boom",
        "index.html: a solution shows before the reader opens it ({'open_solutions': 1, "
        "'open_dropdowns': 1, 'empty_outputs': 1})",
        "index.html: 1 empty output area(s) (a widget with no static fallback?)",
        "gone.html: HTTP 404",
    ]), "\n".join(problems)
