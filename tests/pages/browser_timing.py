"""Click → drawn in a real browser: what "a page has rendered" means, for the browser test and
benchmarks/pages_browser.py alike.

A page is drawn when Streamlit's script is no longer running, its title is the page's, no
element of the previous run is still shown stale, none is a placeholder waiting for its
element's JavaScript (Streamlit loads each element kind's code the first time a tab shows one:
a Plotly chart is no chart until then, so its SVG cannot be asked for), every Plotly chart has
drawn its SVG and the page's key texts are on screen."""

from __future__ import annotations

import time
from typing import Any

# (url path, sidebar link's href ending, title, texts that must be on screen)
PAGES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("overview", "/", "Overview", ("Alerts", "Targets")),
    ("inspector", "/inspector", "Request inspector", ("Router view",)),
    ("routing", "/routing", "Routing", ("Recent decisions",)),
    ("affinity", "/affinity", "Affinity", ("Per image",)),
    ("cache", "/cache", "Cache", ("Predicted vs realized",)),
    ("lab", "/lab", "Lab", ("Send",)),
    ("targets", "/targets", "Targets", ("mmlens.toml",)),
)

DRAWN_JS = """([title, texts]) => {
  const app = document.querySelector("[data-testid='stApp']");
  if (!app || app.getAttribute("data-test-script-state") === "running") return false;
  const main = document.querySelector("[data-testid='stMain']");
  if (!main) return false;
  const h1 = main.querySelector("h1");
  if (!h1 || !h1.innerText.includes(title)) return false;
  if (main.querySelector("[data-stale='true']")) return false;
  // an element whose JavaScript is still loading is a skeleton (React Suspense), not drawn
  if (main.querySelector("[data-testid='stSkeleton']")) return false;
  // a chart put in by its script (mmlens.figures.inserted) is there once the script is gone
  if (main.querySelector(".mmlens-inserted > script")) return false;
  for (const c of main.querySelectorAll("[data-testid='stPlotlyChart']"))
    if (!c.querySelector(".main-svg")) return false;
  const text = main.innerText;
  return texts.every(t => text.includes(t));
}"""


def wait_drawn(page: Any, title: str, texts: tuple[str, ...], timeout_s: float = 60.0) -> None:
    page.wait_for_function(DRAWN_JS, arg=[title, list(texts)], polling="raf",
                           timeout=timeout_s * 1000)


def nav_link(page: Any, href_end: str) -> Any:
    """The sidebar's link to a page (the Overview's is the root URL)."""
    links = page.locator("[data-testid='stSidebarNav'] a")
    if href_end == "/":
        return links.first
    return page.locator(f"[data-testid='stSidebarNav'] a[href$='{href_end}']").first


def click_to_drawn(page: Any, href_end: str, title: str, texts: tuple[str, ...],
                   timeout_s: float = 60.0) -> float:
    """Seconds from a click on the page's sidebar link to the page drawn."""
    link = nav_link(page, href_end)
    link.wait_for(state="visible", timeout=timeout_s * 1000)
    t = time.perf_counter()
    link.click()
    wait_drawn(page, title, texts, timeout_s)
    return time.perf_counter() - t


def load_to_drawn(page: Any, url: str, title: str, texts: tuple[str, ...],
                  timeout_s: float = 60.0) -> float:
    """Seconds from opening ``url`` (a link, a reload, a new tab) to the page drawn."""
    t = time.perf_counter()
    page.goto(url, wait_until="commit")
    wait_drawn(page, title, texts, timeout_s)
    return time.perf_counter() - t
