"""What torch's c10d suite ran on backend "mcr", from the JUnit XML files pytest wrote:

    python -m pytest tests/conformance --junitxml runs/c10d-2.xml
    python -m tests.conformance.summary runs/c10d-2.xml

A test counts as run when any class ran it (the "mcr" class or a persona's); the skipped ones
are those no class ran, grouped by the reason the "mcr" class gives.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def summarize(path: str) -> str:
    outcome, reasons = {}, {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome[name] = "failed"
        elif skipped is None:
            outcome.setdefault(name, "passed")
            if outcome[name] == "skipped":
                outcome[name] = "passed"
        else:
            outcome.setdefault(name, "skipped")
            if case.get("classname", "").endswith("TestC10dAsMcr"):
                reasons[name] = skipped.get("message", "").removeprefix("Skipped: ")
    counts = Counter(outcome.values())
    lines = [f"{path}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"]
    for name in sorted(n for n, o in outcome.items() if o == "failed"):
        lines.append(f"  FAILED {name}")
    for reason, n in Counter(reasons[n] for n, o in outcome.items() if o == "skipped").most_common():
        lines.append(f"  {n:4d} skipped: {reason}")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n".join(summarize(path) for path in sys.argv[1:]))
