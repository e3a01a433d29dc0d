#!/usr/bin/env python3
"""Fails the test command on any test ctest did not run, outside tests/skip_allowlist.txt.

    python3 scripts/check_skips.py JUNIT.xml ALLOWLIST [--have-gpu 0|1]

JUNIT.xml is `ctest --output-junit`'s report. A test counts as not run when its status is not "run"
(GoogleTest's GTEST_SKIP, matched by gtest_discover_tests' skip pattern even when the process
failed; SKIP_RETURN_CODE; DISABLED_ tests). Every such test is printed with its reason. ALLOWLIST
lines are `CONDITION PATTERN  # why`; CONDITION `no-gpu` allows the skip only when no GPU is
visible (--have-gpu 0), `always` allows it anywhere; PATTERN is an fnmatch pattern on the ctest
name. Exit 1 when an unallowed skip exists, the report is missing, or it holds no tests.
Standard library only (it runs before anything else is known to work).
"""
import fnmatch
import sys
import xml.etree.ElementTree as ET


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    junit, allowlist = argv[1], argv[2]
    have_gpu = "--have-gpu" in argv and argv[argv.index("--have-gpu") + 1] == "1"
    allowed = []
    with open(allowlist, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or parts[0] not in ("no-gpu", "always"):
                print(f"[skips] {allowlist}:{n}: expected 'no-gpu|always PATTERN', got {line!r}")
                return 1
            allowed.append((parts[0], parts[1]))
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"[skips] cannot read the ctest report {junit}: {e}")
        return 1
    cases = root.iter("testcase")
    total, not_run = 0, []
    for c in cases:
        total += 1
        if c.get("status") != "run":
            why = c.find("skipped")
            reason = why.get("message", "") if why is not None else c.get("status", "")
            out = (c.findtext("system-out") or "").strip().splitlines()
            detail = next((l for l in out if "SKIPPED" in l or "skipped" in l), "")
            not_run.append((c.get("name"), reason, detail))
    if total == 0:
        print(f"[skips] {junit} lists no tests")
        return 1
    bad = []
    for name, reason, detail in not_run:
        ok = any(fnmatch.fnmatchcase(name, pat) and (cond == "always" or (cond == "no-gpu" and not have_gpu))
                 for cond, pat in allowed)
        print(f"[skips] {'allowed ' if ok else 'NOT ALLOWED '}{name}: {reason} {detail}".rstrip())
        if not ok:
            bad.append(name)
    print(f"[skips] {total} tests, {len(not_run)} not run, {len(bad)} not allowed "
          f"(allow-list {allowlist}, GPU {'visible' if have_gpu else 'not visible'})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
