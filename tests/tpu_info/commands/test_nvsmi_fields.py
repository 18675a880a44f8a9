"""nvidia-smi's field names and nvitop's selections, in process (the fixture
runs; the command end to end: test_nvsmi_spellings): the rows each spelling
makes, the names with no meaning here, --pid/--user matching, and every
combination refused in one line (exit 2)."""

from __future__ import annotations

import pwd

import pytest

from tests.fixtures.snapshots import SCENARIOS, header
from tpu_info.commands import cli
from tpu_info.outputs import query
from tpu_info.outputs.nvsmi_fields import no_meaning, parse_fields, unsupported_line
from tpu_info.views.derived import readings
from tpu_info.views.selection import ProcessPick


def _lines(spelling: str, fields: str, pick: ProcessPick | None = None,
           only: set[str] | None = None) -> list[str]:
    views, local = SCENARIOS["tpu_host"]()
    run = readings(views, local=local, header=header(), only=only)
    q = parse_fields(fields, spelling)
    return query.csv_lines((pick or ProcessPick()).apply(run), q.fields,
                           query.Format(units=False), q.per)


def test_compute_apps_give_each_process_its_memory_on_each_chip():
    # The JAX program (4242) holds the four chips alone: each row is its HBM there.
    assert _lines("--query-compute-apps", "pid,name,used_memory,gpu_bus_id,gpu_name") == [
        "4242, train.py, 3328, 0000:00:05.0, TPU v5e",
        "4242, train.py, 4352, 0000:00:06.0, TPU v5e",
        "4242, train.py, 5376, 0000:00:07.0, TPU v5e",
        "4242, train.py, 6400, 0000:00:08.0, TPU v5e",
        "5151, serve.py, 512, [N/A], cpu"]  # the torch process's own CPU device
    assert _lines("--query-compute-apps", "pid,used_gpu_memory",
                  ProcessPick.of(None, ["bob"])) == ["5151, 512"]
    # -i 2: the JAX program on tpu2 alone; the torch program holds no chip, still listed.
    assert _lines("--query-compute-apps", "pid,gpu_bus_id", only={"tpu2"}) == [
        "4242, 0000:00:07.0", "5151, [N/A]"]


def test_query_gpu_index_is_the_chips_number_and_memory_is_mib():
    assert _lines("--query-gpu", "index,name,memory.used,memory.free,utilization.gpu")[:2] == [
        "0, TPU v5e, 3328, 12800, 88", "1, TPU v5e, 4352, 11776, 91"]


def test_query_lists_every_process_the_processes_table_does():
    # Process rows are the Processes table's: the targets (libtpu's row with its
    # devices' HBM, a failed target's all N/A), then each chip owner not hooked.
    assert _lines("--query", "pid,process,user,process_hbm") == [
        "[N/A], libtpu, [N/A], 19456", "4242, train.py, alice, 19456",
        "5151, serve.py, bob, 512", "[N/A], [N/A], [N/A], [N/A]"]
    assert _lines("--query", "pid,user", ProcessPick.of([4242], None)) == ["4242, alice"]


@pytest.mark.parametrize("spelling, name, header", [
    ("--query-gpu", "name", "name"), ("--query-gpu", "memory.used", "memory.used [MiB]"),
    ("--query-gpu", "hbm_used", "hbm_used [MiB]"), ("--query", "memory.used", "hbm_used [MiB]"),
    ("--query-compute-apps", "used_memory", "used_memory [MiB]"),
    ("--query-gpu", "power.draw", "power.draw"), ("--query", "uuid", "uuid"),
])
def test_the_header_says_what_was_asked(spelling, name, header):
    q = parse_fields(name, spelling)
    assert query.header_line(q.fields, query.Format()) == header


def test_names_with_no_meaning_are_na_and_said_once():
    q = parse_fields("index,clocks.sm,fan.speed,serial,utilization.memory", "--query-gpu")
    assert [name for name, _ in q.unsupported] == ["clocks.sm", "fan.speed", "serial",
                                                   "utilization.memory"]
    line = unsupported_line(q)
    assert "\n" not in line and line.count("clocks.sm, fan.speed (") == 1
    assert "runtime_hbm_utilization" in line  # where the memory bus's busy % is
    assert no_meaning("memory.used") is None and no_meaning("temperature.memory")
    assert unsupported_line(parse_fields("index", "--query-gpu")) == ""
    with pytest.raises(ValueError, match="--query-gpu: unknown field 'memory.usd'"):
        parse_fields("index,memory.usd", "--query-gpu")


def test_a_user_is_matched_by_name_or_uid():
    me = pwd.getpwuid(0).pw_name  # root: a name every machine has
    pick = ProcessPick.of(None, ["0"])
    assert me in pick.names and pick.words() == "--user 0"
    assert "0" in ProcessPick.of(None, [me]).names
    assert ProcessPick.of(None, ["nobody-here-x"]).names == frozenset({"nobody-here-x"})


@pytest.mark.parametrize("argv, says", [
    (["--only-visible", "--all"], "--only-visible (the default: the chips usable here) and "
                                  "--all (every chip on the host's PCI bus) contradict"),
    (["--pid", "1", "--query-gpu=index"], "--pid keeps processes, and --query-gpu prints a "
                                          "row per device"),
    (["--user", "a", "--query", "index,pid"], "--user keeps processes, and --query prints"),
    (["--pid", "1", "--metric", "hbm_usage"], "--pid keeps processes; --metric"),
    (["-q", "--json"], "-q prints every detail of each device: it takes no --json"),
    (["-q", "-p"], "-q prints every detail of each device: it takes no -p"),
    (["-q", "--query-gpu=index"], "it takes no --query-gpu"),
    (["--query", "pid", "--query-compute-apps=pid"], "--query and --query-compute-apps both"),
    (["--query-gpu=index", "-p"], "--query-gpu picks its own fields: drop -p"),
    (["--json", "--query-gpu=index"], "--json prints the whole document; -p, --metric and "
                                      "--query-gpu/--format"),
    (["--query-compute-apps=pid,bogus"], "--query-compute-apps: unknown field 'bogus'"),
    (["--only", "x"], "--only takes device ids"),
    (["--only", "0", "-p"], "--only selects the Devices table's chips: it takes no -p"),
    (["-L", "--pid", "3"], "-L lists this host's devices and exits: it takes no --pid"),
    (["-L", "-q"], "-L lists this host's devices and exits: it takes no -q"),
    (["--watch", "--only", "3"], "--watch is the interactive dashboard: it takes no --only"),
    (["--pid", "0"], "--pid must be a process id"),
    (["--pid", "1", "report"], "--pid must be a process id (a positive integer), got 'report'"),
    (["--user", "a b"], "--user takes user names or uids"),
    (["--format=csv"], "--format csv needs --query FIELD,... (or nvidia-smi's --query-gpu"),
])
def test_refused_in_one_line(argv, says, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and says in out.err, out.err


def test_help_query_lists_nvidia_smis_names_too(capsys):
    assert cli.main(["--help-query-gpu"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "index=id" in out and "used_memory=process_hbm" in out and "temperature.*" in out
