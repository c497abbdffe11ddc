"""Run untrusted Python (a policy's code answer) against unit-test asserts, contained.

Layers, outermost first (each alone should stop the listed attack; together they are defence in depth):

1. ``unshare --net --pid --fork --kill-child`` (util-linux, needs root; probed once): an empty network
   namespace (no interface is up, so even 127.0.0.1 is unreachable) and a pid namespace whose processes all
   die with the namespace. A ``/bin/sh`` shim is pid 1 so the interpreter is *not* the namespace init (the
   kernel ignores default-action signals such as RLIMIT_CPU's SIGXCPU for an init process).
2. A trusted bootstrap (``_RUNNER``, passed with ``-c``) in ``python -I -S -B`` with a scrubbed environment
   and its own temp dir as cwd. Before any untrusted code it sets rlimits (CPU, AS, FSIZE, NPROC, NOFILE,
   CORE=0), preloads a small stdlib allow-list and, when started as root, drops to ``nobody`` (root is exempt
   from RLIMIT_NPROC and can read/write almost everything; the interpreter under /root is unreadable to
   nobody, hence the preloading), then installs an audit hook that forbids sockets, process creation,
   ctypes, frame introspection, reading other processes' /proc entries and writes outside the temp dir.
3. The parent kills the whole process group on the wall-clock timeout and after every run.

Results travel as stdout lines prefixed with a random nonce that the bootstrap read from stdin (the untrusted
code cannot forge them without frame introspection, which the audit hook forbids). This is a reward-hacking
guard for RL, not a hardened multi-tenant boundary (use gVisor/firecracker for that).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

__all__ = ["SandboxResult", "isolation_available", "run_python", "split_tests"]

_NOBODY = 65534
_OUTPUT_CAP = 16 * 1024  # bytes of stdout/stderr kept; the rest is drained and dropped
_MAX_SOURCE = 256 * 1024  # code + tests; bigger payloads are rejected before spawning anything


@dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    timed_out: bool
    killed_reason: str | None  # wall_timeout | cpu_limit | memory_limit | file_size_limit | signal:<NAME>
    stdout: str
    stderr: str
    returncode: int | None = None

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


# The bootstrap. Kept dependency-free and small: it runs before (and around) the untrusted code.
_RUNNER = r"""
import sys, os, json, resource
def _main():
    cfg = json.loads(sys.stdin.read())
    sys.stdin.close()
    nonce = cfg["nonce"]
    out = sys.__stdout__
    def report(line):
        out.write("\n" + nonce + " " + line + "\n")
        out.flush()
    lim = cfg["limits"]
    def setlim(res, soft, hard=None):
        try:
            resource.setrlimit(res, (soft, soft if hard is None else hard))
        except (ValueError, OSError):
            pass
    setlim(resource.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1)
    setlim(resource.RLIMIT_FSIZE, lim["fsize"])
    setlim(resource.RLIMIT_CORE, 0)
    setlim(resource.RLIMIT_NOFILE, 64)
    setlim(resource.RLIMIT_NPROC, lim["nproc"])
    for _m in ["_posixsubprocess", *cfg["preload"]]:
        try:
            __import__(_m)
        except Exception:
            pass
    import builtins
    if os.geteuid() == 0 and cfg["drop_uid"] is not None:
        os.setgroups([])
        os.setresgid(cfg["drop_uid"], cfg["drop_uid"], cfg["drop_uid"])
        os.setresuid(cfg["drop_uid"], cfg["drop_uid"], cfg["drop_uid"])
    # Address space last: preloading needs headroom.
    setlim(resource.RLIMIT_AS, lim["as"])
    root = os.path.realpath(os.getcwd())
    mypid = str(os.getpid())
    if cfg["guard"]:
        BLOCK = {"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                 "socket.getaddrinfo", "socket.gethostbyname", "os.fork", "os.forkpty", "os.posix_spawn",
                 "os.spawn", "os.exec", "os.system", "os.kill", "os.killpg", "subprocess.Popen",
                 "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "sys._getframe", "sys._current_frames",
                 "sys.setprofile", "sys.settrace", "gc.get_objects",
                 "gc.get_referrers", "gc.get_referents", "os.setuid", "os.chroot", "resource.setrlimit",
                 "resource.prlimit", "pty.spawn", "sys.remote_exec"}
        PATHS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
                 "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
        W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
        rp, isinst, PE = os.path.realpath, isinstance, PermissionError
        def inside(p):
            try:
                p = rp(os.fsdecode(p))
            except Exception:
                return False
            return p == root or p.startswith(root + "/")
        def hook(event, args):
            if event in BLOCK:
                raise PE("sandbox: " + event + " is not allowed")
            if event == "open":
                path, mode, flags = args
                if isinst(path, int):
                    return
                sp = rp(os.fsdecode(path))
                if sp.startswith("/proc/") and sp.split("/")[2] not in ("self", "thread-self", mypid):
                    raise PE("sandbox: other processes' /proc entries are not readable")
                if ((mode and any(c in mode for c in "wax+")) or (flags or 0) & W) and not inside(path):
                    raise PE("sandbox: writing outside the sandbox dir is not allowed")
            elif event in PATHS:
                for a in args[:2]:
                    if isinst(a, (str, bytes)) and not inside(a):
                        raise PE("sandbox: " + event + " outside the sandbox dir is not allowed")
        sys.addaudithook(hook)
        # subprocess forks through _posixsubprocess.fork_exec, which raises no audit event of its own.
        import _posixsubprocess
        def no_fork_exec(*a, **k):
            raise PE("sandbox: process creation is not allowed")
        _posixsubprocess.fork_exec = no_fork_exec
        if "subprocess" in sys.modules:
            sys.modules["subprocess"]._fork_exec = no_fork_exec
    g = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(cfg["code"], "<solution>", "exec"), g)
    except MemoryError:
        report("FATAL memory_limit")
        os._exit(3)
    except BaseException as e:
        sys.stderr.write("solution failed: %s: %s\n" % (type(e).__name__, str(e)[:500]))
        report("SOLUTION_ERROR")
    for i, (src, is_test) in enumerate(cfg["tests"]):
        try:
            exec(compile(src, "<test %d>" % i, "exec"), g)
            if is_test:
                report("PASS %d" % i)
        except MemoryError:
            report("FATAL memory_limit")
            os._exit(3)
        except BaseException as e:
            report("FAIL %d %s" % (i, type(e).__name__))
            sys.stderr.write("test %d failed: %s: %s\n" % (i, type(e).__name__, str(e)[:200]))
    report("DONE")
    sys.stdout.flush()
    os._exit(0)
