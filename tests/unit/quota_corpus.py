"""Quota-header cases: (name, headers, expected (remaining, reset seconds) or None).

Times: responses are received at RECEIVED_AT; an epoch reset is RECEIVED_AT + 30 s.
Shared by the parser test and the adapter test against a real server.
"""

from __future__ import annotations

from datetime import datetime, timezone

RECEIVED_AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
EPOCH = int(RECEIVED_AT.timestamp())
DATE = "Sun, 01 Mar 2026 12:00:00 GMT"  # the response's own Date, equal to RECEIVED_AT

R = "RateLimit"
P = "RateLimit-Policy"
XR = "X-RateLimit-Remaining"
XT = "X-RateLimit-Reset"
XA = "X-RateLimit-Reset-After"
XL = "X-RateLimit-Limit"

Expected = tuple[int, float | None] | None

CORPUS: list[tuple[str, dict[str, str], Expected]] = [
    # -- IETF RateLimit, valid
    ("ietf-exhausted", {R: '"default";r=0;t=30'}, (0, 30.0)),
    ("ietf-left", {R: '"default";r=50;t=30'}, (50, 30.0)),
    ("ietf-two-policies-one-empty", {R: '"burst";r=5;t=1, "daily";r=0;t=3600'}, (0, 3600.0)),
    ("ietf-fewest-left-wins", {R: '"a";r=3;t=10, "b";r=1;t=5'}, (1, 5.0)),
    ("ietf-token-name", {R: "default;r=0;t=10"}, (0, 10.0)),
    ("ietf-no-reset", {R: '"x";r=0'}, (0, None)),
    ("ietf-reset-zero", {R: '"x";r=0;t=0'}, (0, 0.0)),
    ("ietf-legacy-dictionary", {R: "limit=100, remaining=0, reset=30"}, (0, 30.0)),
    ("ietf-legacy-left", {R: "remaining=5, reset=2"}, (5, 2.0)),
    ("ietf-short-dictionary", {R: "r=0;t=5"}, (0, 5.0)),
    ("ietf-with-policy", {R: '"x";r=10;t=60', P: '"x";q=100;w=60'}, (10, 60.0)),
    ("ietf-surrounding-spaces", {R: '   "x";r=0;t=5  '}, (0, 5.0)),
    ("ietf-partition-key", {R: '"x";r=0;t=5;pk=:cGFydGl0aW9uS2V5:'}, (0, 5.0)),
    ("ietf-large-remaining", {R: '"x";r=999999999999999;t=1'}, (999999999999999, 1.0)),
    ("ietf-both-empty-latest-reset", {R: '"x";r=0;t=5, "y";r=0;t=50'}, (0, 50.0)),
    ("ietf-bad-reset-kept-remaining", {R: '"x";r=0;t=-5'}, (0, None)),
    ("ietf-wins-over-x", {R: '"x";r=7;t=9', XR: "0", XT: "30"}, (7, 9.0)),
    ("ietf-bad-x-used", {R: '"x";r=-1;t=5', XR: "0", XT: "30"}, (0, 30.0)),
    # -- IETF RateLimit, malformed: ignored
    ("ietf-negative", {R: '"x";r=-1;t=5'}, None),
    ("ietf-decimal", {R: '"x";r=1.5;t=5'}, None),
    ("ietf-boolean", {R: '"x";r=?1;t=5'}, None),
    ("ietf-string", {R: '"x";r="0";t=5'}, None),
    ("ietf-no-remaining", {R: '"x";t=10'}, None),
    ("ietf-bare-token", {R: "garbage"}, None),
    ("ietf-double-semicolon", {R: '"x";r=0;;t=5'}, None),
    ("ietf-trailing-comma", {R: '"x";r=0;t=5,'}, None),
    ("ietf-non-ascii-digit", {R: '"x";r=\u0663;t=5'}, None),
    ("ietf-overlong", {R: '"x";r=0;t=5, ' + ", ".join(f'"p{i}";r=1;t=1' for i in range(30))}, None),
    ("ietf-empty", {R: ""}, None),
    ("ietf-integer-too-long", {R: '"x";r=0;t=99999999999999999'}, None),
    ("ietf-one-bad-member", {R: '"x";r=0;t=5, "y";r=garbage('}, None),
    ("ietf-uppercase-key", {R: '"x";R=0;t=5'}, None),
    ("ietf-space-before-parameter", {R: '"x" ;r=0'}, None),
    ("ietf-control-character", {R: '"x";r=0;t=5\x01'}, None),
    # -- X-RateLimit-*, valid
    ("x-epoch-reset", {XR: "0", XT: str(EPOCH + 30), "Date": DATE}, (0, 30.0)),
    ("x-delta-reset", {XR: "0", XT: "30"}, (0, 30.0)),
    ("x-reset-after-decimal", {XR: "0", XA: "1.5"}, (0, 1.5 + 0.1)),  # at its latest: one unit more
    ("x-left", {XR: "10", XT: "30"}, (10, 30.0)),
    ("x-epoch-in-the-past", {XR: "0", XT: str(EPOCH - 30), "Date": DATE}, (0, 0.0)),
    ("x-no-reset", {XR: "0"}, (0, None)),
    ("x-reset-after-wins", {XR: "0", XA: "2", XT: str(EPOCH + 30)}, (0, 2.0)),
    ("x-spaces", {XR: " 0 ", XT: "\t30\t"}, (0, 30.0)),
    ("x-with-limit", {XR: "0", XT: "30", XL: "60"}, (0, 30.0)),
    (
        "x-epoch-against-the-date",
        {XR: "0", XT: str(EPOCH + 130), "Date": "Sun, 01 Mar 2026 12:01:40 GMT"},
        (0, 30.0),
    ),
    ("x-decimal-delta", {XR: "0", XT: "1.5"}, (0, 1.5 + 0.1)),
    ("x-leading-zeros", {XR: "00", XT: "30"}, (0, 30.0)),
    ("x-bad-date-uses-receipt", {XR: "0", XT: str(EPOCH + 30), "Date": "yesterday"}, (0, 30.0)),
    # -- X-RateLimit-*, malformed: ignored (never read as 0)
    ("x-negative", {XR: "-1", XT: "30"}, None),
    ("x-decimal-remaining", {XR: "1.5", XT: "30"}, None),
    ("x-empty", {XR: "", XT: "30"}, None),
    ("x-word", {XR: "abc", XT: "30"}, None),
    ("x-repeated", {XR: "0, 0", XT: "30"}, None),
    ("x-arabic-digit", {XR: "\u0660", XT: "30"}, None),
    ("x-plus-sign", {XR: "+5", XT: "30"}, None),
    ("x-overlong", {XR: "1" * 70, XT: "30"}, None),
    ("x-bad-reset", {XR: "0", XT: "soon"}, (0, None)),
    ("x-negative-reset", {XR: "0", XT: "-5"}, (0, None)),
    ("x-exponent-reset-after", {XR: "0", XA: "1e3"}, (0, None)),
    ("x-repeated-reset", {XR: "0", XT: "30, 30"}, (0, None)),
    ("x-too-many-decimals", {XR: "0", XA: "0.0000000001"}, (0, None)),
    ("x-exponent-reset", {XR: "0", XT: "1e9"}, (0, None)),
    # -- nothing
    ("no-headers", {}, None),
    ("only-limit", {XL: "60"}, None),
]
