"""The figures the README states about its first two lines, checked against what this CI run measured:
the quickstart's and the tests' minutes (upper bounds for an idle 2-core machine) and the test count (within
10%). Exit 1 when a figure no longer holds, saying which and what was measured, so the README is corrected in
the same change. The minutes are bounds for an idle machine: when other processes took more than a quarter of
the machine's CPU time during the two lines (--others, measured by .ci/run from /proc: the machine's busy CPU
time less the run's own), the run says so and checks the count alone, since a busy machine's minutes say nothing
of an idle one's (the README states the busy figures it measured beside the bounds).

    python .ci/readme_figures.py --quickstart-s 130 --tests-s 655 --tests 3702 --others 0.02
"""

import argparse
import pathlib
import re
import sys

BUSY = 0.25  # other processes took more than this share of the machine's CPU time: the minutes are not checked
SENTENCE = re.compile(r"first line takes under (\d+) min.*?second\s+under (\d+) min \(about ([\d,]+) tests\)", re.S)


def stated(readme: str) -> tuple[int, int, int]:
    m = SENTENCE.search(readme)
    if not m:
        sys.exit("README.md states no 'first line takes under N min ... second under M min (about K tests)'")
    return int(m.group(1)), int(m.group(2)), int(m.group(3).replace(",", ""))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quickstart-s", type=float, required=True)
    p.add_argument("--tests-s", type=float, required=True)
    p.add_argument("--tests", type=int, required=True, help="tests run (passed + skipped + failed)")
    p.add_argument("--others", type=float, default=0.0, help="share of the machine's CPU time other processes took")
    a = p.parse_args()
    busy = a.others > BUSY
    q_min, t_min, count = stated((pathlib.Path(__file__).parents[1] / "README.md").read_text())
    problems = []
    if a.quickstart_s > q_min * 60 and not busy:
        problems.append(f"the quickstart took {a.quickstart_s / 60:.1f} min; the README says under {q_min} min")
    if a.tests_s > t_min * 60 and not busy:
        problems.append(f"the tests took {a.tests_s / 60:.1f} min; the README says under {t_min} min")
    if abs(a.tests - count) > 0.1 * count:
        problems.append(f"{a.tests:,} tests ran; the README says about {count:,}")
    print(
        f"README figures: quickstart {a.quickstart_s / 60:.1f} min (stated under {q_min}), tests "
        f"{a.tests_s / 60:.1f} min (under {t_min}), {a.tests:,} tests (about {count:,})"
    )
    if busy:
        print(
            f"the machine was busy (other processes took {a.others:.0%} of its CPU time): the minutes, bounds for "
            "an idle machine, are not checked"
        )
    for line in problems:
        print(f"README figure out of date: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
