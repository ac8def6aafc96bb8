"""``trtq report`` in a real browser: headless Chromium loads the page from disk, the page must run
without a console message or script error, draw the histogram and the table, and a screenshot of
the histogram view must show the bars. Skips (with the reason) when Chromium is not installed
(Debian: ``apt-get install chromium``; CI installs it in .ci/run).

The harness is checked against a broken copy of the page, so it cannot pass by seeing nothing.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SAMPLE_CONFIG

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser():
    env = os.environ.get("CHROMIUM_BIN")
    if env:
        return env
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


pytestmark = pytest.mark.skipif(_browser() is None, reason="no Chromium here (apt-get install chromium)")


def _chromium(page: Path, tmp: Path, *mode: str, size=(1280, 1100)):
    """Run headless Chromium on ``page``; returns (stdout, console lines from stderr)."""
    args = [
        _browser(),
        "--headless",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        f"--window-size={size[0]},{size[1]}",
        "--virtual-time-budget=10000",
        "--hide-scrollbars",
        *mode,
        page.resolve().as_uri(),
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.insert(2, "--no-sandbox")
    p = subprocess.run(args, capture_output=True, text=True, timeout=180, cwd=tmp)
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    return p.stdout, console, p


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory):
    """The report of a real calibration of the bundled sample (real photos), with statistics."""
    from trtq.cli import main

    root = tmp_path_factory.mktemp("browser")
    cache, stats, page = root / "c.cache", root / "s.npz", root / "report.html"
    for args in (
        ["calibrate", "-c", SAMPLE_CONFIG, "--limit", "8", "--method", "mse", "-o", cache, "--save-stats", stats, "-q"],
        ["report", "--cache", cache, "--stats", stats, "-o", page, "-q"],
    ):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            assert e.code in (0, None)
    return root, page


def _check_dom(dom: str):
    return {
        "rendered": 'data-rendered="ok"' in dom,
        "errors": re.findall(r'data-errors="([^"]*)"', dom),
        "rows": len(re.findall(r'<tr id="row-\d+"', dom)),
        "bars": bool(re.search(r'<path[^>]*id="hist-bars"', dom) or re.search(r'id="hist-bars"', dom)),
        "cache_line": "range-cache" in dom,
    }


def test_page_renders_without_console_errors(sample_report, tmp_path):
    root, page = sample_report
    dom, console, proc = _chromium(page, tmp_path, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console == [], console
    seen = _check_dom(dom)
    assert seen["rendered"] and not seen["errors"], seen
    from trtq.calib.cache import read_cache

    assert seen["rows"] == len(read_cache(root / "c.cache").amax)  # one table row per tensor
    assert seen["bars"] and seen["cache_line"]


def test_screenshot_of_the_histogram_view(sample_report, tmp_path):
    from PIL import Image

    root, page = sample_report
    shot = tmp_path / "histogram.png"
    _, console, proc = _chromium(page, tmp_path, f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert console == [], console
    keep = os.environ.get("REPORT_SCREENSHOT")  # to look at it: REPORT_SCREENSHOT=/tmp/h.png
    if keep:
        shutil.copyfile(shot, keep)
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape[:2] == (1100, 1280)
    # the histogram's bar fill (#9ecae1) and the cache's range line (#d62728) are on screen
    bars = np.all(np.abs(img - [0x9E, 0xCA, 0xE1]) <= 4, axis=-1)
    red = np.all(np.abs(img - [0xD6, 0x27, 0x28]) <= 8, axis=-1)
    assert bars.sum() > 5000, bars.sum()
    assert red.sum() > 50, red.sum()
    rows = np.flatnonzero(bars.any(axis=1))
    assert rows.min() > 300 and rows.max() < 1000  # inside the histogram view, below the summary


def test_the_harness_sees_a_broken_page(sample_report, tmp_path):
    """Same checks on a copy whose script fails: they must notice."""
    root, page = sample_report
    broken = tmp_path / "broken.html"
    text = page.read_text(encoding="utf-8")
    broken.write_text(text.replace("var D = JSON.parse(", "var D = JSON.parse(undefinedThing + "), encoding="utf-8")
    dom, console, _ = _chromium(broken, tmp_path, "--dump-dom")
    seen = _check_dom(dom)
    assert not seen["rendered"]
    assert any("undefinedThing" in ln for ln in console) or any("undefinedThing" in e for e in seen["errors"])
    assert seen["errors"], "the page's own error sink did not record the error"


def test_sensitivity_bars_with_layers_of_no_error(sample_report, tmp_path):
    """trtq compare --per-layer writes SQNR "inf" for a layer that adds no error (and "nan" may
    appear): the page must draw the finite ones as bars, name the others, and raise nothing."""
    from trtq.cli import main

    root, _ = sample_report
    rows = [
        {"node": "Conv.1", "op_type": "Conv", "sqnr_db": 12.5, "cosine_mean": 0.99},
        {"node": "Conv.7", "op_type": "Conv", "sqnr_db": 31.0, "cosine_mean": 0.999},
        {"node": "Add.2", "op_type": "Add", "sqnr_db": "inf", "cosine_mean": 1.0},
        {"node": "Mul.3", "op_type": "Mul", "sqnr_db": "nan", "cosine_mean": "nan"},
    ]
    compare = {
        "reference": "m.onnx",
        "candidate": "m.qdq.onnx",
        "samples": 8,
        "batches": 1,
        "outputs": [
            {
                "name": "y",
                "samples": 8,
                "top1_agreement": 0.75,
                "cosine_mean": 0.99,
                "cosine_min": 0.9,
                "sqnr_db": "inf",
                "max_abs_error": 0.0,
            }
        ],
        "per_layer": rows,
    }
    (tmp_path / "c.json").write_text(__import__("json").dumps(compare))
    (tmp_path / "q.json").write_text('{"left_float": [{"node": "Conv.1", "reason": "excluded by --exclude Conv.1"}]}')
    page = tmp_path / "r.html"
    try:
        main(
            [
                "report",
                "--cache",
                str(root / "c.cache"),
                "--stats",
                str(root / "s.npz"),
                "--compare",
                str(tmp_path / "c.json"),
                "--quantize",
                str(tmp_path / "q.json"),
                "-o",
                str(page),
                "-q",
            ]
        )
    except SystemExit as e:
        assert e.code in (0, None)
    dom, console, proc = _chromium(page, tmp_path, "--dump-dom")
    assert console == [], console
    seen = _check_dom(dom)
    assert seen["rendered"] and not seen["errors"], seen
    assert len(re.findall(r'class="layer-bar"', dom)) == 2
    assert "no measurable error" in dom and "(float)" in dom


def _js_pct(v: float) -> str:
    """The page's pct(): what a share looks like on screen."""
    if v == 0:
        return "0"
    if v < 1e-4:
        mant, exp = f"{v * 100:.1e}".split("e")
        return f"{mant}e{int(exp)} %"
    return f"{v * 100:.{3 if v < 0.01 else 2}f} %"


