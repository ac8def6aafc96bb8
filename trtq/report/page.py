"""The self-contained HTML page of ``trtq report``: no network, no external file.

Static parts (provenance, accuracy, latency, float layers) are written here as HTML; the data of
:func:`trtq.report.data.build_report` is embedded as JSON and a small inline script draws the
interactive parts as SVG: the histogram view (log-scale counts, the range of every method and the
cache's), the sortable tensor table and the per-layer sensitivity bars. Script errors show in a
red banner at the top (``#trtq-errors``); a finished render sets ``<body data-rendered="ok">``.
"""

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

from trtq.calib.methods import METHODS
from trtq.report.data import summary

# the methods' colours in the page, in the order of trtq.calib.methods' table (a new method takes
# the next one); the cache's own range is red
PALETTE = ("#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2228;background:#f6f7f9}
header{background:#1d2a3a;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c9d3df;font-size:13px}
main{padding:8px 24px 40px;max-width:1240px}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;margin:16px 0;padding:12px 16px}
h2{font-size:16px;margin:2px 0 10px}
table{border-collapse:collapse;font-size:13px}
th,td{padding:3px 8px;border-bottom:1px solid #eceff3;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
td.name{max-width:380px;overflow:hidden;text-overflow:ellipsis}
th.sort{cursor:pointer;user-select:none}th.sort:hover{background:#eef2f7}
th[data-dir=asc]::after{content:" \\25B2"}th[data-dir=desc]::after{content:" \\25BC"}
tbody tr.pick{cursor:pointer}tbody tr.pick:hover{background:#f0f5fb}tr.sel{background:#fff3cd!important}
.kv td{text-align:left}.kv td:first-child{color:#5b6672}
.muted{color:#6b7480}.warn{color:#b02a1a}.good{color:#1f7a35}
#trtq-errors{background:#b02a1a;color:#fff;padding:8px 24px;font-weight:600}
.legend span{display:inline-block;margin-right:16px;font-size:13px}
.legend i{display:inline-block;width:18px;height:3px;vertical-align:middle;margin-right:5px}
.scroll{max-height:560px;overflow:auto}
select{font-size:13px;max-width:640px}
svg text{font:11px system-ui,sans-serif;fill:#39424c}
"""

JS = r"""
(function () {
  var D = JSON.parse(document.getElementById('trtq-data').textContent);
  var NS = 'http://www.w3.org/2000/svg';
  var TABLE = JSON.parse(document.getElementById('trtq-methods').textContent);  // trtq.calib.methods
  var COLORS = {cache: '#d62728'};
  TABLE.forEach(function (m) { COLORS[m.name] = m.color; });
  var METHODS = TABLE.map(function (m) { return m.name; });
  function num(v, d) {
    if (v === null || v === undefined) return '-';
    if (typeof v !== 'number') return String(v);  // "inf" / "nan" as trtq compare writes them
    if (v === 0) return '0';
    var a = Math.abs(v);
    if (a >= 1e4 || a < 1e-3) return v.toExponential(d === undefined ? 3 : d);
    return v.toPrecision(d === undefined ? 4 : d);
  }
  function pct(v) {
    if (v === null || v === undefined) return '-';
    if (typeof v !== 'number') return String(v);
    if (v === 0) return '0';
    if (v < 1e-4) return (v * 100).toExponential(1) + ' %';
    return (v * 100).toFixed(v < 0.01 ? 3 : 2) + ' %';
  }
  function clip(v, exact) { return (exact === false ? '\u2264 ' : '') + pct(v); }  // conservative: at most
  var CLIP_WARN = (D.summary && D.summary.threshold) || 1e-4;
  var SCOPED = !!(D.clip_scope && D.clip_scope.quantized_only);
  function inScope(r) { return !SCOPED || r.quantized === true; }
  function el(tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function finite(v) { return typeof v === 'number' && isFinite(v); }
  var failed = false;
  function part(name, fn) {  // one section's failure is reported and does not stop the others
    try { fn(); } catch (e) {
      failed = true;
      window.dispatchEvent(new ErrorEvent('error', {message: name + ': ' + (e && e.message ? e.message : e)}));
    }
  }

  // ------------------------------------------------------------------ histogram view
  var svg = document.getElementById('hist-svg');
  var legend = document.getElementById('hist-legend');
  var pick = document.getElementById('tensor-pick');
  var rows = D.tensors;
  function drawHist(i) {
    var r = rows[i];
    clear(svg); clear(legend);
    pick.value = String(i);
    var W = 960, H = 330, L = 64, R = 16, T = 14, B = 42;
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    if (!r.histogram) {
      svg.appendChild(el('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle'},
        'no histogram for this tensor: pass --stats (the --save-stats file of the calibration)'));
      return;
    }
    var c = r.histogram.counts, w = r.histogram.width, n = c.length, xmax = n * w;
    var cmax = 0;
    for (var k = 0; k < n; k++) if (c[k] > cmax) cmax = c[k];
    var ytop = Math.max(1, Math.ceil(Math.log10(cmax + 1)));
    function X(v) { return L + (W - L - R) * (xmax > 0 ? v / xmax : 0); }
    function Y(cnt) { return H - B - (H - B - T) * (Math.log10(cnt + 1) / ytop); }
    for (var p = 0; p <= ytop; p++) {
      var yy = Y(Math.pow(10, p) - 1);
      svg.appendChild(el('line', {x1: L, x2: W - R, y1: yy, y2: yy, stroke: '#eceff3'}));
      svg.appendChild(el('text', {x: L - 6, y: yy + 4, 'text-anchor': 'end'}, p === 0 ? '0' : '1e' + p));
    }
    var d = 'M' + X(0) + ' ' + Y(0);
    for (k = 0; k < n; k++) d += ' V' + Y(c[k]).toFixed(1) + ' H' + X((k + 1) * w).toFixed(1);
    d += ' V' + Y(0) + ' Z';
    svg.appendChild(el('path', {d: d, fill: '#9ecae1', stroke: '#4a90c2', 'stroke-width': 0.6, id: 'hist-bars'}));
    svg.appendChild(el('line', {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#39424c'}));
    for (var t = 0; t <= 5; t++) {
      var xv = xmax * t / 5, xx = X(xv);
      svg.appendChild(el('line', {x1: xx, x2: xx, y1: H - B, y2: H - B + 4, stroke: '#39424c'}));
      svg.appendChild(el('text', {x: xx, y: H - B + 16, 'text-anchor': 'middle'}, num(xv, 3)));
    }
    svg.appendChild(el('text', {x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle'},
                       '|x|  (counts on a log scale)'));
    var marks = METHODS.filter(function (m) { return r.ranges[m] != null; })
      .map(function (m) { return [m, r.ranges[m], r.clipped_by[m], r.clipped_by_exact[m]]; });
    // the range the clip count is at: the Q/DQ pair's where it differs from the cache's (centred)
    var own = (r.quantized && Math.abs(r.clip_amax - r.amax) > 1e-6 * r.amax) ? 'Q/DQ' : 'cache';
    marks.push([own, r.clip_amax, r.clipped, r.clipped_exact]);
    marks.forEach(function (mk) {
      var xx = X(Math.min(mk[1], xmax));
      var isCache = mk[0] === 'cache' || mk[0] === 'Q/DQ';
      svg.appendChild(el('line', {x1: xx, x2: xx, y1: T, y2: H - B, stroke: COLORS[isCache ? 'cache' : mk[0]],
        'stroke-width': isCache ? 2.5 : 1.5, 'stroke-dasharray': isCache ? '' : '5 3', 'class': 'range-' + mk[0]}));
      var s = document.createElement('span');
      var sw = document.createElement('i');
      sw.style.background = COLORS[isCache ? 'cache' : mk[0]];
      s.appendChild(sw);
      s.appendChild(document.createTextNode(mk[0] + ' ' + num(mk[1]) + ' (clips ' + clip(mk[2], mk[3]) +
        ', step ' + num(mk[1] / 127) + ')'));
      s.className = 'mark-' + mk[0].replace('/', '');
      if (isCache) s.style.fontWeight = '600';
      legend.appendChild(s);
    });
    var sel = document.querySelectorAll('#tensor-table tr.sel');
    for (k = 0; k < sel.length; k++) sel[k].classList.remove('sel');
    var tr = document.getElementById('row-' + i);
    if (tr) tr.classList.add('sel');
  }
  part('histogram view', function () { rows.forEach(function (r, i) {
    var o = document.createElement('option');
    o.value = String(i);
    o.textContent = r.name + (r.quantized === false ? '  (not quantized)'
      : (r.clipped ? '  (clips ' + clip(r.clipped, r.clipped_exact) + ')' : ''));
    pick.appendChild(o);
  });
  pick.addEventListener('change', function () { drawHist(Number(pick.value)); }); });

  // ------------------------------------------------------------------ sortable tensor table
  var COLS = [
    ['name', 'tensor', function (r) { return r.name; }],
    ['max', 'max |x|', function (r) { return r.max; }],
    ['amax', 'cache amax', function (r) { return r.amax; }],
    ['ratio', 'amax / max', function (r) { return r.amax_over_max; }],
    ['quantized', 'Q/DQ', function (r) { return r.quantized; }],
    ['clipped', 'clipped', function (r) { return r.clipped; }],
    ['step', 'INT8 step', function (r) { return r.step; }],
    ['zeros', 'zeros', function (r) { return r.zeros; }]
  ].concat(TABLE.filter(function (m) { return m.histogram; }).map(function (m) {
    return [m.name, m.name, function (r) { return r.ranges ? r.ranges[m.name] : null; }];
  }));
  part('tensor table', function () {
  var table = document.getElementById('tensor-table');
  var thead = table.querySelector('thead tr'), tbody = table.querySelector('tbody');
  var order = rows.map(function (r, i) { return i; });
  function fill() {
    clear(tbody);
    order.forEach(function (i) {
      var r = rows[i], tr = document.createElement('tr');
      tr.id = 'row-' + i;
      tr.className = 'pick';
      COLS.forEach(function (col) {
        var td = document.createElement('td'), v = col[2](r);
        if (col[0] === 'name') { td.className = 'name'; td.title = v; td.textContent = v; }
        else if (col[0] === 'quantized') td.textContent = v === true ? 'yes' : (v === false ? 'no' : '?');
        else if (col[0] === 'clipped') {
          td.textContent = clip(v, r.clipped_exact);
          if (v > CLIP_WARN) td.className = inScope(r) ? 'warn' : 'muted';
          if (!inScope(r)) td.title = 'not quantized by the Q/DQ model: what the cache range would clip';
        } else if (col[0] === 'zeros') td.textContent = pct(v);
        else td.textContent = num(v);
        tr.appendChild(td);
      });
      tr.addEventListener('click', function () { drawHist(i); document.getElementById('histogram').scrollIntoView(); });
      tbody.appendChild(tr);
    });
  }
  COLS.forEach(function (col) {
    var th = document.createElement('th');
    th.textContent = col[1];
    th.className = 'sort';
    th.addEventListener('click', function () {
      var dir = th.getAttribute('data-dir') === 'desc' ? 'asc' : 'desc';
      var ths = thead.querySelectorAll('th');
      for (var k = 0; k < ths.length; k++) ths[k].removeAttribute('data-dir');
      th.setAttribute('data-dir', dir);
      order.sort(function (a, b) {
        var x = col[2](rows[a]), y = col[2](rows[b]);
        if (x === y) return a - b;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        var s = (typeof x === 'string') ? x.localeCompare(y) : (x < y ? -1 : 1);
        return dir === 'asc' ? s : -s;
      });
      fill();
    });
    thead.appendChild(th);
  });
  fill();
  });

  // ------------------------------------------------------------------ per-layer sensitivity bars
  var lsvg = document.getElementById('layer-svg');
  if (lsvg && D.layers) part('per-layer sensitivity', function () {
    // rows come sorted by D.layers.metric (trtq.report.data.layer_section): bars and labels show
    // that metric, the second key (SQNR or its gain) beside it
    var loo = D.layers.mode === 'leave-one-out';
    var M = D.layers.metric, task = M.key === 'task_metric';
    var floatWhy = {};
    (D.float_layers || []).forEach(function (f) { floatWhy[f.node] = f.reason; });
    function val(v) { return v === 'inf' ? Infinity : (v === '-inf' ? -Infinity : v); }
    var lr = D.layers.rows.filter(function (r) { return r[M.key] !== null && r[M.key] !== undefined; });
    // bar length: the task metric lost (only this layer INT8) or kept (leave-one-out: the layer
    // float); without one, the error power the layer adds alone (10^(-SQNR/10)) or the gain in dB
    var cost = lr.map(function (r) {
      var v = val(r[M.key]);
      if (typeof v !== 'number' || isNaN(v)) return null;
      if (task) return loo ? v : 1 - v;
      if (!isFinite(v)) return loo ? null : 0;
      return loo ? Math.abs(v) : Math.pow(10, -v / 10);
    });
    var vmax = Math.max.apply(null, cost.filter(finite).concat([1e-30]));
    var rowH = 20, LW = 300, BW = 520, H2 = lr.length * rowH + 8;
    lsvg.setAttribute('viewBox', '0 0 ' + (LW + BW + 190) + ' ' + H2);
    function show(key, v) {
      if (key === 'task_metric') return num(v, 3);
      return num(v, 3) + ' dB' + (v === 'inf' ? ' (no measurable error)' : '');
    }
    lr.forEach(function (r, k) {
      var y = 6 + k * rowH, len = finite(cost[k]) ? BW * Math.max(cost[k], 0) / vmax : 0, f = r.node in floatWhy;
      lsvg.appendChild(el('text', {x: LW - 8, y: y + 13, 'text-anchor': 'end'}, r.node + ' (' + r.op_type + ')'));
      var bar = el('rect', {x: LW, y: y + 2, width: Math.max(1, len).toFixed(1), height: rowH - 6,
        fill: f ? '#f0ad4e' : '#5b8fc9', 'class': 'layer-bar'});
      bar.appendChild(el('title', {}, f ? 'left float: ' + floatWhy[r.node] : M.name));
      if (finite(cost[k]) && cost[k] > 0) lsvg.appendChild(bar);
      var label = el('text', {x: LW + len + 6, y: y + 13, 'class': 'layer-value'}, show(M.key, r[M.key])
        + (M.then_key ? '  \u00b7 ' + show(M.then_key, r[M.then_key]) : '') + (f ? '  (float)' : ''));
      lsvg.appendChild(label);
    });
    var how = loo ? 'with the layer left float, largest first' : 'with only this layer in INT8, lowest first';
    var bar = task ? (loo ? M.name + ' with the layer float' : '1 - ' + M.name)
      : (loo ? 'SQNR gained by keeping the layer float' : 'the error power it adds (10^(-SQNR/10))');
    document.getElementById('layer-caption').textContent = 'Sorted by ' + M.name + ' ' + how
      + (M.then_key ? ', then ' + (loo ? 'SQNR gain' : 'SQNR') : '') + '. Label: ' + M.name
      + (M.then_key ? ' \u00b7 ' + (loo ? 'SQNR gain' : 'SQNR') : '') + '; bar: ' + bar + '; orange: left float.';
  });

  part('histogram view', function () {
  var start = 0, best = -1;
  // start on the tensor that clips the most values (not the largest share of a tiny tensor)
  rows.forEach(function (r, i) {
    var lost = r.histogram && inScope(r) ? (r.clipped || 0) * r.values : -1;
    if (lost > best) { best = lost; start = i; }
  });
  drawHist(start);
  });
  if (!failed) document.body.setAttribute('data-rendered', 'ok');
})();
"""

ERROR_SINK = (
    "window.__trtqErrors=[];window.addEventListener('error',function(e){"
    "window.__trtqErrors.push(String(e.message));var b=document.getElementById('trtq-errors');"
    "if(b){b.hidden=false;b.textContent='report script error: '+window.__trtqErrors.join('; ');}"
    "document.documentElement.setAttribute('data-errors',window.__trtqErrors.join('; '));});"
)


def _e(v: Any) -> str:
    return html.escape("-" if v is None else str(v))


def _f(v: Any, fmt: str = "{:.4g}") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _e(v)  # "inf" / "nan" as trtq compare writes them
    return fmt.format(v)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _provenance(p: dict) -> str:
    rows = [
        ("model", f"{_e(p.get('model'))} <span class=muted>sha256 {_e((p.get('model_sha256') or '')[:16])}</span>"),
        (
            "data",
            f"{_e(p.get('samples'))} samples, fingerprint {_e((p.get('data_fingerprint') or '')[:16])}"
            + (f", merged from {_e(p.get('shards'))} shards" if p.get("shards") else ""),
        ),
        (
            "method",
            f"{_e(p.get('method'))} (percentile {_e(p.get('percentile'))}, {_e(p.get('num_bins'))} bins)"
            + (f"; histograms: {_e(p.get('histograms'))}" if p.get("histograms") else ""),
        ),
        ("cache", f"{_e(p.get('cache'))}: {_e(p.get('algorithm'))}, written for TensorRT {_e(p.get('trt_version'))}"),
        ("tools", f"calibrated by {_e(p.get('calibrated_by'))}; report by {_e(p.get('report_by'))}"),
        ("statistics", _e(p.get("stats") or "none (pass --stats for histograms)")),
    ]
    return _table(["", ""], [(_e(k), v) for k, v in rows], "kv")


_ACCURACY_COLUMNS = (
    ("name", "output", None),
    ("samples", "samples", None),
    ("top1_agreement", "top-1 agreement", "{:.4f}"),
    ("cosine_mean", "cosine mean", "{:.5f}"),
    ("cosine_min", "cosine min", "{:.5f}"),
    ("sqnr_db", "SQNR dB", "{:.2f}"),
    ("max_abs_error", "max abs err", "{:.4g}"),
)
_ACCURACY_HIDDEN = {"top1_matches", "mean_abs_error", "ref_max_abs"}


def _accuracy(a: dict) -> str:
    known = {k for k, _, _ in _ACCURACY_COLUMNS}
    extra = []  # metrics the compare JSON has beyond the usual ones (e.g. a task metric)
    for o in a["outputs"]:
        extra += [k for k in o if k not in known and k not in _ACCURACY_HIDDEN and k not in extra]
    cols = list(_ACCURACY_COLUMNS) + [(k, k.replace("_", " "), "{:.4g}") for k in extra]
    rows = [[_e(o.get(k)) if fmt is None else _f(o.get(k), fmt) for k, _, fmt in cols] for o in a["outputs"]]
    return (
        f"<p>runtime: <b>{_e(a.get('runtime'))}</b>; reference {_e(a.get('reference'))}, candidate "
        f"{_e(a.get('candidate'))}, {_e(a.get('samples'))} samples</p>" + _table([title for _, title, _ in cols], rows)
    )


def _latency(lat: dict) -> str:
    rows = [
        [
            _e(p.get("plan")),
            _e(p.get("precision")),
            _e(p.get("batch")),
            _f(p.get("median_ms"), "{:.3f}"),
            _f(p.get("p99_ms"), "{:.3f}"),
            _f(p.get("samples_per_s"), "{:.1f}"),
            _f(p.get("speedup_vs_first"), "{:.2f}x"),
        ]
        for p in lat["plans"]
    ]
    return f"<p>runtime: <b>{_e(lat.get('runtime'))}</b></p>" + _table(
        ["plan", "precision", "batch", "median ms", "p99 ms", "samples/s", "vs first"], rows
    )


CLIP_RULE = (
    "counted on the histogram: exact where the range is the max or a bin edge (max, percentile, mse); "
    "a range inside a bin (entropy) counts that whole bin, an upper bound marked \u2264."
)


def _clip_line(s: dict, scope: dict) -> str:
    """The summary's sentence on clipping: which tensors it covers, and which clip."""
    pct = f"{s['threshold'] * 100:g} %"
    if not s["with_histogram"]:
        return f"{s['tensors']} tensors (no statistics given: ranges only, nothing counted)"
    if s["quantized_only"]:
        head = (
            f"<b class=warn>{s['clipping']}</b> of the {s['quantized']} tensors the Q/DQ model quantizes "
            f"clip more than {pct} of their values ({s['tensors']} calibrated)"
        )
    else:
        head = (
            f"<b class=warn>{s['clipping']}</b> of {s['tensors']} calibrated tensors would clip more than {pct} "
            f"of their values; which of them run in INT8 is not known ({_e(scope.get('how'))}), so the list "
            "covers every calibrated tensor: pass --quantize (trtq quantize --json) to count only the quantized ones"
        )
    most = f"; most: {', '.join(_e(n) for n in s['most_clipped'])}" if s["most_clipped"] else ""
    other = s.get("other_range") or []
    if other:
        most += (
            f". <span class=warn>{len(other)} of them are quantized with another range than the cache's</span> "
            "(counted at the Q/DQ model's: re-measured by quantize, or the quantize JSON of another cache)"
        )
    return head + most


def render_html(report: dict) -> str:
    s = report.get("summary") or summary(report)
    p = report["provenance"]
    title = f"trtq calibration report: {p.get('model') or p.get('cache')}"
    parts: list[str] = []
    parts.append(
        f"<section id=summary><h2>Summary</h2><p id=clip-summary>{_clip_line(s, report.get('clip_scope') or {})}"
        "</p>" + _provenance(p) + "</section>"
    )
    parts.append(
        "<section id=histogram><h2>Histogram view</h2>"
        "<p><label>tensor <select id=tensor-pick></select></label> "
        "<span class=muted>(or click a row of the table)</span></p>"
        '<svg id=hist-svg width="100%" role="img" aria-label="histogram of |x|"></svg>'
        "<div id=hist-legend class=legend></div></section>"
    )
    parts.append(
        "<section id=tensors><h2>Tensors</h2><p class=muted>Click a column to sort. Q/DQ: whether the Q/DQ "
        "model quantizes the tensor (? without --quantize). clipped: share of values with |x| above the "
        "range (the Q/DQ pair's, else the cache's amax), "
        + CLIP_RULE
        + " INT8 step = amax / 127; "
        + " / ".join(m.name for m in METHODS.rows() if m.histogram)
        + ": the range that method picks on the same histogram.</p>"
        "<div class=scroll><table id=tensor-table><thead><tr></tr></thead><tbody></tbody></table>"
        "</div></section>"
    )
    if report.get("layers"):
        parts.append(
            "<section id=layers><h2>Per-layer sensitivity</h2><p class=muted id=layer-caption></p>"
            '<svg id=layer-svg width="100%"></svg></section>'
        )
    if report.get("float_layers") is not None:
        fl = report["float_layers"]
        parts.append(
            "<section id=float><h2>Layers left float</h2>"
            + (
                _table(["node", "why"], [[_e(f["node"]), _e(f["reason"])] for f in fl])
                if fl
                else "<p>none: every quantizable layer runs in INT8</p>"
            )
            + "</section>"
        )
    if report.get("accuracy"):
        parts.append("<section id=accuracy><h2>Accuracy</h2>" + _accuracy(report["accuracy"]) + "</section>")
    if report.get("latency"):
        parts.append("<section id=latency><h2>Latency</h2>" + _latency(report["latency"]) + "</section>")
    blob = json.dumps(report, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    table = json.dumps(
        [dict(m.describe(), color=PALETTE[i % len(PALETTE)]) for i, m in enumerate(METHODS.rows())],
        separators=(",", ":"),
    ).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style><script>{ERROR_SINK}</script></head>\n<body>"
        "<div id=trtq-errors hidden></div>"
        f"<header><h1>{_e(title)}</h1><p>{_e(p.get('calibrated_by'))} · {_e(p.get('algorithm'))} · "
        f"TensorRT {_e(p.get('trt_version'))}</p></header><main>\n"
        + "\n".join(parts)
        + f'\n</main><script type="application/json" id=trtq-data>{blob}</script>\n'
        f'<script type="application/json" id=trtq-methods>{table}</script>\n<script>{JS}</script>'
        "</body></html>\n"
    )
