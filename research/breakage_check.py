"""Does the suite notice a one-line break? Each case changes one line of the package on purpose (a scheme, a
kernel, an adapter's padding, a field the checkpoint saves) in a throw-away git worktree, runs the core
tests there (tests/adapters, tests/scheme, tests/kernels, tests/patch/test_conversion.py, slow ones included) and
records the tests that fail: none of these breaks may pass unnoticed.

    python research/breakage_check.py --out benchmarks/breakage.json     # about 10 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import ROOT, command, stamp, write_record

CASES = {  # name: (file, the line's text, the broken text)
    "scheme": ("src/retrofit/scheme/alibi.py", "(math.log2(n) - 3)", "(math.log2(n) - 2)"),
    "kernel": ("src/retrofit/kernels/cpu_flash_band.py", "(d >= 0) & (d < K)", "(d >= 0) & (d <= K)"),
    # the adapters' padding rule: positions counted over real tokens (OPT's own fallback rule in adapters/opt.py
    # is not live with transformers >= 5.2, whose OPTDecoder passes the position ids it counted itself)
    "padding": (
        "src/retrofit/adapters/inputs.py",
        "(m.cumsum(-1) - 1).masked_fill(m == 0, 1)",
        "(m.cumsum(-1)).masked_fill(m == 0, 1)",
    ),
    "save": ("src/retrofit/patch/conversion.py", '"kernel": kernel,', '"kernel": "auto",'),
}
TESTS = ["tests/adapters", "tests/scheme", "tests/kernels", "tests/patch/test_conversion.py"]


def run_case(name: str, file: str, line: str, broken: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "wt"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(wt), "HEAD"], check=True)
        try:
            path = wt / file
            text = path.read_text()
            if text.count(line) != 1:
                raise SystemExit(f"{name}: {line!r} is not exactly once in {file}")
            path.write_text(text.replace(line, broken))
            env = {**os.environ, "PYTHONPATH": str(wt / "src"), "OMP_NUM_THREADS": "1"}
            out = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q", *TESTS],
                cwd=wt,
                env=env,
                capture_output=True,
                text=True,
            ).stdout
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], check=False)
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    summary = next((s for s in reversed(out.splitlines()) if " passed" in s or " failed" in s), "")
    return {"case": name, "file": file, "line": line, "broken": broken, "failed": failed, "summary": summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "breakage.json"))
    p.add_argument("--cases", nargs="*", default=list(CASES))
    a = p.parse_args()
    rows = []
    for name in a.cases:
        rows.append(run_case(name, *CASES[name]))
        print(f"{name}: {len(rows[-1]['failed'])} tests fail ({rows[-1]['summary']})", flush=True)
    write_record(a.out, {"benchmark": "breakage", "command": command(__file__, sys.argv[1:]), **stamp(), "rows": rows})
    caught = all(r["failed"] for r in rows)
    print("every break was caught" if caught else "a break passed unnoticed")
    sys.exit(0 if caught else 1)


if __name__ == "__main__":
    main()