_main()
"""

# Stdlib modules importable after the privilege drop (see module doc).
_PRELOAD = (
    "math",
    "cmath",
    "collections",
    "collections.abc",
    "itertools",
    "functools",
    "operator",
    "re",
    "string",
    "heapq",
    "bisect",
    "typing",
    "json",
    "random",
    "statistics",
    "fractions",
    "decimal",
    "copy",
    "dataclasses",
    "enum",
    "array",
    "textwrap",
    "unicodedata",
    "socket",
    "subprocess",
)

_probe_lock = threading.Lock()


@functools.cache
def _probe_unshare() -> bool:
    try:
        r = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--kill-child", "true"],
            capture_output=True,
            timeout=5,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def isolation_available() -> bool:
    """Whether namespace isolation (network + pid) works here (root with util-linux unshare)."""
    with _probe_lock:  # cache() is not a lock: avoid N threads probing at once on first use
        return _probe_unshare()


def split_tests(tests: str) -> list[tuple[str, bool]]:
    """Top-level statements of ``tests``; each ``assert`` is one test, anything else is setup run in order."""
    try:
        tree = ast.parse(tests)
    except SyntaxError as e:
        raise ValueError(f"tests do not parse: {e}") from e
    return [(ast.unparse(node), isinstance(node, ast.Assert)) for node in tree.body]


def _drain(stream: object, buf: bytearray) -> None:
    read = stream.read  # type: ignore[attr-defined]
    while chunk := read(65536):
        if len(buf) < _OUTPUT_CAP:
            buf.extend(chunk[: _OUTPUT_CAP - len(buf)])


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_python(
    code: str,
    tests: str,
    *,
    cpu_seconds: int = 2,
    memory_mb: int = 256,
    wall_seconds: float = 5,
    file_size_mb: int = 1,
    max_processes: int = 16,
    isolate_net: bool | None = None,
    guard: bool = True,
) -> SandboxResult:
    """Run ``code`` then each top-level statement of ``tests`` in a contained interpreter.

    ``isolate_net``: None = use namespaces when available, False = don't (True requires them).
    ``guard=False`` disables the audit hook: only for tests that check the other layers alone.
    Raises ValueError when ``tests`` does not parse or has no assert.
    """
    stmts = split_tests(tests)
    total = sum(is_test for _, is_test in stmts)
    if total == 0:
        raise ValueError("tests contain no assert statement")
    if len(code) + len(tests) > _MAX_SOURCE:
        return SandboxResult(0, total, False, "source_too_large", "", "")
    use_ns = isolation_available() if isolate_net is None else isolate_net
    if use_ns and not isolation_available():
        raise RuntimeError("namespace isolation requested but `unshare --net --pid` does not work here")

    nonce = secrets.token_hex(16)
    is_root = os.geteuid() == 0
    cfg = {
        "nonce": nonce,
        "code": code,
        "tests": stmts,
        "guard": guard,
        "preload": _PRELOAD,
        "drop_uid": _NOBODY if is_root else None,
        "limits": {
            "cpu": max(1, int(cpu_seconds)),
            "as": int(memory_mb) * 1024 * 1024,
            "fsize": int(file_size_mb) * 1024 * 1024,
            "nproc": int(max_processes),
        },
    }
    py = [sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _RUNNER]
    # sh as pid 1 of the namespace (see module doc); "$@" keeps argv quoting exact.
    argv = (
        ["unshare", "--net", "--pid", "--fork", "--kill-child", "/bin/sh", "-c", '"$@"; exit $?', "sh", *py]
        if use_ns
        else py
    )
    workdir = tempfile.mkdtemp(prefix="rollstream-sbx-")
    try:
        if is_root:
            os.chown(workdir, _NOBODY, _NOBODY)  # the dropped process writes only here
        out, err = bytearray(), bytearray()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin"},  # nothing of the parent's environment
            process_group=0,
            close_fds=True,
        )
        readers = [
            threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
            threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
        ]
        for t in readers:
            t.start()
        timed_out_wall = False
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(cfg).encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            rc: int | None = proc.wait(timeout=wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out_wall = True
            _killpg(proc.pid)
            rc = proc.wait()
        _killpg(proc.pid)  # stray children, even after a clean exit
        for t in readers:
            t.join(timeout=2)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _interpret(nonce, total, bytes(out), bytes(err), rc, timed_out_wall, use_ns)


def _interpret(
    nonce: str, total: int, out: bytes, err: bytes, rc: int | None, wall: bool, via_sh: bool
) -> SandboxResult:
    passed: set[int] = set()
    fatal: str | None = None
    user_lines: list[str] = []
    prefix = nonce + " "
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith(prefix):
            parts = line[len(prefix) :].split()
            if parts[:1] == ["PASS"] and len(parts) > 1 and parts[1].isdigit():
                passed.add(int(parts[1]))
            elif parts[:1] == ["FATAL"] and len(parts) > 1:
                fatal = parts[1]
        elif line:
            user_lines.append(line)
    # Signal deaths: negative from Popen, or 128+n when /bin/sh was the parent.
    sig: int | None = None
    if rc is not None and rc < 0:
        sig = -rc
    elif via_sh and rc is not None and rc > 128:
        sig = rc - 128
    reason: str | None = fatal
    if wall:
        reason = "wall_timeout"
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and reason is None):
        # SIGKILL without our own kill is the RLIMIT_CPU hard limit (or the OOM killer).
        reason = "cpu_limit" if sig == signal.SIGXCPU else "signal:SIGKILL"
    elif sig == signal.SIGXFSZ:
        reason = "file_size_limit"
    elif sig is not None and reason is None:
        try:
            reason = f"signal:{signal.Signals(sig).name}"
        except ValueError:
            reason = f"signal:{sig}"
    return SandboxResult(
        passed=len(passed),
        total=total,
        timed_out=wall or reason == "cpu_limit",
        killed_reason=reason,
        stdout="\n".join(user_lines),
        stderr=err.decode("utf-8", "replace"),
        returncode=rc,
    )
