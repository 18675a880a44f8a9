"""Library code is decided by the import system, lines by their full path
(issue 41 item 11): a ``transformer.py`` of the program's own and one a
library installed by ``pip --target`` (a ``.dist-info`` lists it, no
``site-packages`` in its path) are told apart; an egg-info in the program's
own project (a legacy editable install) leaves its code the user's."""

from __future__ import annotations

import sys

import pytest

from metrics.engines._frames import LIBRARY, USER, LibraryFrames, installed_names, skip_prefixes


@pytest.fixture
def tree(tmp_path, monkeypatch):
    prog = tmp_path / "prog"
    (prog / "model").mkdir(parents=True)
    (prog / "model" / "transformer.py").write_text("")
    (prog / "model.egg-info").mkdir()  # setup.py develop: the program's own project
    (prog / "model.egg-info" / "top_level.txt").write_text("model\n")
    target = tmp_path / "libs"
    (target / "big" / "layers").mkdir(parents=True)
    (target / "big" / "layers" / "transformer.py").write_text("")
    (target / "loose").mkdir()
    (target / "loose" / "transformer.py").write_text("")  # in the root, no distribution's
    (target / "big-1.0.dist-info").mkdir()
    (target / "big-1.0.dist-info" / "RECORD").write_text(
        "big/__init__.py,,\nbig/layers/transformer.py,,\nbig-1.0.dist-info/RECORD,,\n"
        "../../bin/big,,\n")
    monkeypatch.setattr(sys, "path", [str(prog), *sys.path, str(target)])
    installed_names.cache_clear()
    yield prog, target
    installed_names.cache_clear()


def test_a_libraries_file_of_the_users_base_name_is_the_librarys(tree):
    prog, target = tree
    frames = LibraryFrames(skip_prefixes(), user_paths=())
    assert frames.kind(str(prog / "model" / "transformer.py")) == USER
    # Main before: anything outside a site-packages/dist-packages path was the user's.
    assert frames.kind(str(target / "big" / "layers" / "transformer.py")) == LIBRARY
    assert frames.kind(str(target / "loose" / "transformer.py")) == USER
    assert installed_names(str(target)) == {"big"}  # not RECORD's ../../bin nor its own


def test_user_paths_still_make_an_installed_file_the_users(tree):
    _, target = tree
    frames = LibraryFrames(skip_prefixes(), user_paths=(str(target),))
    assert frames.kind(str(target / "big" / "layers" / "transformer.py")) == USER


def test_a_file_in_this_interpreters_site_packages_is_a_library():
    import pytest as installed_module

    frames = LibraryFrames(skip_prefixes(), user_paths=())
    assert frames.kind(installed_module.__file__) == LIBRARY
