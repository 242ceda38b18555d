"""report.html in a real browser: headless Chromium opens a real run's report, and a script
run inside the page finds every plot decoded (an <img> with a natural size), the sections
there, and a screenshot of the page that is not blank.

Chromium is Debian's package (`make test` installs it when missing and run as root; see
the Makefile's `chromium` step); without it the test skips and says so. It runs offline:
no sandbox (we are root), no GPU, no first-run or background networking, a fresh profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train

CHROMIUM = (
    os.environ.get("TAURL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: apt-get install -y chromium "
    "(make test does it when run as root), or set TAURL_CHROMIUM",
)

# Appended to a copy of the report: after the load event, the page reports what it shows.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const out = {images: imgs.length,
               decoded: imgs.filter(i => i.complete && i.naturalWidth > 0
                                         && i.naturalHeight > 0).length,
               sizes: imgs.map(i => [i.naturalWidth, i.naturalHeight]),
               h2: [...document.querySelectorAll('h2')].map(h => h.textContent),
               width: document.body.scrollWidth, height: document.body.scrollHeight};
  const pre = document.createElement('pre');
  pre.id = 'taurl-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--mute-audio", f"--user-data-dir={tmp / 'profile'}",
        "--virtual-time-budget=2000",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp)})


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    from test_alarms import TINY  # registers echotrap-v0

    run_dir = tmp_path_factory.mktemp("browser") / "run"
    train(TrainConfig(**TINY, updates=2), str(run_dir), progress=False)
    return run_dir / "report.html"


def test_report_renders_with_its_plots_loaded(report, tmp_path):
    text = report.read_text()
    n_img = len(re.findall(r"<img ", text))
    assert n_img >= 8  # holdout + SFT loss + the RL curves of a run with RL updates
    page = tmp_path / "report.html"
    page.write_text(text.replace("</body>", PROBE + "</body>"))
    proc = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="taurl-probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the probe did not run in the page; chromium said: {proc.stderr[-2000:]}"
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert probe["images"] == n_img and probe["decoded"] == n_img, probe
    # real plots, not icons
    assert all(w >= 200 and h >= 100 for w, h in probe["sizes"]), probe["sizes"]
    assert {"Holdout", "Health alarms", "Training curves", "Glossary", "Summary"} <= set(
        probe["h2"]
    )
    assert probe["height"] > 2000  # a page of figures and tables laid out


def test_report_screenshot_is_not_blank(report, tmp_path):
    import numpy as np
    from matplotlib import image

    shot = tmp_path / "shot.png"
    proc = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1600", report.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    px = image.imread(shot)[..., :3]  # (H, W, 3) floats in [0, 1]
    assert px.shape[:2] == (1600, 1200)
    dark = (px.mean(axis=-1) < 0.5).mean()
    colors = len(np.unique((px * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    # text and plotted lines on a light page
    assert 0.002 < dark < 0.5 and colors > 50, (dark, colors)
