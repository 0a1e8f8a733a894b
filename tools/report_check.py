"""Open the Snakemake report in a real headless browser and walk through it like a reader.

The report (``snakemake --report results/report.html``) is a single-page JavaScript app: a
file that parses is not a report that works. :func:`browse` loads it in headless Chromium
(Debian package ``chromium``), clicks through a sequence of menu entries and result rows the way
a reader would, and returns what the page then shows (its visible text, the decoded size of
every image, the embedded HTML results), optionally with a screenshot.
:func:`check_report` visits every category, subcategory and result of the report and fails
loudly on a view that does not render: an image that did not decode, a missing entry.

``python3 -m tools.report_check results/report.html --screenshots results/report_check``
runs the whole walk and leaves one PNG per view to look at.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvasym.errors import KvasymError

#: What an error message starts with: this tool's name, not the kvasym CLI's ("kvasym: error:").
ERROR_PREFIX = "tools.report_check: error:"
#: Browser candidates, in order (Debian ships ``chromium``).
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Flags for a container: no sandbox (root), no GPU, /tmp instead of a small /dev/shm.
HEADLESS_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                  "--window-size=1400,1000")

# Injected before </body>: waits for each label to appear, clicks it, then records what the
# page shows in a hidden <pre>. "view:<name>" clicks the eye button of the result row <name>.
_DRIVER = """
<script>
(function () {
  const labels = __LABELS__;
  const log = [];
  function clickable(el) { return el.closest('a,button,tr') || el; }
  function press(label) {
    if (label.startsWith('view:')) {
      const name = label.slice(5);
      const rows = Array.from(document.querySelectorAll('tr'))
        .filter(r => r.cells.length && r.cells[0].textContent.trim() === name);
      if (!rows.length) return false;
      const button = rows[0].querySelector('a,button,svg');
      if (!button) return false;
      (button.closest('a,button') || button).dispatchEvent(new MouseEvent('click', {bubbles: true}));
      return true;
    }
    const hits = Array.from(document.querySelectorAll('a,button,li,span,td,th'))
      .filter(e => e.textContent.trim() === label);
    if (!hits.length) return false;
    clickable(hits[hits.length - 1]).click();
    return true;
  }
  function finish() {
    const out = document.createElement('pre');
    out.id = 'kvasym-report-check';
    out.style.display = 'none';
    out.textContent = JSON.stringify({
      clicked: log,
      text: document.body.innerText,
      images: Array.from(document.querySelectorAll('img')).map(i => [i.naturalWidth, i.naturalHeight]),
      iframes: Array.from(document.querySelectorAll('iframe')).map(f => (f.getAttribute('src') || '').slice(0, 40)),
      rows: Array.from(document.querySelectorAll('tr'))
        .filter(r => r.cells.length && r.cells[0].tagName === 'TD').map(r => r.cells[0].textContent.trim())
    });
    document.body.appendChild(out);
  }
  let i = 0, tries = 0;
  function step() {
    if (i >= labels.length) { setTimeout(finish, 1000); return; }
    if (press(labels[i])) { log.push(labels[i]); i += 1; tries = 0; setTimeout(step, 700); }
    else if (++tries > 60) { log.push('MISSING ' + labels[i]); finish(); }
    else setTimeout(step, 250);
  }
  setTimeout(step, 500);
})();
</script>
"""


def find_browser() -> str | None:
    """The path of a Chromium-family browser, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def browse(report: str | Path, clicks: Sequence[str] = (), *, screenshot: str | Path | None = None,
           browser: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """Load ``report`` in headless Chromium, press ``clicks`` in order (menu text, or
    ``view:<result row>``), and return ``{clicked, text, images, iframes, rows}``: the labels
    pressed (``MISSING <label>`` for the first one never found), the visible text, the
    (width, height) of every decoded image, the start of every iframe's source, and the first
    cell of every table body row. With ``screenshot``, also writes a PNG of the final view."""
    browser = browser or find_browser()
    if browser is None:
        raise KvasymError(f"no Chromium-family browser found (looked for {', '.join(BROWSERS)}); "
                          "Debian: apt-get install chromium")
    report = Path(report)
    if not report.is_file():
        raise KvasymError(f"report {report} does not exist (run: snakemake --report {report})")
    page_html = report.read_text(encoding="utf-8")
    end = page_html.rfind("</body>")
    if end < 0:
        raise KvasymError(f"report {report} has no </body>: not a Snakemake HTML report")
    driver = _DRIVER.replace("__LABELS__", json.dumps(list(clicks)))
    with tempfile.TemporaryDirectory(prefix="kvasym-report-") as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(page_html[:end] + driver + page_html[end:], encoding="utf-8")
        flags = [browser, *HEADLESS_FLAGS, "--virtual-time-budget=30000", f"--user-data-dir={tmp}/profile"]
        if screenshot is not None:
            subprocess.run([*flags, f"--screenshot={Path(screenshot).resolve()}", page.as_uri()],
                           capture_output=True, timeout=timeout, check=True)
        dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                             timeout=timeout, check=True).stdout
    found = re.search(r'<pre id="kvasym-report-check"[^>]*>(.*?)</pre>', dom, re.S)
    if found is None:
        raise KvasymError(f"the report {report} did not finish rendering in the browser (no result record)")
    return json.loads(html.unescape(found.group(1)))


