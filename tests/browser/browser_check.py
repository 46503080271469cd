"""Look at a built book the way a reader's browser does: headless Chromium (Debian's, driven by Playwright).

`check_site(base_url, pages)` opens each page and returns a list of problems (empty when all is well):
  - the page answers HTTP 200;
  - every same-origin <img> decodes (naturalWidth > 0): no broken figures;
  - every same-origin link (fragment stripped) answers HTTP 200;
  - no uncaught JavaScript error;
  - what a reader sees first: every solution folded (code cells tagged `solution`, `{dropdown}`s), and
    no empty output area (a widget that renders nothing on a static page);
  - saved ipywidgets state, where a page has one, is well-formed JSON, each widget view points at a model
    in it (and every IPY_MODEL_ reference resolves), and the page asks for the widget manager script.

Offline limitation: the widget manager (`@jupyter-widgets/html-manager` and require.js) comes from a CDN
(jsdelivr, cdnjs) that this machine cannot reach. Every request that leaves the site's origin is aborted
on purpose, so the check never depends on the network and sends nothing off the machine. Widgets therefore
do not render here; the check proves that the state a browser with network would render is there and
consistent, and that the page requests the manager that renders it. The static plot beside each widget
(a widget never carries the only insight) is what an offline reader sees; it is checked like any image.
"""
import contextlib
import functools
import http.server
import json
import re
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

CHROMIUM = "/usr/bin/chromium"  # Debian's package: apt-get install -y chromium chromium-driver
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_MANAGER = re.compile(r"@jupyter-widgets/html-manager@[^/]+/dist/embed(-amd)?\.js")
BOOK_SUFFIXES = (".md", ".ipynb", ".rst")
# Jupyter Book 1 writes sphinx-thebe's `const THEBE_JS_URL = ...` config script twice into every page;
# the second one throws. Thebe (live code) is not used offline and the page is otherwise unaffected.
KNOWN_JS_ERRORS = re.compile(r"Identifier 'THEBE_JS_URL' has already been declared")
META_REFRESH = re.compile(r"""<meta[^>]+http-equiv=["']?refresh["']?[^>]+content=["']?\d+\s*;\s*url=([^"'>\s]+)""", re.I)

# Runs in the page: make lazy images load, wait for each to settle, list those that did not decode.
_BROKEN_IMAGES_JS = """async (origin) => {
  const imgs = [...document.images].filter(i => {
    try { const u = new URL(i.src); return u.protocol === 'data:' || u.origin === origin; }
    catch { return true; }  // no or unparseable src: broken
  });
  for (const i of imgs) i.loading = 'eager';
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  return imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));
}"""

# Runs in the page: what a reader sees before clicking anything. A solution (a code cell tagged
# `solution`, or a markdown `{dropdown}`) must be folded: none of its input or output visible. An output
# area must show something: text, a figure or a table (an unrendered widget leaves an empty box).
_READER_VIEW_JS = """() => {
  const seen = el => el.checkVisibility ? el.checkVisibility() : el.offsetParent !== null;
  const open = [...document.querySelectorAll('.tag_solution .cell_input, .tag_solution .cell_output')]
    .filter(seen).length;
  const dropdowns = [...document.querySelectorAll('details.sd-dropdown')].filter(d => d.open).length;
  const empty = [...document.querySelectorAll('.cell_output')].filter(o => seen(o)
    && !o.innerText.trim() && !o.querySelector('img, svg, table, canvas')).length;
  return {open_solutions: open, open_dropdowns: dropdowns, empty_outputs: empty};
}"""

_WIDGET_SCRIPTS_JS = """([stateType, viewType]) => ({
  states: [...document.querySelectorAll(`script[type="${stateType}"]`)].map(s => s.textContent),
  views: [...document.querySelectorAll(`script[type="${viewType}"]`)].map(s => s.textContent),
})"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a browser dropping a request is normal
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(directory):
    """Serve `directory` on 127.0.0.1 (a free port) from a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def pages_from_toc(toc_path):
    """The HTML pages a Jupyter Book `_toc.yml` (jb-book or jb-article) builds: index.html first, then
    each `root`/`file` entry in order, as paths relative to `_build/html`."""
    import yaml

    toc = yaml.safe_load(Path(toc_path).read_text())
    files = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    files.append(node[key])
            for value in node.values():
                if isinstance(value, (list, dict)):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    pages = ["index.html"]
    for f in files:
        stem = next((f[: -len(s)] for s in BOOK_SUFFIXES if f.endswith(s)), f)
        if stem + ".html" not in pages:
            pages.append(stem + ".html")
    return pages


def _origin(url):
    u = urlparse(url)
    return f"{u.scheme}://{u.netloc}"


