"""A real single-node Apache Kafka broker (KRaft) run from Maven-resolved jars, for one machine and tests.

The jars come from Maven Central once (``resolve_jars``) and are cached; ``EmbeddedBroker`` formats a home
folder, starts ``kafka.Kafka`` detached and tracks it by a pid file, so a later process (or CLI call) can
find, reuse and stop the same broker.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.resources
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BrokerError",
    "BrokerInfo",
    "EmbeddedBroker",
    "default_home",
    "free_port",
    "kafka_version",
    "resolve_jars",
]

INSTALL_HINT = (
    "the embedded Kafka broker needs Java >= 17 and Maven; on Debian/Ubuntu: "
    "`apt-get install -y openjdk-17-jre-headless maven` (or point rollstream at an existing Kafka cluster)"
)
_MARKER = ".complete"
_PKG = "rollstream.infra.kafka"
# C1-only JIT, serial GC and the CDS archive cut JVM start-up; a test/dev broker never runs long enough
# for C2's peak throughput to matter. Measured in docs/broker.md.
FAST_START_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")


class BrokerError(RuntimeError):
    """The embedded broker could not be resolved, started or reached."""


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    bootstrap: str
    home: Path
    already_running: bool
    started_in_s: float


def _cache_base() -> Path:
    env = os.environ.get("ROLLSTREAM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rollstream"


def default_home() -> Path:
    """Home folder of the CLI's broker: ``<cache>/broker``."""
    return _cache_base() / "broker"


def _pom_text() -> str:
    return importlib.resources.files(_PKG).joinpath("pom.xml").read_text(encoding="utf-8")


def kafka_version() -> str:
    """The Kafka version pinned in the packaged pom (names the jar cache, so upgrades never mix jars)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.fromstring(_pom_text()).find("m:properties/m:kafka.version", ns)
    if node is None or not node.text:
        raise BrokerError("packaged pom.xml has no <kafka.version>")
    return node.text.strip()


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise BrokerError(f"`{tool}` not found on PATH; {INSTALL_HINT}")
    return path


def _java() -> str:
    """Path of a java >= 17, or BrokerError with the install hint."""
    java = _require("java")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BrokerError(f"cannot run `{java} -version` ({e}); {INSTALL_HINT}") from e
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m is None:
        raise BrokerError(f"cannot parse `java -version` output; {INSTALL_HINT}")
    major = int(m.group(1))
    if major == 1 and m.group(2):  # "1.8.0_x" style
        major = int(m.group(2))
    if major < 17:
        raise BrokerError(
            f"Java {major} found at {java}, Kafka {kafka_version()} needs >= 17; {INSTALL_HINT}"
        )
    return java


def resolve_jars(cache_dir: Path | None = None) -> Path:
    """Folder holding the broker's jars, resolving them with Maven on first use.

    ``cache_dir`` is the base cache (default ``$ROLLSTREAM_CACHE`` or ``~/.cache/rollstream``); jars land in
    ``<cache_dir>/kafka-<version>/libs``. A marker file written last makes a half-finished download count as
    absent; the download goes to a private folder renamed into place so concurrent callers never share one.
    """
    version = kafka_version()
    libs = (cache_dir if cache_dir is not None else _cache_base()) / f"kafka-{version}" / "libs"
    if (libs / _MARKER).exists():
        return libs
    _java()  # fail early with the hint rather than after a 40 s download
    mvn = _require("mvn")
    libs.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs.partial-", dir=libs.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="rollstream-pom-") as tmp:
            pom = Path(tmp) / "pom.xml"
            pom.write_text(_pom_text(), encoding="utf-8")
            cmd = [
                mvn,
                "-B",
                "-q",
                "-f",
                str(pom),
                "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
            ]
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0 or not any(staging.glob("kafka_*.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise BrokerError(
                f"maven could not resolve Kafka {version} jars (exit {proc.returncode}):\n{tail}"
            )
        (staging / _MARKER).write_text(version + "\n", encoding="utf-8")
        try:
            staging.rename(libs)
        except OSError:
            # Another process finished first (or a stale unmarked folder is in the way).
            if not (libs / _MARKER).exists():
                shutil.rmtree(libs, ignore_errors=True)
                staging.rename(libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return libs


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (racy by nature; fine for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    """True for a live (non-zombie) process that is a Kafka broker, so a recycled pid is not mistaken."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    proc = Path(f"/proc/{pid}")
    if proc.exists():  # Linux: exclude zombies and unrelated processes that reuse the pid
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, IndexError):
            return False
        return state != "Z" and b"kafka.Kafka" in cmdline
    return True


