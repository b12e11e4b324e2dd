#!/usr/bin/python3
"""Mutation checks: deliberate defects that the test suite must catch (issue 22).

Every tests/mutation/mutants/*.mut describes one mutant: a source file, an exact anchor text
and its replacement (or, for an injected failure, only environment overrides), the targets to
rebuild and the tests that must fail. The driver copies the working tree to a scratch
directory, configures one CMake build there and builds it once; then for each mutant it
mutates the copy, lets ninja rebuild only what changed, runs only the listed tests (with the
environment ctest gives them, and DSI_TEST_FILTER for a cmocka subset) and puts the file back.
Mutants run grouped by file, headers last (fewer rebuilds); the report lists them that way.

A mutant is killed when every listed test fails (exit status neither 0 nor 77: a skip is not
a kill). A mutant whose code runs only on some CPUs names their /proc/cpuinfo flags in a
'needs:' line; on a CPU without them it is skipped with that reason (neither killed nor
survived: the mutated code never runs there) and left out of the count. The run fails if any
mutant survives, does not compile, or if its anchor is not
found exactly once in its file — after a refactor, update the mutant's anchor instead of
losing the check. Before the mutants, each listed test runs once on the unmutated copy and
must pass (else a "kill" would mean nothing) — unless --baselines-from names a ctest log of
the same tree (scripts/test-all.sh: its CMake stage) in which that test passed.

Usage: /usr/bin/python3 tests/mutation/run.py --out DIR [--jobs N] [--only NAME ...]
       [--baselines-from CTEST_LOG]
Mutant file format (see the files; '#' lines are comments):
    what: one line for the report
    file: path relative to the repository root          (absent for injected failures)
    build: more ninja targets to rebuild (the tests' own executables always are)
    test: CTEST_NAME [CMOCKA_FILTER]                     (one line per test)
    env: NAME=VALUE                                      (optional; @MUTATION_DIR@ expands)
    needs: CPU_FLAG ...                                  (optional: /proc/cpuinfo flags the
                                                          mutated code needs to run at all)
    <<< anchor
    exact text, as many lines as needed
    === replace
    replacement text
    >>>
"""

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class MutantError(Exception):
    pass


def parse_mutant(path):
    m = {"name": os.path.basename(path)[:-4], "path": path, "what": "", "file": None,
         "build": [], "tests": [], "env": {}, "needs": [], "anchor": None, "replace": None}
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        ln = lines[i]
        i += 1
        if not ln.strip() or ln.startswith("#"):
            continue
        if ln == "<<< anchor":
            block = []
            while i < len(lines) and lines[i] != "=== replace":
                block.append(lines[i])
                i += 1
            rep = []
            i += 1
            while i < len(lines) and lines[i] != ">>>":
                rep.append(lines[i])
                i += 1
            if i >= len(lines):
                raise MutantError("%s: '<<< anchor' without '=== replace' ... '>>>'" % path)
            i += 1
            m["anchor"] = "\n".join(block) + "\n"
            m["replace"] = "\n".join(rep) + "\n"
            continue
        key, _, val = ln.partition(":")
        val = val.strip()
        if key == "what":
            m["what"] = val
        elif key == "file":
            m["file"] = val
        elif key == "build":
            m["build"] += val.split()
        elif key == "test":
            parts = val.split(None, 1)
            m["tests"].append((parts[0], parts[1] if len(parts) > 1 else None))
        elif key == "env":
            k, _, v = val.partition("=")
            m["env"][k] = v.replace("@MUTATION_DIR@", HERE)
        elif key == "needs":
            m["needs"] += val.split()
        else:
            raise MutantError("%s: unknown line %r" % (path, ln))
    if not m["tests"]:
        raise MutantError("%s: no 'test:' line" % path)
    if m["file"] and m["anchor"] is None:
        raise MutantError("%s: a source mutant needs an anchor block" % path)
    if not m["file"] and not m["env"]:
        raise MutantError("%s: neither a source change nor an injected environment" % path)
    return m


def cpu_flags():
    """The CPU's feature flags (the first 'flags' line of /proc/cpuinfo), or None where that
    cannot be read (then every mutant runs)."""
    try:
        for ln in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            key, _, val = ln.partition(":")
            if key.strip() == "flags":
                return set(val.split())
    except OSError:
        pass
    return None


def missing_needs(m, flags):
    """The 'needs:' flags this CPU lacks (empty: the mutant runs)."""
    if flags is None:
        return []
    return [f for f in m["needs"] if f not in flags]


def check_anchor(m):
    """The anchor must occur exactly once in the (unmutated) file."""
    if not m["file"]:
        return
    p = os.path.join(ROOT, m["file"])
    if not os.path.isfile(p):
        raise MutantError("mutant %s: %s does not exist (moved? update %s)"
                          % (m["name"], m["file"], m["path"]))
    n = open(p, encoding="utf-8").read().count(m["anchor"])
    if n != 1:
        raise MutantError("mutant %s: its anchor occurs %d times in %s (expected once): the "
                          "code changed — update the anchor in %s so the check is kept\n"
                          "anchor:\n%s" % (m["name"], n, m["file"], m["path"], m["anchor"]))