def _http_get(url):
    """(status, text) of a GET request to the local server."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except urllib.error.URLError as e:
        return f"unreachable ({e.reason})", ""


def _http_status(url):
    """Status of a HEAD (falling back to GET) request to the local server; redirects are followed."""
    for method in ("HEAD", "GET"):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            if method == "GET" or e.code not in (405, 501):
                return e.code
        except urllib.error.URLError as e:
            return f"unreachable ({e.reason})"
    return None


def _widget_problems(page_name, states, views, manager_requested):
    """Saved widget state: parseable, models complete, every view and IPY_MODEL_ reference resolves."""
    problems = []
    models = {}
    for text in states:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            problems.append(f"{page_name}: widget state is not JSON ({e})")
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("state"), dict) or "version_major" not in doc:
            problems.append(f"{page_name}: widget state lacks 'state'/'version_major'")
            continue
        for model_id, model in doc["state"].items():
            missing = [k for k in ("model_name", "model_module", "state") if k not in model]
            if missing:
                problems.append(f"{page_name}: widget model {model_id} lacks {missing}")
            models[model_id] = model
    for model_id, model in models.items():
        for ref in re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(model.get("state", {}))):
            if ref not in models:
                problems.append(f"{page_name}: widget model {model_id} refers to missing model {ref}")
    for text in views:
        try:
            view = json.loads(text)
        except json.JSONDecodeError as e:
            problems.append(f"{page_name}: widget view is not JSON ({e})")
            continue
        if view.get("model_id") not in models:
            problems.append(f"{page_name}: widget view {view.get('model_id')} has no saved state "
                            "(was the notebook saved with widget state?)")
    if views and not manager_requested:
        problems.append(f"{page_name}: has widgets but never requests the html-manager script")
    return problems


def check_site(base_url, pages, screenshot_dir=None, log=print):
    """Open `pages` (paths relative to `base_url`) in headless Chromium; return a list of problems.
    With `screenshot_dir`, save a viewport screenshot of each page there."""
    from playwright.sync_api import sync_playwright  # imported here: the unit tests do not need it

    base_url = base_url if base_url.endswith("/") else base_url + "/"
    origin = _origin(base_url)
    problems, links, blocked, known = [], {}, set(), set()
    requested = []  # URLs the current page asked for, site or not

    def route(r):
        url = r.request.url
        requested.append(url)
        if _origin(url) == origin:
            r.continue_()
        else:  # never leave the machine: CDNs, fonts, analytics are aborted, not fetched
            blocked.add(urlparse(url).netloc)
            r.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", route)
            page = context.new_page()
            js_errors = []
            page.on("pageerror", lambda e: js_errors.append(str(e)))
            for name in pages:
                requested.clear()
                js_errors.clear()
                url = urljoin(base_url, name)
                status, body = _http_get(url)
                refresh = META_REFRESH.search(body) if status == 200 else None
                if refresh:  # Jupyter Book's index.html forwards to the root page: check the target
                    target = urljoin(url, refresh.group(1))
                    links.setdefault(urldefrag(target)[0], name)
                    log(f"{name}: forwards to {target[len(origin):]}")
                    continue
                response = page.goto(url, wait_until="load", timeout=60_000)
                status = response.status if response else None
                if status != 200:
                    problems.append(f"{name}: HTTP {status}")
                    continue
                view = page.evaluate(_READER_VIEW_JS)
                if view["open_solutions"] or view["open_dropdowns"]:
                    problems.append(f"{name}: a solution shows before the reader opens it ({view})")
                if view["empty_outputs"]:
                    problems.append(f"{name}: {view['empty_outputs']} empty output area(s) "
                                    "(a widget with no static fallback?)")
                for src in page.evaluate(_BROKEN_IMAGES_JS, origin):
                    problems.append(f"{name}: broken image {src}")
                for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
                    target = urldefrag(href)[0]
                    if _origin(target) == origin:
                        links.setdefault(target, name)
                scripts = page.evaluate(_WIDGET_SCRIPTS_JS, [WIDGET_STATE, WIDGET_VIEW])
                manager = any(WIDGET_MANAGER.search(u) for u in requested)
                problems += _widget_problems(name, scripts["states"], scripts["views"], manager)
                if scripts["views"]:
                    log(f"{name}: {len(scripts['views'])} widget view(s), saved state checked; "
                        "not rendered (widget manager comes from a CDN, aborted offline)")
                for err in js_errors:
                    first = err.splitlines()[0] if err else err
                    if KNOWN_JS_ERRORS.search(first):
                        known.add(first)
                    else:
                        problems.append(f"{name}: uncaught JavaScript error: {first}")
                if screenshot_dir:
                    shot = Path(screenshot_dir) / (name.removesuffix(".html").replace("/", "__") + ".png")
                    shot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(shot))
        finally:
            browser.close()
    for target, found_on in sorted(links.items()):
        status = _http_status(target)
        if status != 200:
            problems.append(f"{found_on}: broken internal link {target[len(origin):]} (HTTP {status})")
    for err in sorted(known):
        log(f"known harmless JavaScript error, not counted: {err}")
    if blocked:
        log(f"aborted requests to other origins (offline by design): {', '.join(sorted(blocked))}")
    log(f"checked {len(pages)} page(s), {len(links)} internal link(s): {len(problems)} problem(s)")
    return problems