class EmbeddedBroker:
    """One KRaft broker+controller whose state, pid file and log live in ``home``.

    Keep the same ports for a given home: the formatted quorum records the controller's address.
    """

    def __init__(
        self,
        home: Path,
        port: int = 9092,
        controller_port: int = 9093,
        host: str = "127.0.0.1",
        heap: str = "1g",
        *,
        libs: Path | None = None,
        jvm_flags: tuple[str, ...] = FAST_START_JVM_FLAGS,
    ) -> None:
        self.home = Path(home).expanduser().resolve()
        self.port = port
        self.controller_port = controller_port
        self.host = host
        self.heap = heap
        self.jvm_flags = jvm_flags
        self._libs = libs
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths -----------------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def properties_file(self) -> Path:
        return self.home / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.out"

    # -- config ----------------------------------------------------------------------------------------
    def render_properties(self) -> str:
        template = importlib.resources.files(_PKG).joinpath("server.properties.template")
        return string.Template(template.read_text(encoding="utf-8")).substitute(
            host=self.host,
            port=self.port,
            controller_port=self.controller_port,
            log_dirs=str(self.data_dir),
        )

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(self.render_properties(), encoding="utf-8")
        log4j = importlib.resources.files(_PKG).joinpath("log4j2.yaml").read_text(encoding="utf-8")
        (self.home / "log4j2.yaml").write_text(log4j, encoding="utf-8")

    def _classpath(self) -> str:
        libs = self._libs if self._libs is not None else resolve_jars()
        return f"{libs}/*"

    def _format(self, java: str, classpath: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = _random_cluster_id()
        cmd = [
            java,
            *self.jvm_flags,
            "-cp",
            classpath,
            "-Dlog4j2.configurationFile=" + str(self.home / "log4j2.yaml"),
        ]
        # "--cluster-id=<id>": an id may start with '-', which as a separate argument parses as an option.
        cmd += ["kafka.tools.StorageTool", "format", "--standalone", f"--cluster-id={cluster_id}"]
        cmd += ["-c", str(self.properties_file)]
        proc = subprocess.run(cmd, cwd=self.home, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting {self.data_dir} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )

    # -- lifecycle -------------------------------------------------------------------------------------
    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def status(self) -> BrokerInfo | None:
        """Info on the live broker of this home (process alive and port answering), else None."""
        pid = self._read_pid()
        if pid is None or not _pid_alive(pid) or not _port_open(self.host, self.port):
            return None
        return BrokerInfo(pid, self.bootstrap, self.home, already_running=True, started_in_s=0.0)

    def up(self, timeout: float = 90) -> BrokerInfo:
        """Start the broker (or find it running) and return once it serves metadata requests."""
        t0 = time.monotonic()
        pid = self._read_pid()
        if pid is not None and _pid_alive(pid):
            # Running already, possibly still starting (another caller): wait for it instead of a second JVM.
            self._wait_ready(pid, t0 + timeout)
            return BrokerInfo(pid, self.bootstrap, self.home, already_running=True, started_in_s=0.0)
        java = _java()
        classpath = self._classpath()
        if _port_open(self.host, self.port) or _port_open(self.host, self.controller_port):
            raise BrokerError(
                f"port {self.port} or {self.controller_port} on {self.host} is taken by another process; "
                "stop it or choose other ports"
            )
        self._write_config()
        self._format(java, classpath)
        cmd = [java, f"-Xmx{self.heap}", *self.jvm_flags, "-Djava.awt.headless=true", "-cp", classpath]
        cmd += [
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.yaml'}",
            "kafka.Kafka",
            str(self.properties_file),
        ]
        with open(self.log_file, "ab") as out:
            # Own session: the broker outlives this Python process and ignores the terminal's Ctrl-C.
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        try:
            self._wait_ready(self._proc.pid, t0 + timeout)
        except BrokerError:
            self.down(timeout=10)
            raise
        return BrokerInfo(self._proc.pid, self.bootstrap, self.home, False, round(time.monotonic() - t0, 2))

    def _wait_ready(self, pid: int, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient  # heavy import, only when a broker is used

        admin = None
        last_err: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    self.pid_file.unlink(missing_ok=True)
                    raise BrokerError(
                        f"broker exited with code {self._proc.returncode} during start-up:\n{self.logs(40)}"
                    )
            elif not _pid_alive(pid):
                raise BrokerError(f"broker pid {pid} died during start-up:\n{self.logs(40)}")
            # Wait for the socket first: librdkafka would log every refused connection otherwise.
            if not _port_open(self.host, self.port):
                time.sleep(0.1)
                continue
            try:
                if admin is None:
                    admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
                admin.list_topics(timeout=2)
                admin.describe_cluster(request_timeout=2).result(timeout=3)
                return
            except Exception as e:  # KafkaException while the controller elects itself
                last_err = e
                time.sleep(0.1)
        raise BrokerError(
            f"broker at {self.bootstrap} not ready within the timeout ({last_err}):\n{self.logs(40)}"
        )

    def down(self, timeout: float = 30) -> bool:
        """SIGTERM the broker (SIGKILL after ``timeout``); True when a live broker was stopped."""
        pid = self._read_pid()
        stopped = False
        if pid is not None and _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not self._wait_gone(pid, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_gone(pid, 10)
            stopped = True
        self.pid_file.unlink(missing_ok=True)
        self._proc = None
        return stopped

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                self._proc.poll()  # reap our own child so it does not linger as a zombie
            if not _pid_alive(pid):
                if self._proc is not None and self._proc.pid == pid:
                    self._proc.wait(5)  # it may have exited just after the poll above: reap it now
                return True
            time.sleep(0.1)
        return False

    def logs(self, lines: int = 100) -> str:
        """Last ``lines`` lines of the broker's stdout/stderr."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 256 * max(lines, 1) - 4096))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _random_cluster_id() -> str:
    """16 random bytes as unpadded URL-safe base64, the format of `kafka-storage random-uuid`."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
