#!/usr/bin/env python3
"""Part of CPython's own test suite (Debian's libpython3.11-testsuite), run without the
agent and under it at the same time, and the outcome of every test case compared.

    pysuite.py LIB OUTDIR [VAR=VALUE...]

LIB is preloaded in the second run with the variables given (CONTPROF_ALLOC_RATE=1: every
allocation sampled); the agent's windows go to OUTDIR. Prints one line per run and the
test cases whose outcome differs; exits 1 if any does, or if a run found no test case."""
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

# Modules that run in about 25 s of CPU natively (one worker) and allocate much: strings,
# containers, parsers, pickling, compression, hashing. (test_calendar, test_datetime and
# test_decimal are left out for their time: 37 s alone under the agent at rate 1.)
MODULES = """test_json test_collections test_re test_string test_list test_dict test_set
test_bytes test_unicode test_itertools test_functools test_heapq test_bisect test_struct
test_array test_textwrap test_base64 test_binascii test_hashlib test_zlib test_pickle
test_csv test_difflib test_fractions test_statistics test_enum test_dataclasses test_typing
test_math test_random test_sort test_deque test_ordered_dict test_operator test_copy
test_tuple test_format test_fstring test_grammar test_codecs test_long test_float
test_userdict test_userlist test_weakref test_contextlib test_fnmatch test_shlex test_html
test_xml_etree test_email test_argparse test_configparser test_uuid test_ipaddress
test_urlparse""".split()


def outcomes(path):
    """{test case: passed|failure|error|skipped} from regrtest's JUnit XML."""
    res = {}
    for tc in ET.parse(path).iter("testcase"):
        kind = "passed"
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                kind = child.tag
        res[tc.get("classname", "") + "." + tc.get("name", "")] = kind
    return res


def start(name, outdir, extra):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CONTPROF_ALLOC_RATE")}
    env.update(extra)
    xml = os.path.join(outdir, name + ".xml")
    log = open(os.path.join(outdir, name + ".log"), "w")
    # PYSUITE_MODULES (space-separated): a part of the list, for a test that needs less
    modules = os.environ.get("PYSUITE_MODULES", "").split() or MODULES
    cmd = [sys.executable, "-m", "test", "-j1", "--junit-xml", xml] + modules
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), xml, log


def main():
    lib, outdir = sys.argv[1], sys.argv[2]
    extra = dict(a.split("=", 1) for a in sys.argv[3:])
    os.makedirs(os.path.join(outdir, "windows"), exist_ok=True)
    agent = {"LD_PRELOAD": lib, "CONTPROF_OUTPUT_DIR": os.path.join(outdir, "windows"), **extra}
    t0 = time.monotonic()
    runs = {"without": start("without", outdir, {}), "agent": start("agent", outdir, agent)}
    res = {}
    for name, (p, xml, log) in runs.items():
        rc = p.wait(timeout=600)
        log.close()
        res[name] = outcomes(xml) if os.path.exists(xml) else {}
        counts = {}
        for kind in res[name].values():
            counts[kind] = counts.get(kind, 0) + 1
        print("%s: exit %d after %.0f s, %d test cases %s" % (
            name, rc, time.monotonic() - t0, len(res[name]), sorted(counts.items())))
    a, b = res["without"], res["agent"]
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    for k in diff[:50]:
        print("differs: %s: %s without the agent, %s under it" % (k, a.get(k), b.get(k)))
    windows = [f for f in os.listdir(os.path.join(outdir, "windows")) if ".alloc." in f]
    print("%d test cases differ; the agent wrote %d alloc profiles" % (len(diff), len(windows)))
    if diff or not a or not b or not windows:
        for name in runs:
            with open(os.path.join(outdir, name + ".log")) as f:
                print("---- %s run's log, last lines:\n%s" % (name, "".join(f.readlines()[-30:])))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