def test_the_page_shows_the_reports_numbers(sample_report, tmp_path):
    """With --quantize and a per-layer compare: the rendered summary, the legend of the histogram
    the page opens on (the quantized tensor that clips the most values) and the order and labels
    of the sensitivity bars are those of --json."""
    import json

    from trtq.cli import main

    root, _ = sample_report
    qdq, page = tmp_path / "m.qdq.onnx", tmp_path / "r.html"
    rows = [
        {"node": n, "op_type": "Conv", "sqnr_db": s, "task_metric": t, "task_metric_name": "top-1 agreement"}
        for n, s, t in (("Conv.3", 20.0, 0.9), ("Conv.1", 30.0, 0.5), ("Conv.5", 10.0, 0.9))
    ]
    (tmp_path / "c.json").write_text(json.dumps({"outputs": [], "per_layer": rows}))
    out = {}
    for name, args in (
        ("q", ["quantize", "-c", SAMPLE_CONFIG, "--cache", root / "c.cache", "-o", qdq, "--json", "-q"]),
        ("r", ["report", "--cache", root / "c.cache", "--stats", root / "s.npz", "--quantize", tmp_path / "q.json",
               "--compare", tmp_path / "c.json", "-o", page, "--json", "-q"]),
    ):  # fmt: skip
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                main([str(a) for a in args])
            except SystemExit as e:
                assert e.code in (0, None)
        out[name] = buf.getvalue()
        (tmp_path / f"{name}.json").write_text(out[name])
    data = json.loads(out["r"])
    dom, console, _ = _chromium(page, tmp_path, "--dump-dom")
    assert console == [] and _check_dom(dom)["rendered"], console
    s = data["summary"]
    assert f"{s['clipping']}</b> of the {s['quantized']} tensors the Q/DQ model quantizes" in dom
    shown = [r for r in data["tensors"] if r["quantized"] and "histogram" in r]
    first = max(shown, key=lambda r: r["clipped"] * r["values"])
    legend = re.search(r'<div id="hist-legend"[^>]*>(.*?)</div>', dom, re.S).group(1)
    assert "max " in legend and re.search(r'class="mark-max">[^<]*<i[^>]*></i>max [^(]*\(clips 0,', legend)
    cache = re.search(r'class="mark-cache"[^>]*>.*?\(clips ([^,]*),', legend).group(1)
    assert cache == ("\u2264 " if not first["clipped_exact"] else "") + _js_pct(first["clipped"])
    labels = re.findall(r'<text[^>]*class="layer-value"[^>]*>([^<]*)</text>', dom)
    assert [lb.split(" ")[0] for lb in labels] == ["0.500", "0.900", "0.900"]  # top-1 lowest first
    assert [lb.split("\u00b7 ")[1] for lb in labels] == ["30.0 dB", "10.0 dB", "20.0 dB"]  # then SQNR
    assert "Sorted by top-1 agreement with only this layer in INT8, lowest first, then SQNR" in dom
