"""trtq.formatting: the one way a possibly missing or non-finite number is written."""

import json
import math

from trtq.formatting import format_number, json_number


def test_format_number_names_what_is_not_a_number():
    assert [format_number(v) for v in (None, math.nan, math.inf, -math.inf)] == ["-", "nan", "inf", "-inf"]
    assert format_number(0.000123456789) == "0.000123457"
    assert format_number(3.14159, ".2f") == "3.14"


def test_json_number_is_strict_json():
    values = [json_number(v) for v in (None, math.nan, -math.inf, 2, 0.5)]
    assert values == [None, "nan", "-inf", 2.0, 0.5]
    assert json.loads(json.dumps(values, allow_nan=False)) == values
