"""parse_json: the request body as a JSON object, by the fast parser, with the standard library's answers."""

from __future__ import annotations

import json

import pytest

from stagewise.server.app import MAX_JSON_DEPTH, parse_json
from stagewise.server.openai_errors import InvalidParam

_SAME = [
    b'{"a": 99999999999999999999999, "b": 1e400, "c": -Infinity, "d": -0, "e": 0.1, "f": 1E2}',
    b'{"a": 1, "a": 2}',
    b'{"a": "\\u0000\\u00e9\\ud83d\\ude00", "b": [true, false, null, {}, []]}',
    b' {"messages": [{"role": "user", "content": "hi"}]} ',
    '{"é": "ü"}'.encode(),
    json.dumps({"x": [0.1 * i for i in range(1000)], "y": "word " * 10_000}).encode(),
]


@pytest.mark.parametrize("data", _SAME, ids=range(len(_SAME)))
def test_bodies_parse_as_the_standard_library_parses_them(data: bytes) -> None:
    assert parse_json(data) == json.loads(data)


@pytest.mark.parametrize(("data", "words"), [
    (b'{"messages": [', "not valid JSON: Expecting value at line 1 column 15"),
    (b'\xff\xfe{}', "not UTF-8 text (byte 0)"),
    ('{"é": "ü"}'.encode("utf-16"), "not UTF-8 text (byte 0)"),  # which Python's parser would take
    ('{"a": 1}'.encode("utf-16-le"), "not valid JSON"),
    (b'\xef\xbb\xbf{"a": 1}', "starts with a byte-order mark"),  # which Python's parser would skip
    (b'{"a": "\xed\xa0\x80"}', "lone UTF-16 surrogate"),  # CESU-8 bytes: Python's parser takes them
    (b'{"x\\ud800": 1}', "lone UTF-16 surrogate"),
    (b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", f"nests deeper than {MAX_JSON_DEPTH} levels"),
    (b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", f"nests deeper than {MAX_JSON_DEPTH} levels"),
    (b'{"a": ' + b"9" * 5000 + b"}", "a number with too many digits"),
    (b"[1]", "must be a JSON object"),
    (b'"text"', "must be a JSON object"),
])
def test_bad_bodies_are_invalid_params_saying_what_is_wrong(data: bytes, words: str) -> None:
    with pytest.raises(InvalidParam) as caught:
        parse_json(data)
    assert words in str(caught.value) and "\n" not in str(caught.value)
