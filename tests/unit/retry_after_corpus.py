"""Retry-After values and the verdict RFC 9110 (as this package reads it) gives each.

``CORPUS`` is a plain list of ``(value, verdict)`` tuples. ``verdict`` is either the
string ``"invalid"`` (``INVALID``) or the expected delay in seconds (a float) for a
response received at ``RECEIVED_AT`` (2026-03-01 12:00:00 UTC, a Sunday) that carries
no ``Date`` header. Date verdicts are therefore relative to ``RECEIVED_AT``: a date in
the past gives 0; a test that receives the response at another instant must shift its
expectation by the difference (or send a ``Date`` header equal to ``RECEIVED_AT``,
which gives the same delays, measured against the server's clock instead).

RFC 850 two-digit years are read relative to ``RECEIVED_AT`` too: the year with those
digits that is not more than 50 years ahead, so ``76`` is 2076 up to
2076-03-01 12:00:00 and 1976 after it.

Not every value can travel in a real HTTP header: ``HEADER_SAFE`` is the sub-list that
keeps its verdict when a real server sends it (not empty, no control characters or
line separators, no leading or trailing whitespace, which the transport trims, and at
most 8 KB). Its non-ASCII values must be sent as UTF-8 bytes; a client reads them as
Latin-1 text, which is just as invalid.
"""

from __future__ import annotations

from datetime import datetime, timezone

RECEIVED_AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
INVALID = "invalid"


