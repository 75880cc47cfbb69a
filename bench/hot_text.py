#!/usr/bin/env python3
"""Writes shim/hot_text.ld: the shim's functions that the agent loop (W12) runs, most used first.

    bench/hot_text.py [TURNS]   (run from the repository root after `cargo build --release`)

Runs TURNS (default 2) turns of bench/agent_loop.sh in a copy of a small git repository under
callgrind twice, with the release shim preloaded and under `aether-journal run` (whose
supervised exec path runs other code: the architecture check, the marked exec), collects every
function of the shim that any process executed, and orders them by how many processes executed
each. The linker script it writes puts them, in that order, right after the constructor's code
(shim/startup.ld): a process then faults in a few 64 KiB windows of the shim's code instead of
one for each place its hooks happen to sit in 1.1 MiB of it, and a forked child (whose code
pages the kernel does not copy) pays those faults again.

What a shell's forked child runs between its fork and its exec (the fork hook's child part, the
hooks the shell calls there, the exec hook and the exec's record) comes first, whatever the
counts: in every `bash -c` of the loop, that path faults each 64 KiB window of it in again (2-3
us each), and spread by count over the hot code it took four windows.

Names are written as patterns without rustc's hashes and crate disambiguators, so that the
list survives rebuilds; a function it misses is only placed where the linker would have put it.
Needs valgrind. What it cannot do: know about code the agent loop does not run.
"""
import collections, glob, os, re, shutil, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
shim = os.path.join(root, "target", "release", "libaether_journal.so")
cli = os.path.join(root, "target", "release", "aether-journal")
turns = sys.argv[1] if len(sys.argv) > 1 else "2"
# A process image's profile is lost at its exec unless dumped first: at each exec hook (and
# libc's execve, which a hook's real call ends in). Dumping only at `execve` lost every image
# that execs through `execvp` (`env`, the `#!/usr/bin/env` of version managers' shims), and
# with them the code of that path.
# Under a supervisor an exec hook makes the system call itself, marked: the profile is dumped
# before the shim's function that makes it (`marked_execve`, `marked_execveat`).
execs = ["execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve", "execveat",
         "*marked_execve*"]
processes, forked = collections.Counter(), collections.Counter()
images = []  # the set of the shim's functions each process image ran


