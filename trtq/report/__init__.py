"""``trtq report``: one self-contained HTML file (and ``--json``) from a calibration and its results.

``data.py`` gathers and checks the inputs into one JSON-able dict; ``page.py`` renders it (inline
CSS, inline script drawing SVG, no network).
"""