def _until(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    """Seconds from RECEIVED_AT to the given UTC instant, or 0 when it is not ahead."""
    moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    return max(0.0, (moment - RECEIVED_AT).total_seconds())


CORPUS: list[tuple[str, float | str]] = [
    # --- delay-seconds: ASCII digits, surrounding SP/HTAB trimmed ---------------------
    ("0", 0.0),
    ("1", 1.0),
    ("120", 120.0),
    ("3600", 3600.0),
    ("86400", 86400.0),
    ("  7\t", 7.0),
    ("\t30", 30.0),
    ("60 ", 60.0),
    (" \t 45 \t ", 45.0),
    ("007", 7.0),
    ("0000", 0.0),
    ("0" * 45 + "5", 5.0),  # leading zeros, 46 characters
    ("999999999999999", 999999999999999.0),
    ("1000000000000000", 1e15),  # the delay cap: larger numbers report 10**15 s
    ("9" * 40, 1e15),  # 40 digits: valid, defers to the far future
    ("1" + "0" * 39, 1e15),
    ("5" * 128, 1e15),  # exactly MAX_LENGTH characters
    (" " * 127 + "5", 5.0),  # MAX_LENGTH including the whitespace
    # --- signs, decimals, exponents, other notations ----------------------------------
    ("+5", INVALID),
    ("-5", INVALID),
    ("-0", INVALID),
    ("+0", INVALID),
    # A plain ASCII decimal (Shopify sends "2.0") is read as the next whole second up:
    # waiting longer is allowed, shorter never. Every other number form stays invalid.
    ("1.5", 2.0),
    ("2.0", 2.0),
    ("2.1", 3.0),
    ("5.0", 5.0),
    ("0.0", 0.0),
    ("0.001", 1.0),
    ("2.000000001", 3.0),
    ("007.00", 7.0),
    (" 2.5\t", 3.0),
    ("9" * 60 + ".5", 1e15),
    (".5", INVALID),
    ("5.", INVALID),
    (".", INVALID),
    ("1..5", INVALID),
    ("1.5.0", INVALID),
    ("-1.5", INVALID),
    ("+2.0", INVALID),
    ("1.5e3", INVALID),
    ("1,5", INVALID),
    ("1.5, 2.0", INVALID),
    ("1 .5", INVALID),
    ("\u0663.\u0660", INVALID),  # Arabic-Indic "3.0"
    ("2\u066b0", INVALID),  # ARABIC DECIMAL SEPARATOR
    ("2.\uff10", INVALID),  # FULLWIDTH DIGIT ZERO
    ("1e3", INVALID),
    ("1E3", INVALID),
    ("0x10", INVALID),
    ("1_000", INVALID),
    ("5s", INVALID),
    ("five", INVALID),
    ("inf", INVALID),
    ("NaN", INVALID),
    # --- Unicode digits (str.isdigit or int() would accept several of these) ---------
    ("\u0663", INVALID),  # ARABIC-INDIC DIGIT THREE
    ("\u0661\u0662\u0660", INVALID),  # Arabic-Indic "120"
    ("\u06f3", INVALID),  # EXTENDED ARABIC-INDIC DIGIT THREE
    ("\u0969", INVALID),  # DEVANAGARI DIGIT THREE
    ("\u09e9", INVALID),  # BENGALI DIGIT THREE
    ("\u0e53", INVALID),  # THAI DIGIT THREE
    ("\u00b2", INVALID),  # SUPERSCRIPT TWO
    ("\u2082", INVALID),  # SUBSCRIPT TWO
    ("\uff15", INVALID),  # FULLWIDTH DIGIT FIVE
    ("\uff11\uff12\uff10", INVALID),  # fullwidth "120"
    ("1\uff12\uff10", INVALID),  # ASCII and fullwidth mixed
    ("\U0001d7d3", INVALID),  # MATHEMATICAL BOLD DIGIT FIVE
    ("\u2460", INVALID),  # CIRCLED DIGIT ONE
    ("\u216b", INVALID),  # ROMAN NUMERAL TWELVE
    ("\u00bd", INVALID),  # VULGAR FRACTION ONE HALF
    ("12\u0663", INVALID),  # ASCII followed by an Arabic-Indic digit
    # --- empty, whitespace, control characters ----------------------------------------
    ("", INVALID),
    (" ", INVALID),
    ("\t", INVALID),
    (" \t \t", INVALID),
    ("5\r", INVALID),
    ("5\n", INVALID),
    ("\r\n5", INVALID),
    ("5\r\n", INVALID),
    ("5\x00", INVALID),
    ("\x005", INVALID),
    ("5\x7f", INVALID),  # DEL
    ("5\x0b", INVALID),  # VT
    ("5\x0c", INVALID),  # FF
    ("\x1b5", INVALID),  # ESC
    ("5\t5", INVALID),  # a tab inside the value
    ("5 5", INVALID),
    ("\u00a05", INVALID),  # NO-BREAK SPACE is not HTTP whitespace
    ("5\u2003", INVALID),  # EM SPACE
    ("5\u200b", INVALID),  # ZERO WIDTH SPACE
    ("\u30005", INVALID),  # IDEOGRAPHIC SPACE
    # --- repeated fields and comma lists ----------------------------------------------
    ("5, 5", INVALID),
    ("5,5", INVALID),
    ("5,", INVALID),
    (",5", INVALID),
    (",", INVALID),
    ("120, 60", INVALID),
    ("1,000", INVALID),
    ("5 ,5", INVALID),
    ("Sun, 01 Mar 2026 12:00:10 GMT, Sun, 01 Mar 2026 12:00:20 GMT", INVALID),
    ("Sun, 01 Mar 2026 12:00:10 GMT,Sun, 01 Mar 2026 12:00:10 GMT", INVALID),
    ("Sun, 01 Mar 2026 12:00:10 GMT, 5", INVALID),
    ("5, Sun, 01 Mar 2026 12:00:10 GMT", INVALID),
    ("Sun Mar  1 12:00:10 2026, 5", INVALID),
    # --- overlong values ---------------------------------------------------------------
    ("5" * 129, INVALID),
    (" " * 128 + "5", INVALID),  # over MAX_LENGTH before trimming
    ("5" * 10240, INVALID),  # 10 KB of digits
    ("x" * 10240, INVALID),
    ("Sun, 01 Mar 2026 12:02:00 GMT" + " " * 100, INVALID),
    # --- IMF-fixdate -------------------------------------------------------------------
    ("Sun, 01 Mar 2026 12:02:00 GMT", 120.0),
    (" Sun, 01 Mar 2026 12:02:00 GMT\t", 120.0),
    ("Sun, 01 Mar 2026 12:00:00 GMT", 0.0),  # now
    ("Sun, 01 Mar 2026 11:59:59 GMT", 0.0),  # one second ago
    ("Mon, 02 Mar 2026 12:00:00 GMT", 86400.0),
    ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # RFC 9110's example, in the past
    ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
    ("Wed, 31 Dec 1969 23:59:59 GMT", 0.0),  # before the Unix epoch: valid, past
    ("Mon, 01 Jan 1900 00:00:00 GMT", 0.0),
    ("Mon, 01 Jan 0001 00:00:00 GMT", 0.0),
    ("Fri, 31 Dec 9999 23:59:59 GMT", _until(9999, 12, 31, 23, 59, 59)),
    ("Sat, 01 Jan 10000 00:00:00 GMT", INVALID),
    ("Mon, 01 Jan 0000 00:00:00 GMT", INVALID),
    ("Tue, 29 Feb 2028 12:00:00 GMT", _until(2028, 2, 29, 12)),  # leap year
    ("Mon, 29 Feb 2027 12:00:00 GMT", INVALID),  # 2027 has no 29 February
    ("Tue, 29 Feb 2000 00:00:00 GMT", 0.0),  # 2000 is a leap year
    ("Thu, 29 Feb 1900 00:00:00 GMT", INVALID),  # 1900 is not
    ("Sun, 01 Mar 2026 12:00:60 GMT", 59.0),  # a leap second reads as :59
    ("Sat, 31 Dec 2016 23:59:60 GMT", 0.0),
    ("Sun, 01 Mar 2026 12:00:61 GMT", INVALID),
    ("Sun, 01 Mar 2026 12:60:00 GMT", INVALID),
    ("Mon, 02 Mar 2026 24:00:00 GMT", INVALID),
    ("Thu, 31 Apr 2026 12:00:00 GMT", INVALID),  # April has 30 days
    ("Sun, 00 Mar 2026 12:00:00 GMT", INVALID),
    ("Sun, 32 Mar 2026 12:00:00 GMT", INVALID),
    ("Mon, 01 Mar 2026 12:02:00 GMT", INVALID),  # 1 March 2026 is a Sunday
    ("Sun, 1 Mar 2026 12:02:00 GMT", INVALID),  # single-digit day
    ("Sun, 01 Mar 26 12:02:00 GMT", INVALID),  # two-digit year
    ("Sun, 01 Mar 02026 12:02:00 GMT", INVALID),
    ("Sun, 01 Mar 2026 12:02 GMT", INVALID),  # no seconds
    ("Sun, 01 Mar 2026 2:02:00 GMT", INVALID),
    ("Sun, 01 Mar 2026 12:02:00", INVALID),  # no zone
    ("Sun, 01 Mar 2026 12:02:00 UTC", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 UT", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 gmt", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 EST", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 Z", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 +0000", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 -0500", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 GMT+1", INVALID),
    ("Sun, 01 Mar 2026 12:02:00 GMT GMT", INVALID),
    ("sun, 01 Mar 2026 12:02:00 GMT", INVALID),  # names are case-sensitive
    ("Sun, 01 mar 2026 12:02:00 GMT", INVALID),
    ("SUN, 01 MAR 2026 12:02:00 GMT", INVALID),
    ("Sum, 01 Mar 2026 12:02:00 GMT", INVALID),  # misspelled day
    ("Sun, 01 Mrz 2026 12:02:00 GMT", INVALID),  # misspelled month
    ("Sun, 01 March 2026 12:02:00 GMT", INVALID),
    ("Sunday, 01 Mar 2026 12:02:00 GMT", INVALID),  # long day name in IMF form
    ("Sun 01 Mar 2026 12:02:00 GMT", INVALID),  # no comma
    ("Sun,  01 Mar 2026 12:02:00 GMT", INVALID),  # double space
    ("Sun, 01 Mar 2026  12:02:00 GMT", INVALID),
    ("Sun,\t01 Mar 2026 12:02:00 GMT", INVALID),  # tab inside
    ("Sun, 01 Mar 2026 12:02:00 GMT\r\n", INVALID),
    ("Sun, \uff10\uff11 Mar 2026 12:02:00 GMT", INVALID),  # fullwidth day digits
    ("Sun, 01 Mar \u0662\u0660\u0662\u0666 12:02:00 GMT", INVALID),  # Arabic-Indic year
    ("2026-03-01T12:02:00Z", INVALID),  # ISO 8601 is not an HTTP-date
    ("2026-03-01 12:02:00", INVALID),
    ("1772366520", 1772366520.0),  # a Unix timestamp is just a (long) delay in seconds
    # --- obsolete RFC 850 form ---------------------------------------------------------
    ("Sunday, 01-Mar-26 12:02:00 GMT", 120.0),
    ("Sunday, 06-Nov-94 08:49:37 GMT", 0.0),  # RFC 9110's example: 1994, in the past
    ("Sunday, 01-Mar-26 11:59:59 GMT", 0.0),
    ("Saturday, 01-Jan-00 00:00:00 GMT", 0.0),  # 2000
    # Century boundary: the horizon is RECEIVED_AT + 50 years = 2076-03-01 12:00:00.
    ("Sunday, 01-Mar-76 12:00:00 GMT", _until(2076, 3, 1, 12)),  # exactly 50 years: 2076
    ("Monday, 01-Mar-76 12:00:01 GMT", 0.0),  # one second past the horizon: 1976
    ("Sunday, 01-Mar-76 12:00:01 GMT", INVALID),  # read as 1976, a Monday
    ("Friday, 28-Feb-76 23:59:59 GMT", _until(2076, 2, 28, 23, 59, 59)),  # 2076
    ("Saturday, 06-Nov-76 08:49:37 GMT", 0.0),  # 1976 (2076 would be > 50 years ahead)
    ("Friday, 06-Nov-76 08:49:37 GMT", INVALID),  # 6 Nov 2076 is a Friday, but 76 -> 1976
    ("Tuesday, 31-Dec-75 23:59:59 GMT", _until(2075, 12, 31, 23, 59, 59)),
    ("Saturday, 01-Jan-77 00:00:00 GMT", 0.0),  # 1977
    ("Friday, 01-Jan-77 00:00:00 GMT", INVALID),  # 2077 is never chosen
    ("Sunday, 01-Mar-2026 12:02:00 GMT", INVALID),  # four-digit year
    ("Sun, 01-Mar-26 12:02:00 GMT", INVALID),  # short day name
    ("sunday, 01-Mar-26 12:02:00 GMT", INVALID),
    ("Sunday, 01-mar-26 12:02:00 GMT", INVALID),
    ("Sunday, 1-Mar-26 12:02:00 GMT", INVALID),
    ("Sunday, 01-Mar-26 12:02:00", INVALID),
    ("Sunday, 01-Mar-26 12:02:00 UTC", INVALID),
    ("Sunday, 01-Mar-26 12:02:00 -0000", INVALID),
    ("Monday, 01-Mar-26 12:02:00 GMT", INVALID),  # wrong weekday
    ("Sunday, 29-Feb-26 12:00:00 GMT", INVALID),
    # --- asctime form (no zone, always UTC) --------------------------------------------
    ("Sun Mar  1 12:02:00 2026", 120.0),
    ("Sun Mar 01 12:02:00 2026", 120.0),  # 2DIGIT day is also allowed
    ("Sun Nov  6 08:49:37 1994", 0.0),
    ("Tue Feb 29 12:00:00 2028", _until(2028, 2, 29, 12)),
    ("Sun Mar 1 12:02:00 2026", INVALID),  # single space before a one-digit day
    ("Sun Mar   1 12:02:00 2026", INVALID),
    ("Sun Mar  1 12:02:00 2026 GMT", INVALID),  # asctime carries no zone
    ("Sun Mar  1 12:02:00 26", INVALID),
    ("Sunday Mar  1 12:02:00 2026", INVALID),
    ("sun Mar  1 12:02:00 2026", INVALID),
    ("Sun mar  1 12:02:00 2026", INVALID),
    ("Mon Mar  1 12:02:00 2026", INVALID),  # wrong weekday
    ("Sun Mar  1 12:02 2026", INVALID),
    ("Mon Feb 29 12:00:00 2027", INVALID),
]


def _header_safe(value: str) -> bool:
    """Whether ``value`` keeps its verdict through a real HTTP/1.1 response header."""
    return (
        0 < len(value) <= 8192
        and value == value.strip(" \t")
        and not any(ord(c) < 0x20 or c == "\x7f" for c in value)
        and len(value.splitlines()) == 1
    )


HEADER_SAFE: list[tuple[str, float | str]] = [entry for entry in CORPUS if _header_safe(entry[0])]
