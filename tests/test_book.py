"""Browser test of the built book: every page of _toc.yml in headless Chromium, offline.
Builds the book first (incremental `jupyter-book build -W -n --keep-going`), serves
_build/html on 127.0.0.1 and fails on any request that would leave the site.

Per page: it loads; MathJax (served from the site) typesets every math element, no raw TeX
or `$$` is left and its fonts load; images load and figures have captions; internal links and
their anchors resolve. Chapter pages also offer their .ipynb and keep solutions collapsed.
Screenshots of the front page, the notation page and one chapter go to tests/artifacts/.

Needs Debian's chromium (/usr/bin/chromium, or $CHROMIUM) and Playwright for Python; never
downloads a browser. Without them the test skips, except under CI (CI set), where it fails.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest
from conftest import book_extension

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = Path(os.environ.get("CHROMIUM") or "/usr/bin/chromium")
IN_CI = bool(os.environ.get("CI"))
SCREENSHOTS = {  # page -> screenshot file in tests/artifacts/
    "book/intro": "front_page.png",
    "book/notation": "notation.png",
    "notebooks/rmsnorm": "chapter_rmsnorm.png",
}
PAGE_TIMEOUT_MS = 30_000


def toc_pages() -> list[str]:
    """Every document of _toc.yml, root first, as paths without suffix."""
    text = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    pages = re.findall(r"^\s*(?:root|-?\s*file):\s*(\S+)\s*$", text, flags=re.MULTILINE)
    return [re.sub(r"\.(md|ipynb)$", "", p) for p in pages]


PAGES = toc_pages()


def require(condition: bool, reason: str) -> None:
    """Skip with `reason` when a tool is missing, but fail under CI: there the test must run."""
    if not condition:
        if IN_CI:
            pytest.fail(f"{reason} (CI is set: the browser test must run)")
        pytest.skip(reason)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def built_book() -> Path:
    """Build the book (incremental: fast when nothing changed) once per run, whichever test
    file's process asks first (test_wheel.py and test_student_build.py read the same build);
    fail with the build's log."""
    from conftest import clone_lock, run_folder

    with clone_lock():  # one build at a time into _build
        if not (run_folder() / "book-built").exists():
            _build_book()
            (run_folder() / "book-built").touch()
    return HTML


