"""Discovery records: the writer (metrics.export.discovery) and the reader
(tpu_info.net.discovery), against real files, real permissions and real processes."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from metrics.export import discovery as writer
from tpu_info.net import discovery as reader

ROOT = Path(__file__).resolve().parents[3]
OTHER_UID = 54321


@pytest.fixture(autouse=True)
def _forget_published():
    yield
    writer.unpublish()


def write_record(directory: Path, pid: int, overrides: dict | None = None, **fields: object
                 ) -> Path:
    # Port 1: nothing listens there, so a dead record is never kept for its port.
    rec = writer.record(1, "127.0.0.1", "jax", {"jax": "0.10.2"}, pid=pid,
                        argv=["train.py"], start_time=time.time())
    rec.update(overrides or {}, **fields)
    path = directory / f"{pid}.json"
    path.write_text(json.dumps(rec))
    os.chmod(path, 0o600)
    return path


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# Where the directory is -------------------------------------------------------

def test_runtime_dir_precedence():
    assert reader.runtime_dir({"TPU_INFO_RUNTIME_DIR": "/x", "XDG_RUNTIME_DIR": "/r"}) == Path("/x")
    assert reader.runtime_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == Path("/run/user/7/tpu-info")
    assert reader.runtime_dir({}, uid=7) == Path("/tmp/tpu-info-7")
    assert reader.runtime_dir({"TPU_INFO_RUNTIME_DIR": ""}, uid=7) == Path("/tmp/tpu-info-7")


# Writer ------------------------------------------------------------------------

def test_publish_writes_private_file_atomically_and_unpublish_removes(tmp_path: Path):
    d = tmp_path / "new" / "tpu-info"
    path = writer.publish(8431, "127.0.0.1", "jax", {"jax": "0.10.2"}, runtime_dir=d,
                          register_cleanup=False)
    assert path == d / f"{os.getpid()}.json"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in d.iterdir()] == [path.name]  # no temp file left behind
    data = json.loads(path.read_text())
    assert data["schema"] == reader.SCHEMA_VERSION
    assert (data["pid"], data["port"], data["host"], data["engine"]) == (
        os.getpid(), 8431, "127.0.0.1", "jax")
    assert data["argv"] == sys.argv and data["versions"] == {"jax": "0.10.2"}

    [found] = reader.find_processes(d)
    assert (found.pid, found.port, found.target, found.path) == (
        os.getpid(), 8431, "127.0.0.1:8431", path)
    assert writer.published() == path

    # Republishing (say, a new port) replaces the record in place.
    writer.publish(9000, "127.0.0.1", "jax", {}, runtime_dir=d, register_cleanup=False)
    assert [p.port for p in reader.find_processes(d)] == [9000]

    writer.unpublish()
    assert not path.exists() and writer.published() is None
    writer.unpublish()  # idempotent


def test_publish_tightens_umask_created_dir(tmp_path: Path):
    old = os.umask(0)
    try:
        d = tmp_path / "loose"
        assert writer.publish(1, "h", "jax", {}, runtime_dir=d, register_cleanup=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


@pytest.mark.parametrize("case", ["symlink", "foreign", "group_writable", "world_writable"])
def test_publish_refuses_unsafe_directory(tmp_path: Path, caplog, case: str):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chmod(real, 0o700)
    d = real
    if case == "symlink":
        d = tmp_path / "link"
        d.symlink_to(real)
    elif case == "foreign":
        os.chown(real, OTHER_UID, OTHER_UID)
    else:
        os.chmod(real, 0o770 if case == "group_writable" else 0o707)
    with caplog.at_level(logging.WARNING, logger="metrics.export.discovery"):
        assert writer.publish(8431, "127.0.0.1", "jax", {}, runtime_dir=d,
                              register_cleanup=False) is None
    assert "not publishing" in caplog.text and str(d) in caplog.text
    assert list(real.iterdir()) == []
    assert writer.published() is None


def test_publish_unwritable_directory_warns_and_returns_none(tmp_path: Path, caplog):
    # A regular file where a parent directory should be: fails even for root.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="metrics.export.discovery"):
        assert writer.publish(8431, "h", "jax", {}, runtime_dir=blocker / "tpu-info",
                              register_cleanup=False) is None
        # And a regular file in place of the directory itself.
        assert writer.publish(8431, "h", "jax", {}, runtime_dir=blocker,
                              register_cleanup=False) is None
    assert caplog.text.count("not publishing") == 2


def test_unpublish_in_forked_child_leaves_parent_record(rdir: Path):
    path = writer.publish(8431, "h", "jax", {}, runtime_dir=rdir, register_cleanup=False)
    writer._published = (path, os.getpid() + 1)  # as a fork's child would see it
    writer.unpublish()
    assert path.exists()


# Reader -------------------------------------------------------------------------

def test_scan_missing_directory_is_empty_without_warnings(tmp_path: Path):
    s = reader.scan(tmp_path / "never")
    assert s.processes == () and s.skipped == ()


@pytest.mark.slow
def test_dead_pid_is_skipped_and_removed(rdir: Path, caplog):
    pid = dead_pid()
    dead = write_record(rdir, pid)
    live = write_record(rdir, os.getpid())
    s = reader.scan(rdir)
    assert [p.path for p in s.processes] == [live]
    assert [(k.reason, k.path.name, k.removed) for k in s.skipped] == [
        (reader.DEAD, f"{pid}.json", True)]
    assert not dead.exists() and live.exists()
    write_record(rdir, pid)
    with caplog.at_level(logging.INFO, logger="tpu_info.net.discovery"):
        assert [p.pid for p in reader.find_processes(rdir)] == [os.getpid()]
    assert "removed 1 record(s) of exited processes" in caplog.text


def test_reused_pid_is_skipped_and_removed(rdir: Path):
    # Our pid, but a record written long before this process started.
    path = write_record(rdir, os.getpid(), start_time=1000.0)
    s = reader.scan(rdir)
    assert s.processes == () and s.skipped[0].reason == reader.DEAD and s.skipped[0].removed
    assert not path.exists()


@pytest.mark.slow
def test_records_that_are_not_removed(rdir: Path, tmp_path: Path):
    """Never another user's file, never through a symlink, never a live one,
    never when told not to, and never when a socket of ours holds its port."""
    pid = dead_pid()
    foreign = write_record(rdir, pid)
    os.chown(foreign, OTHER_UID, OTHER_UID)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = write_record(elsewhere, pid + 1 if pid + 1 != os.getpid() else pid + 2)
    link = rdir / target.name
    link.symlink_to(target)
    live = write_record(rdir, os.getpid())
    s = reader.scan(rdir)
    assert foreign.exists() and link.is_symlink() and target.exists() and live.exists()
    assert {k.reason for k in s.skipped} == {reader.FOREIGN, reader.SYMLINK}
    foreign.unlink()
    kept = write_record(rdir, pid)
    assert not reader.scan(rdir, remove_dead=False).skipped[-1].removed and kept.exists()
    with socket.socket() as held:  # a live process of ours in another pid namespace
        held.bind(("127.0.0.1", 0))
        held.listen()
        write_record(rdir, pid, port=held.getsockname()[1])
        [k] = [k for k in reader.scan(rdir).skipped if k.path == kept]
        assert k.reason == reader.DEAD and not k.removed and "listens on its port" in k.detail
    assert kept.exists()


@pytest.mark.slow
def test_record_rewritten_while_judged_is_kept(rdir: Path):
    """The pid was reused and its new process wrote a fresh record between
    the read and the removal: the fresh record stays."""
    pid = dead_pid()
    path = write_record(rdir, pid, start_time=1000.0)

    def alive(p: int, start_time: float) -> bool:
        fresh = write_record(rdir / "..", pid, start_time=2000.0)  # the new process
        os.replace(fresh, path)  # publishes as the hook does: a new file renamed in
        return False

    [k] = reader.scan(rdir, alive=alive).skipped
    assert k.reason == reader.DEAD and not k.removed
    assert json.loads(path.read_text())["start_time"] == 2000.0


def test_many_skipped_records_summarise_in_a_few_lines(rdir: Path):
    for n in range(100):
        (rdir / f"{1_000_000 + n}.json").write_text("{}")
    for n in range(50):
        write_record(rdir, 4_200_000 + n)  # above any pid_max: dead
    s = reader.scan(rdir)
    assert s.removed == 50 and len(s.skipped) == 150
    lines = s.summary()
    assert len(lines) == 7, lines
    assert lines[0] == f"removed 50 record(s) of exited processes from {rdir}"
    assert lines[-1] == "95 more records skipped: 95 corrupt"


@pytest.mark.slow
def test_rescanner_reads_again_only_when_the_directory_changes(rdir: Path):
    for n in range(300):
        (rdir / f"{1_000_000 + n}.json").write_text("{}")  # corrupt: never removed
    write_record(rdir, os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import psutil

        write_record(rdir, child.pid, start_time=psutil.Process(child.pid).create_time())
        later = lambda: time.time() + 60  # noqa: E731 - every change has settled
        r = reader.Rescanner(rdir, clock=later)
        first = r.scan()
        assert first.files_read == 302 and len(first.processes) == 2
        again = r.scan()
        assert again.files_read == 0 and again.processes == first.processes
        assert len(again.skipped) == 300
        mine = write_record(rdir / "..", os.getpid())  # republished as the hook does:
        os.replace(mine, rdir / mine.name)              # renamed in, the directory changes
        assert r.scan().files_read == 302
        assert r.scan().files_read == 0
        child.kill()
        child.wait()
        died = r.scan()  # the cached live record is checked, found dead, removed
        assert died.files_read == 302 and died.removed == 1
        assert [p.pid for p in died.processes] == [os.getpid()]
        assert r.scan().files_read == 301 and r.scan().files_read == 0
    finally:
        child.kill()
        child.wait()


def test_rescanner_reads_every_time_while_a_change_is_recent(rdir: Path):
    write_record(rdir, os.getpid())
    r = reader.Rescanner(rdir, clock=time.time, settle_s=3600)
    assert r.scan().files_read == 1 and r.scan().files_read == 1


@pytest.mark.parametrize("content, detail", [
    (b"\x00\xffgarbage", "not JSON"),
    (b"{\"schema\": 1, \"pid\": ", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"{\"pid\": 1}", "schema"),
    (None, "port"),
    (None, "does not match"),
    (b" " * (reader.MAX_RECORD_BYTES + 1), "larger than"),
])
def test_corrupt_file_is_skipped(rdir: Path, caplog, content: bytes | None, detail: str):
    pid = os.getpid()
    path = rdir / f"{pid}.json"
    if content is None and detail == "port":
        write_record(rdir, pid, port="8431")
    elif content is None:
        write_record(rdir, pid, {"pid": 1})  # pid inside does not match the name
    else:
        path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="tpu_info.net.discovery"):
        assert reader.find_processes(rdir) == []
    [skip] = reader.scan(rdir).skipped
    assert skip.reason == reader.CORRUPT and detail in skip.detail
    assert "corrupt" in caplog.text


def test_newer_schema_is_skipped_not_misread(rdir: Path):
    write_record(rdir, os.getpid(), schema=reader.SCHEMA_VERSION + 1)
    [skip] = reader.scan(rdir).skipped
    assert skip.reason == reader.UNSUPPORTED


def test_foreign_owner_is_skipped(rdir: Path, caplog):
    path = write_record(rdir, os.getpid())
    os.chown(path, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="tpu_info.net.discovery"):
        assert reader.find_processes(rdir) == []
    [skip] = reader.scan(rdir).skipped
    assert skip.reason == reader.FOREIGN and str(OTHER_UID) in skip.detail
    assert "not owned" in caplog.text


def test_symlink_is_skipped(rdir: Path, tmp_path: Path, caplog):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = write_record(elsewhere, os.getpid())
    (rdir / f"{os.getpid()}.json").symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="tpu_info.net.discovery"):
        assert reader.find_processes(rdir) == []
    assert reader.scan(rdir).skipped[0].reason == reader.SYMLINK
    assert "symlink" in caplog.text


def test_not_a_regular_file_is_skipped(rdir: Path):
    (rdir / f"{os.getpid()}.json").mkdir()
    assert reader.scan(rdir).skipped[0].reason == reader.NOT_A_FILE


@pytest.mark.parametrize("case", ["symlink", "foreign", "world_writable"])
def test_reader_refuses_unsafe_directory(tmp_path: Path, case: str):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chmod(real, 0o700)
    write_record(real, os.getpid())
    d = real
    if case == "symlink":
        d = tmp_path / "link"
        d.symlink_to(real)
    elif case == "foreign":
        os.chown(real, OTHER_UID, OTHER_UID)
    else:
        os.chmod(real, 0o777)
    s = reader.scan(d)
    assert s.processes == ()
    assert [k.reason for k in s.skipped] == [reader.BAD_DIRECTORY]


@pytest.mark.slow
def test_reader_imports_no_metrics_or_engines():
    code = ("import sys, tpu_info.net.discovery, tpu_info.commands.run; "
            "bad = [m for m in ('metrics', 'jax', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


@pytest.mark.slow
def test_the_writer_shares_the_record_rules_not_the_reader():
    """The hook in the user's program loads what a record is, never the
    directory scan (``tpu_info.net.discovery``, /proc listeners, psutil)."""
    code = ("import sys, metrics.export, metrics.export.discovery; "
            "assert 'tpu_info.contract.discovery_record' in sys.modules; "
            "bad = [m for m in ('tpu_info.net.discovery', 'tpu_info.host.listeners') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})


# The capture secret ---------------------------------------------------------------

def test_the_capture_secret_is_in_the_record_but_never_printed(rdir):
    import socket

    with socket.socket() as s:  # this process listens on the record's port
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        write_record(rdir, os.getpid(), port=port)
        [p] = reader.scan(rdir).processes
        assert p.capture_secret == writer.capture_secret() and len(p.capture_secret) >= 40
        assert p.capture_secret not in repr(p)
        assert reader.secret_for(f"127.0.0.1:{port}", [p]) == p.capture_secret
        assert reader.secret_for(f"localhost:{port}", [p], pid=os.getpid()) == p.capture_secret
        assert reader.secret_for(f"localhost:{port}", [p], pid=os.getpid() + 1) is None
        assert reader.secret_for(f"127.0.0.1:{port + 1}", [p]) is None
        assert reader.secret_for(f"192.0.2.9:{port}", [p]) is None  # never off this host
    # The port is no longer this process's: whoever holds it now gets no secret.
    assert reader.secret_for(f"127.0.0.1:{port}", [p]) is None


@pytest.mark.parametrize("bad", [5, "a\x1bb", "é"])
def test_a_bad_capture_secret_is_a_corrupt_record(rdir, bad):
    write_record(rdir, os.getpid(), capture_secret=bad)
    scan = reader.scan(rdir)
    assert not scan.processes and scan.skipped[0].reason == reader.CORRUPT


@pytest.mark.slow
def test_a_forked_child_gets_its_own_capture_secret():
    code = textwrap.dedent("""
        import os
        from metrics.export import discovery
        parent = discovery.capture_secret()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, discovery.capture_secret().encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = os.read(r, 200).decode()
        print(child not in ("", parent) and discovery.capture_secret() == parent)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert r.stdout.strip() == "True", r.stderr


@pytest.mark.slow
def test_doctor_with_thousands_of_stale_records_prints_a_few_lines(rdir: Path):
    for n in range(3000):
        write_record(rdir, 4_200_000 + n)  # above any pid_max: dead
    for n in range(12):
        (rdir / f"{1_000_000 + n}.json").write_text("{}")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(rdir))
    runs = [subprocess.run([sys.executable, "-m", "tpu_info", "--timeout", "1", "doctor"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
            for _ in range(2)]
    first, second = (r.stdout.splitlines() for r in runs)
    assert runs[0].returncode == 0 and len(first) < 20, runs[0].stdout
    assert f"  - discovery: removed 3,000 record(s) of exited processes from {rdir}" in first
    assert "  - discovery: 7 more records skipped: 7 corrupt" in first
    assert len(os.listdir(rdir)) == 12
    assert not any("removed" in line for line in second) and len(second) == len(first) - 1