def tree_files():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True).stdout
        return [f for f in out.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, fs in os.walk(ROOT):
            rel = os.path.relpath(d, ROOT)
            dirs[:] = [x for x in dirs if not x.startswith(("build", ".git"))]
            files += [os.path.normpath(os.path.join(rel, f)) for f in fs]
        return files


def sync_tree(dst):
    """Copies the working tree to dst, touching only files whose bytes differ (so the build
    there stays incremental from one run to the next)."""
    n = 0
    for f in tree_files():
        s, d = os.path.join(ROOT, f), os.path.join(dst, f)
        data = open(s, "rb").read()
        if os.path.isfile(d) and open(d, "rb").read() == data:
            continue
        os.makedirs(os.path.dirname(d), exist_ok=True)
        with open(d, "wb") as fh:
            fh.write(data)
        shutil.copymode(s, d)
        n += 1
    return n


def run(cmd, log, **kw):
    with open(log, "a") as fh:
        fh.write("\n$ %s\n" % " ".join(cmd))
        fh.flush()
        return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, **kw).returncode


def ctest_info(build):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                         capture_output=True).stdout
    info = {}
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = {}
        for kv in props.get("ENVIRONMENT", []):
            k, _, v = kv.partition("=")
            env[k] = v
        info[t["name"]] = {"command": t.get("command"), "env": env,
                           "cwd": props.get("WORKING_DIRECTORY", build)}
    return info


def targets_of(m, info, build):
    """Ninja targets a mutant needs rebuilt: its 'build:' list and its tests' executables.
    A test run by a program from outside the build (a Python script under DSI_PYTHON) has no
    executable of its own: the mutant's 'build:' line names what it runs."""
    t = list(m["build"])
    for name, _ in m["tests"]:
        if name not in info:
            raise MutantError("test %s is not in the mutation build's ctest list" % name)
        # ctest names the executable once it is built; until then the test's target is
        # named like the test (dsi_add_unit_test)
        cmd = info[name]["command"]
        if cmd and os.path.isabs(cmd[0]) and \
                not os.path.realpath(cmd[0]).startswith(os.path.realpath(build) + os.sep):
            continue
        exe = os.path.basename(cmd[0]) if cmd else name
        if exe not in t:
            t.append(exe)
    return t


