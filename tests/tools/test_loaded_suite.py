"""tools/loaded_suite.py deals the suite's files into shards of about equal
size, each file exactly once (a file left out would pass unseen)."""

from __future__ import annotations

from pathlib import Path

from tools.loaded_suite import deal, find_test_files

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_file_is_in_exactly_one_shard():
    files = find_test_files(["tests"])
    assert len(files) > 100 and all(f.name.startswith("test_") for f in files)
    shards = deal(files, 4)
    dealt = [f for s in shards for f in s]
    assert sorted(dealt) == sorted(files) and len(set(dealt)) == len(dealt)


def test_shards_are_about_equal_in_size():
    shards = deal(find_test_files(["tests"]), 4)
    sizes = [sum(f.stat().st_size for f in s) for s in shards]
    biggest_file = max(f.stat().st_size for s in shards for f in s)
    assert max(sizes) - min(sizes) <= biggest_file


def test_a_file_and_a_folder_can_be_named():
    one = ROOT / "tests" / "tools" / "test_loaded_suite.py"
    assert find_test_files([str(one)]) == [one]
    assert one in find_test_files(["tests/tools"])
    assert deal([one], 4) == [[one]]
