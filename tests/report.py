"""How a test's rank script reports results, and how the test reads them back.

A rank prints one line per result, `TAG <key words> <json>` (`report`), and the test collects
them into {key: value} (`tagged`, or `Result.tagged` on a job's result). The key says whose it
is (a rank, a rank and a mode), the JSON carries the whole value: a test compares whole tensors
and lists, not markers.
"""

from __future__ import annotations

import json
import re
import sys


def report(tag: str, *key, value) -> None:
    """Print `value` (a list or dict: JSON) under `tag` and `key` (words: a rank, a mode)."""
    if not isinstance(value, (list, tuple, dict)):
        raise TypeError(f"report: a value is a list or dict (tagged() finds it by its bracket), got {type(value)}")
    # one write: ranks share the launcher's pipe, and print() writes each word apart
    sys.stdout.write(" ".join([tag, *map(str, key), json.dumps(value)]) + "\n")
    sys.stdout.flush()


def tagged(output: str, tag: str) -> dict:
    """{key: value} from `TAG <key words> <json>` records; the ranks' lines may run together."""
    found, decoder = {}, json.JSONDecoder()
    for match in re.finditer(re.escape(tag) + r" ([\w ]+?) (?=[\[{])", output):
        found[match.group(1)], _ = decoder.raw_decode(output, match.end())
    return found