def run_test(info, name, filt, extra_env, log, timeout):
    """Runs one test the way ctest would, plus extra_env. Returns (status, seconds)."""
    t = info.get(name)
    if not t or not t["command"]:
        raise MutantError("test %s is not in the mutation build's ctest list" % name)
    env = dict(os.environ)
    env.update(t["env"])
    env.pop("DSI_TEST_FILTER", None)
    if filt:
        env["DSI_TEST_FILTER"] = filt
    env.update(extra_env)
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write("\n$ %s%s %s\n" % (" ".join("%s=%s" % kv for kv in extra_env.items()),
                                    " DSI_TEST_FILTER=" + filt if filt else "",
                                    " ".join(t["command"])))
        fh.flush()
        try:
            rc = subprocess.run(t["command"], cwd=t["cwd"], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            fh.write("TIMEOUT after %d s\n" % timeout)
            rc = "timeout"
    return rc, time.time() - t0


def cpu_seconds():
    """CPU time of the finished child processes so far (builds and tests)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="scratch directory (source copy, build, logs)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", nargs="*", help="mutant names (file names without .mut)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    ap.add_argument("--baselines-from", metavar="CTEST_LOG",
                    help="ctest output of an unmutated build of the same tree: tests it shows "
                         "passed (the whole program) need no baseline run here")
    args = ap.parse_args()
    t_start = time.time()
    out = os.path.abspath(args.out)
    src, build = os.path.join(out, "src"), os.path.join(out, "build")
    log = os.path.join(out, "mutation.log")
    os.makedirs(src, exist_ok=True)
    open(log, "w").close()

    try:
        mutants = [parse_mutant(p) for p in sorted(glob.glob(os.path.join(HERE, "mutants", "*.mut")))]
        if args.only:
            mutants = [m for m in mutants if m["name"] in args.only]
        if not mutants:
            raise MutantError("no mutants selected")
        for m in mutants:  # all anchors first: a stale one fails before any build
            check_anchor(m)
    except MutantError as ex:
        print("mutation: ERROR: %s" % ex)
        return 1

    flags = cpu_flags()
    skipped = [(m, missing_needs(m, flags)) for m in mutants if missing_needs(m, flags)]
    for m, lack in skipped:
        print("  %-28s skipped: this CPU lacks %s (the mutated code never runs here) — %s"
              % (m["name"], " ".join(lack), m["what"]))
    mutants = [m for m in mutants if not missing_needs(m, flags)]
    if not mutants:
        print("mutation: 0 of 0 mutants killed; %d skipped (the CPU lacks what they need)"
              % len(skipped))
        return 0
    print("mutation: %d mutants; copying the tree to %s" % (len(mutants), src))
    print("  %d files copied or updated" % sync_tree(src))
    t0 = time.time()
    if not os.path.isfile(os.path.join(build, "build.ninja")):
        rc = run(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                  "-DDSI_WERROR=ON", "-DDSI_VULKAN=auto", "-DDSI_CUDA=off"], log)
        if rc != 0:
            print("mutation: ERROR: configure failed (see %s)" % log)
            return 1
    info = ctest_info(build)
    try:
        targets = sorted({t for m in mutants for t in targets_of(m, info, build)} |
                         {"dsinfer-models"})
    except MutantError as ex:
        print("mutation: ERROR: %s" % ex)
        return 1
    if run(["cmake", "--build", build, "-j%d" % args.jobs, "--target"] + targets, log) != 0:
        print("mutation: ERROR: the unmutated copy does not build (see %s)" % log)
        return 1
    info = ctest_info(build)  # now with the executables' paths
    print("  build of %d targets: %.0f s" % (len(targets), time.time() - t0))

    # baselines: every (test, filter) passes on the unmutated copy
    seen = set()
    if args.baselines_from:
        import re
        passed = set()
        try:
            for ln in open(args.baselines_from, encoding="utf-8", errors="replace"):
                mt = re.search(r"Test +#[0-9]+: (\S+) \.+ +Passed", ln)
                if mt:
                    passed.add(mt.group(1))
        except OSError as ex:
            print("mutation: ERROR: --baselines-from: %s" % ex)
            return 1
        for m in mutants:
            for name, filt in m["tests"]:
                if name in passed and (name, filt) not in seen:
                    seen.add((name, filt))
                    print("  baseline %-28s %-30s passed in %s" % (name, filt or "",
                                                                   args.baselines_from))
    for m in mutants:
        for name, filt in m["tests"]:
            if (name, filt) in seen:
                continue
            seen.add((name, filt))
            rc, dt = run_test(info, name, filt, {}, log, args.timeout)
            print("  baseline %-28s %-30s %s (%.0f s)" % (name, filt or "", "passes" if rc == 0
                                                          else "FAILS (status %s)" % rc, dt))
            if rc != 0:
                print("mutation: ERROR: %s does not pass unmutated (see %s)" % (name, log))
                return 1

    results = []
    print("  baselines done: %.0f s since the start (%.0f s CPU)" % (time.time() - t_start,
                                                                       cpu_seconds()))
    # Order of the runs: a mutant's build also rebuilds what the previous mutant's file (just
    # put back) feeds. So the mutants of one file run one after another, and the headers last:
    # the CPU kernel headers feed every kernel file, and after the last mutant nothing is
    # rebuilt (in file order, the restores after them cost a full kernel rebuild each).
    mutants.sort(key=lambda m: (1 if (m["file"] or "").endswith(".h") else 0,
                                m["file"] or "", m["name"]))
    for m in mutants:
        t0, c0 = time.time(), cpu_seconds()
        path = os.path.join(src, m["file"]) if m["file"] else None
        pristine = open(path, encoding="utf-8").read() if path else None
        verdict, detail = "killed", []
        try:
            if path:
                if pristine.count(m["anchor"]) != 1:  # the copy is the tree: checked above
                    raise MutantError("anchor not found once in the copy of %s" % m["file"])
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(pristine.replace(m["anchor"], m["replace"]))
            # always: an earlier mutant may have left these executables built mutated
            if run(["cmake", "--build", build, "-j%d" % args.jobs, "--target"] +
                   targets_of(m, info, build), log) != 0:
                raise MutantError("does not compile (update %s)" % m["path"])
            for name, filt in m["tests"]:
                rc, dt = run_test(info, name, filt, m["env"], log, args.timeout)
                dead = rc not in (0, 77)
                detail.append("%s%s: %s" % (name, "[" + filt + "]" if filt else "",
                                            "failed (status %s)" % rc if dead else
                                            "PASSED" if rc == 0 else "SKIPPED"))
                if not dead:
                    verdict = "SURVIVED"
        except MutantError as ex:
            verdict, detail = "ERROR", [str(ex)]
        finally:
            if path:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(pristine)
        dt = time.time() - t0
        results.append((m, verdict, detail, dt))
        print("  %-28s %-8s %4.0f s (%3.0f s CPU)  %s — %s" % (
            m["name"], verdict, dt, cpu_seconds() - c0, m["what"], "; ".join(detail)))

    bad = [r for r in results if r[1] != "killed"]
    print("mutation: %d of %d mutants killed, %.0f s in all (%.0f s CPU)%s%s" % (
        len(results) - len(bad), len(results), time.time() - t_start, cpu_seconds(),
        "" if not skipped else "; %d skipped (the CPU lacks what they need: %s)" % (
            len(skipped), ", ".join(m["name"] for m, _ in skipped)),
        "" if not bad else "; NOT KILLED: " + ", ".join(r[0]["name"] for r in bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