def _build_book() -> None:
    jb = Path(sys.executable).with_name("jupyter-book")
    require(jb.exists(), "jupyter-book is not installed: pip install -e '.[book]'")
    start = time.perf_counter()
    proc = subprocess.run(
        [str(jb), "build", str(ROOT), "-W", "-n", "--keep-going"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"jupyter-book build failed (exit {proc.returncode}):\n"
                    f"{(proc.stdout + proc.stderr)[-4000:]}")
    print(f"book built in {time.perf_counter() - start:.1f} s")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def site(built_book: Path):
    """Serve the built book on 127.0.0.1 (a free port), as a web host would."""
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    require(CHROMIUM.is_file(), f"no Chromium at {CHROMIUM}: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "Playwright for Python is not installed: pip install -e '.[test]'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                              args=["--disable-gpu", "--no-first-run"])
        yield b
        b.close()


class Visit:
    """One page opened in a fresh context whose only reachable origin is `allowed`."""

    def __init__(self, browser, allowed: str):
        self.allowed = allowed
        self.outside: list[str] = []  # requests that would have left the site (aborted)
        self.missing: list[str] = []  # same-site requests answered with an error
        self.errors: list[str] = []  # uncaught JavaScript errors
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        self.page.on("response", self._response)
        self.page.on("requestfailed", self._failed)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def _local(self, url: str) -> bool:
        return url.startswith((self.allowed, "data:", "blob:", "about:"))

    def _route(self, route) -> None:
        url = route.request.url
        if self._local(url):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort("blockedbyclient")

    def _response(self, response) -> None:
        if response.status >= 400 and self._local(response.url):
            self.missing.append(f"{response.status} {response.url}")

    def _failed(self, request) -> None:
        if self._local(request.url):
            self.missing.append(f"failed {request.url}: {request.failure}")

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def visit(browser, site):
    v = Visit(browser, site)
    yield v
    v.close()


# ---------------------------------------------------------------- in-page checks

WAIT_FOR_MATHJAX = """async () => {
  const n = document.querySelectorAll('.math').length;
  if (n === 0) return {math: 0, loaded: !!window.MathJax};
  const t0 = Date.now();
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
    if (Date.now() - t0 > 20000) return {math: n, loaded: false};
    await new Promise(r => setTimeout(r, 50));
  }
  await MathJax.startup.promise;
  await document.fonts.ready;
  return {math: n, loaded: true};
}"""

MATH_REPORT = """() => {
  const math = [...document.querySelectorAll('.math')];
  const untypeset = math.filter(el => !el.querySelector('mjx-container'))
                        .map(el => el.textContent.trim().slice(0, 80));
  const fonts = [...document.fonts].filter(f => f.family.replace(/"/g, '').startsWith('MJX'));
  return {
    containers: document.querySelectorAll('mjx-container').length,
    untypeset: untypeset,
    errors: [...document.querySelectorAll('mjx-merror')].map(e => e.textContent.slice(0, 80)),
    fontsLoaded: fonts.filter(f => f.status === 'loaded').map(f => f.family),
    fontsFailed: fonts.filter(f => f.status === 'error').map(f => f.family),
  };
}"""

# Prose as a reader sees it: the article without code, outputs, scripts and typeset math.
PROSE = """() => {
  const article = document.querySelector('article') || document.body;
  const copy = article.cloneNode(true);
  copy.querySelectorAll('pre, code, script, style, mjx-container, .highlight, .cell_output')
      .forEach(el => el.remove());
  return copy.textContent;
}"""

IMAGES = """async () => {
  const imgs = [...document.querySelectorAll('img')];
  for (const img of imgs) { img.loading = 'eager'; try { await img.decode(); } catch (e) {} }
  return imgs.map(img => ({src: img.currentSrc || img.src,
                           ok: img.complete && img.naturalWidth > 0}));
}"""

FIGURES = """() => [...document.querySelectorAll('article figure')].map(f => ({
  img: (f.querySelector('img') || {}).src || '',
  caption: ((f.querySelector('figcaption') || {}).textContent || '').trim(),
}))"""

LINKS = "() => [...document.querySelectorAll('a[href]')].map(a => a.href)"

# Code and outputs that run past their box: cut at the page's edge (they must wrap instead).
# Collapsed ones are opened first, since a reader opens them.
OVERFLOWING = """() => {
  document.querySelectorAll('article details').forEach(d => { d.open = true; });
  document.querySelectorAll('article .toggle-hidden').forEach(
      e => e.classList.remove('toggle-hidden'));
  return [...document.querySelectorAll('article pre')]
    .filter(p => p.clientWidth > 0 && p.scrollWidth > p.clientWidth + 1)
    .map(p => p.textContent.split('\\n').reduce((a, b) => a.length >= b.length ? a : b)
                 .slice(0, 100));
}"""

RAW_TEX = re.compile(r"\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|(?<![\w$])\$[^\s$][^$\n]{0,200}\$")


@functools.cache
def anchors_of(path: Path) -> frozenset[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return frozenset(re.findall(r"""\b(?:id|name)=["']([^"']+)["']""", text))


def broken_links(hrefs: list[str], site: str) -> list[str]:
    """Same-site links whose file, or whose #anchor in it, does not exist in _build/html."""
    broken = []
    for href in sorted(set(hrefs)):
        if not href.startswith(site):
            continue  # another site: a link, not a request; never followed here
        url, fragment = urldefrag(href)
        rel = unquote(urlsplit(url).path).lstrip("/")
        target = HTML / rel
        if rel == "" or rel.endswith("/"):
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{href} (no file {rel or 'index.html'})")
        elif fragment and target.suffix == ".html" and unquote(fragment) not in anchors_of(target):
            broken.append(f"{href} (no anchor #{fragment})")
    return broken


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("doc", PAGES)
def test_page_renders_offline(visit: Visit, site: str, doc: str) -> None:
    page = visit.page
    response = page.goto(site + doc + ".html", wait_until="load")
    assert response is not None and response.ok, f"{doc}.html: HTTP {response and response.status}"
    assert page.title(), f"{doc}: the page has no title"

    # math: MathJax from the site typesets every math element; no raw TeX remains
    state = page.evaluate(WAIT_FOR_MATHJAX)
    if doc in SCREENSHOTS:  # taken before the checks, so a failing page is on record too
        ARTIFACTS.mkdir(exist_ok=True)
        height = min(page.evaluate("() => document.documentElement.scrollHeight"), 4000)
        page.screenshot(path=str(ARTIFACTS / SCREENSHOTS[doc]), full_page=True,
                        clip={"x": 0, "y": 0, "width": 1280, "height": height})
    if state["math"]:
        assert state["loaded"], (f"{doc}: {state['math']} math elements but MathJax never "
                                 f"started; blocked requests: {visit.outside}")
        report = page.evaluate(MATH_REPORT)
        assert not report["untypeset"], f"{doc}: math left untypeset: {report['untypeset'][:5]}"
        assert report["containers"] >= state["math"], f"{doc}: fewer MathJax outputs than math"
        assert not report["errors"], f"{doc}: MathJax TeX errors: {report['errors'][:5]}"
        assert report["fontsLoaded"], f"{doc}: no MathJax font loaded"
        assert not report["fontsFailed"], f"{doc}: MathJax fonts failed: {report['fontsFailed']}"
        scripts = page.evaluate(
            "() => [...document.scripts].map(s => s.src).filter(s => /mathjax/i.test(s))")
        assert scripts and all(s.startswith(site) for s in scripts), f"{doc}: MathJax {scripts}"
    leftover = sorted(set(RAW_TEX.findall(page.evaluate(PROSE))))
    assert not leftover, f"{doc}: raw TeX in the rendered text: {leftover[:5]}"

    # images and figures
    bad = [i["src"] for i in page.evaluate(IMAGES) if not i["ok"]]
    assert not bad, f"{doc}: images that did not load: {bad}"
    uncaptioned = [f["img"] for f in page.evaluate(FIGURES) if not f["caption"]]
    assert not uncaptioned, f"{doc}: figures without a caption: {uncaptioned}"

    # links
    broken = broken_links(page.evaluate(LINKS), site)
    assert not broken, f"{doc}: broken internal links: {broken[:10]}"

    # chapters: the notebook download, collapsed solutions and solution code
    if doc.startswith("notebooks/"):
        links = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
        downloads = [h for h in links if h.startswith(site) and h.endswith(".ipynb")]
        assert downloads, f"{doc}: no .ipynb download link"
        for href in downloads:
            rel = unquote(urlsplit(href).path).lstrip("/")
            nb = json.loads((HTML / rel).read_text(encoding="utf-8"))
            assert nb.get("nbformat") == 4 and nb.get("cells"), f"{doc}: {rel} is no notebook"
        shown = page.evaluate("""() => [...document.querySelectorAll('article .solution')]
            .filter(s => !s.classList.contains('toggle-hidden')).map(s => s.id)""")
        assert not shown, f"{doc}: solutions not collapsed by default: {shown}"
        open_code = page.evaluate("""() => [...document.querySelectorAll(
            'article .tag_hide-input')].filter(c => {
              const d = c.querySelector('details'); return !d || d.open; }).length""")
        assert open_code == 0, f"{doc}: {open_code} hide-input cells not collapsed"

    # code and outputs wrap at the page's edge: no line is cut off (after the checks above,
    # which need the collapsed state, this opens every collapsed block)
    cut = page.evaluate(OVERFLOWING)
    assert not cut, f"{doc}: {len(cut)} code or output blocks run past the page: {cut[:3]}"

    assert not visit.outside, f"{doc}: requests leaving the site: {visit.outside}"
    assert not visit.missing, f"{doc}: same-site requests that failed: {visit.missing}"
    assert not visit.errors, f"{doc}: JavaScript errors: {visit.errors}"


def test_front_door_redirects(visit: Visit, site: str) -> None:
    """index.html, the address a reader opens first, leads to the introduction."""
    visit.page.goto(site + "index.html", wait_until="load")
    visit.page.wait_for_url(re.compile(re.escape(PAGES[0]) + r"\.html"))
    assert not visit.outside, visit.outside


def test_opens_from_the_file_system(browser, built_book: Path) -> None:
    """A classroom copy opened as a file (no server, no network) still typesets its math."""
    v = Visit(browser, "file://")
    try:
        v.page.goto((built_book / "book" / "notation.html").as_uri(), wait_until="load")
        state = v.page.evaluate(WAIT_FOR_MATHJAX)
        assert state["math"] and state["loaded"], state
        report = v.page.evaluate(MATH_REPORT)
        assert report["containers"] >= state["math"] and not report["untypeset"], report
        assert report["fontsLoaded"] and not report["fontsFailed"], report
        assert not v.outside, v.outside
    finally:
        v.close()


def test_launch_buttons_follow_the_repository_url() -> None:
    """One setting: no Binder/Colab/repository button while repository.url is empty."""
    launch_settings = book_extension().launch_settings
    configured = {"binderhub_url": "https://mybinder.org",
                  "colab_url": "https://colab.research.google.com"}
    off = launch_settings("", configured)
    assert not off["use_repository_button"]
    assert not off["launch_buttons"]["binderhub_url"] and not off["launch_buttons"]["colab_url"]
    on = launch_settings("https://github.com/someone/xenith-edu", configured)
    assert on["use_repository_button"] and on["launch_buttons"] == configured
    gitlab = launch_settings("https://gitlab.com/someone/xenith-edu", configured)
    assert gitlab["launch_buttons"]["binderhub_url"] and not gitlab["launch_buttons"]["colab_url"]