def _slug(labels: Sequence[str]) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", "__".join(labels)).strip("_") or "home"


def _result_rows(record: Mapping[str, Any]) -> list[str]:
    """The result names of a listing (first cells of its body rows)."""
    return [r for r in record["rows"] if r]


def _menu_entries(text: str, heading: str) -> list[str]:
    """The menu lines right below ``heading`` in a page's visible text, up to a blank line."""
    lines = text.splitlines()
    keys = [line.strip().casefold() for line in lines]  # the menu's CSS upper-cases headings
    if heading.casefold() not in keys:
        return []
    start = keys.index(heading.casefold()) + 1
    entries = []
    for line in lines[start:]:
        if not line.strip():
            break
        entries.append(line.strip())
    return entries


def check_report(report: str | Path, categories: Mapping[str, Sequence[str]] | None = None, *,
                 screenshots: str | Path | None = None) -> list[dict[str, Any]]:
    """Visit every result of the report and check it renders; returns one record per view.

    ``categories`` maps a category name to its subcategories (empty: none); by default it is
    read from the report's home page (every entry under "Results" in the menu). Each result row
    is viewed: an image result must decode to a non-empty image, an HTML result must be embedded
    as an iframe. Raises :class:`KvasymError` naming the first view that failed."""
    out_dir = Path(screenshots) if screenshots is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)

    def visit(path: Sequence[str]) -> dict[str, Any]:
        shot = out_dir / f"{_slug(path)}.png" if out_dir is not None else None
        record = browse(report, path, screenshot=shot)
        missing = [c for c in record["clicked"] if c.startswith("MISSING ")]
        if missing:
            raise KvasymError(f"report {report}: {missing[0][8:]!r} not found after {' > '.join(path)}")
        return {"path": list(path), **record}

    home = visit([])
    records = [home]
    if categories is None:
        names = _menu_entries(home["text"], "Results")
        categories = {name: [] for name in names}
    if not categories:
        raise KvasymError(f"report {report} lists no result categories")
    for category, subcategories in categories.items():
        trails = [[category, sub] for sub in subcategories]
        if not trails:
            listing = visit([category])
            records.append(listing)
            if _result_rows(listing):
                trails = [[category]]
            else:  # a category with subcategories lists them (menu lines below its name)
                trails = [[category, sub] for sub in _menu_entries(listing["text"], category)]
            if not trails:
                raise KvasymError(f"report {report}: no results under {category}")
        for trail in trails:
            if trail != [category] or not records or records[-1]["path"] != [category]:
                listing = visit(trail)
                records.append(listing)
            rows = _result_rows(listing)
            if not rows:
                raise KvasymError(f"report {report}: no results under {' > '.join(trail)}")
            for row in rows:
                view = visit([*trail, f"view:{row}"])
                decoded = [size for size in view["images"] if size[0] > 100 and size[1] > 100]
                if not decoded and not view["iframes"]:
                    raise KvasymError(f"report {report}: result {row!r} under {' > '.join(trail)} shows neither "
                                      "an image nor an embedded page")
                records.append(view)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m tools.report_check REPORT [--category NAME[=SUB,SUB]] [--screenshots DIR]``."""
    parser = argparse.ArgumentParser(prog="python3 -m tools.report_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("report")
    parser.add_argument("--category", action="append", default=[],
                        help="NAME or NAME=SUB1,SUB2 (default: every category of the home page, no subcategories)")
    parser.add_argument("--screenshots", help="write one PNG per view into this folder")
    args = parser.parse_args(argv)
    categories = None
    if args.category:
        categories = {}
        for item in args.category:
            name, _, subs = item.partition("=")
            categories[name] = [s for s in subs.split(",") if s]
    try:
        records = check_report(args.report, categories, screenshots=args.screenshots)
    except (KvasymError, subprocess.SubprocessError) as exc:
        print(f"{ERROR_PREFIX} {exc}", file=sys.stderr)
        return 2
    for record in records:
        label = " > ".join(record["path"]) or "(home)"
        print(f"ok  {label}: {len(record['images'])} images, {len(record['iframes'])} embedded pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
