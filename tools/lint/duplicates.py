"""The duplicate report of ``make lint``: code repeated between places, for a reader to
look at, never a failure (README, "Tests").

Pylint's ``symilar`` (pinned in constraints.txt) over the Python of src/, tests/ and
benchmarks/: blocks of 6 or more lines that are the same once comments, docstrings,
imports and signatures are left out. Prints where each block is and their count; the
whole report (the lines themselves) is in .venv/duplicates.txt. Exits 0 whatever it finds,
and says so when symilar is missing or fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIN_LINES = 6
FLAGS = ["-d", str(MIN_LINES), "-i", "--ignore-docstrings", "--ignore-imports",
         "--ignore-signatures"]  # fmt: skip
BLOCK = re.compile(r"^(\d+) similar lines in (\d+) files$")
PLACE = re.compile(r"^==(.+):\[(\d+):(\d+)\]$")


def main() -> int:
    symilar = Path(sys.executable).with_name("symilar")
    files = sorted(
        str(p.relative_to(ROOT))
        for d in ("src", "tests", "benchmarks")
        for p in (ROOT / d).rglob("*.py")
    )
    try:
        run = subprocess.run(
            [str(symilar), *FLAGS, *files], cwd=ROOT, capture_output=True, text=True, check=False
        )
    except OSError as error:
        print(f"duplicate report: not made ({symilar}: {error.strerror}; make venv installs it)")
        return 0
    report = ROOT / ".venv" / "duplicates.txt"
    if report.parent.is_dir():
        report.write_text(run.stdout)
    blocks: list[tuple[int, list[str]]] = []
    for line in run.stdout.splitlines():
        if m := BLOCK.match(line.strip()):
            blocks.append((int(m.group(1)), []))
        elif (m := PLACE.match(line.strip())) and blocks:
            path, start, end = m.groups()
            blocks[-1][1].append(f"{path}:{int(start) + 1}-{end}")
    if run.returncode != 0 and not blocks:
        print(f"duplicate report: symilar failed ({run.returncode}): {run.stderr.strip()[:300]}")
        return 0
    for size, places in blocks:
        print(f"  {size} lines: " + "  ~  ".join(places))
    print(
        f"duplicate report: {len(blocks)} blocks of {MIN_LINES} or more lines repeated"
        f" (pylint's symilar; the lines: {report.relative_to(ROOT)}). A report, not a failure."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