def profile(work, mode):
    """Counts, into `processes` and `forked` (and lists in `images`), the shim's functions the
    loop's processes ran under `mode`: "preload" (a bare LD_PRELOAD) or "run" (`aether-journal
    run`)."""
    repo, out = os.path.join(work, mode, "repo"), os.path.join(work, mode, "cg")
    os.makedirs(repo); os.makedirs(out)
    for i in range(50):
        with open(os.path.join(repo, "g%04d.txt" % i), "w") as f:
            f.write("alpha omega %d\n" % i)
    git = ["git", "-c", "user.email=b@x", "-c", "user.name=b"]
    subprocess.run(git + ["init", "-q", "."], cwd=repo, check=True)
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "main"], cwd=repo, check=True)
    session = os.path.join(work, mode, "session")
    loop = ["valgrind", "--tool=callgrind", "--demangle=no", "--trace-children=yes", "--dump-instr=no"] + [
        "--dump-before=" + e for e in execs + ["*after_fork_in_child*"]] + [
        "--compress-strings=no", "--compress-pos=no", "--callgrind-out-file=" + out + "/cg.%p",
        "bash", os.path.join(root, "bench", "agent_loop.sh"), turns]
    if mode == "run":
        env = dict(os.environ, AETHER_JOURNAL_SHIM=shim)
        env.pop("LD_PRELOAD", None)
        env.pop("AETHER_JOURNAL_DIR", None)
        loop = [cli, "run", "--journal", session, "--"] + loop
    else:
        env = dict(os.environ, LD_PRELOAD=shim, AETHER_JOURNAL_DIR=session)
        subprocess.run(["sh", "-c", "echo x > made"], cwd=repo, env=env, check=True)
    subprocess.run(loop, cwd=repo, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # (pid, command line) -> [(part, trigger, functions)]: an exec starts the parts again at 1.
    parts = collections.defaultdict(list)
    for f in glob.glob(out + "/cg.*"):
        ob, seen, pid, part, trigger, cmd = None, set(), "", 0, "", ""
        for line in open(f, errors="replace"):
            if line.startswith("ob="):
                ob = line[3:].strip()
            # valgrind names no object for code it maps late (`???`): the shim's names tell.
            elif line.startswith("fn=") and ob in (shim, "???"):
                seen.add(line[3:].strip())
            elif line.startswith("pid:"):
                pid = line.split()[1]
            elif line.startswith("part:"):
                part = int(line.split()[1])
            elif line.startswith("desc: Trigger:"):
                trigger = line
            elif line.startswith("cmd:"):
                cmd = line
        processes.update(seen)
        parts[pid, cmd].append((part, trigger, seen))
    # A forked child's dumps: the one its fork hook's child part ended (its parent's history) is
    # followed by what the child ran until its exec (or its end, for a subshell that runs no
    # program).
    for dumps in parts.values():
        dumps.sort(key=lambda d: d[0])
        child, path = False, set()
        for _, trigger, seen in dumps:
            if child:
                path |= seen
            child = child or "after_fork_in_child" in trigger
        forked.update(path)
        images.append(set().union(*(seen for _, _, seen in dumps)))


work = tempfile.mkdtemp(prefix="hot-text-")
try:
    for mode in ("preload", "run"):
        profile(work, mode)
finally:
    shutil.rmtree(work)

sizes = collections.Counter()  # defined name -> its size in bytes
for l in subprocess.run(["nm", "-S", "--defined-only", shim], capture_output=True, text=True, check=True).stdout.splitlines():
    f = l.split()
    sizes[f[-1]] += int(f[1], 16) if len(f) == 4 else 0
defined = set(sizes)
# A record's checksum takes one of xxh3's functions by the record's length, and a forked
# child's exec record is as long as its names: the one the profile's records took need not be
# the one a real session's take (a forked child's exec record of `/bin/true`, measured, took
# `xxh3_64_129to240`, which the profile had placed by count, a window further: a page fault of
# its own in every such child). All of them go with the child's path.
hashed = max((c for n, c in forked.items() if "xxh3_64" in n), default=0)
# The function a profile is dumped before runs after the dump, and the image is replaced
# before the next: the marked exec is in no dump. It ends every supervised exec, whose check
# (`check_architecture`) is in the dumps.
marked = max((c for n, c in forked.items() if "check_architecture" in n), default=0)
for name in defined:
    if hashed and "xxh3_64" in name and "xxhash" in name:
        forked[name] = max(forked[name], hashed)
    if marked and re.search(r"marked_execve(at)?17h", name):
        forked[name] = max(forked[name], marked)


def pattern(name):
    name = re.sub(r"17h[0-9a-f]{16}E(\..*)?$", "17h*", name)  # legacy mangling's hash
    name = re.sub(r"Cs[0-9A-Za-z]+_", "*", name)  # v0 mangling's crate disambiguators
    return re.sub(r"\.(llvm\.)?\d+$", "*", name)  # LTO's suffixes


patterns = []
matched, instances = collections.Counter(), collections.Counter()  # pattern -> bytes, functions it places
for name in defined:
    matched[pattern(name)] += sizes[name]
    instances[pattern(name)] += 1


def most_run_first(counts, placeable=lambda name: True):
    """The (function, count) pairs of `counts` that `placeable` lets through, most run first."""
    return sorted(((n, c) for n, c in counts.items() if placeable(n)), key=lambda kv: (-kv[1], kv[0]))


def small_pattern(name):
    """A pattern matching many large instances of a generic (each hook's `open_mutating`, every
    closure's `call_once`: 40 and 14 KiB) would bring them all into the forked child's windows,
    where it runs one of them: those keep their place by count."""
    return instances[pattern(name)] == 1 or matched[pattern(name)] <= 4096


first = most_run_first(forked, small_pattern)
# Then what the quiet images run, right after the forked child's path: those that run a few KiB
# of the shim at most (`ls`, `cat`, `grep`, a third of the loop's programs: the constructor and
# the early returns of the hooks their libraries call, libselinux's `fopen` and `fclose`). Such
# a process then touches the constructor's window and the next, where left by count those few
# functions sat in three more windows (an `ls`: five windows for 9 KiB of the shim's code).
quiet = collections.Counter()
for ran in images:
    if sum(sizes[name] for name in ran) <= 16 << 10:
        quiet.update(ran)
then = most_run_first(quiet, small_pattern)
rest = most_run_first(processes)
for name, _ in first + then + rest:
    if name in defined and not name.startswith(("_init", "_fini")) and pattern(name) not in patterns:
        patterns.append(pattern(name))
lines = ["/* Generated by bench/hot_text.py from %s turns of the agent loop, preloaded and under run:" % turns,
         " * the shim's functions its processes ran, most used first (see that script). Read by lld",
         " * and GNU ld alike. */",
         "SECTIONS {", "  .text.hot : {"]
# A function LLVM took for cold (`#[cold]`: std's vector growth) sits in `.text.unlikely.NAME`.
lines += ["    *(.text.%s .text.unlikely.%s)" % (p, p) for p in patterns]
lines += ["  }", "} INSERT BEFORE .text;", ""]
with open(os.path.join(root, "shim", "hot_text.ld"), "w") as f:
    f.write("\n".join(lines))
print("shim/hot_text.ld: %d functions" % len(patterns))
