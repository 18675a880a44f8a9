"""The exporter's choice of targets (issue 29, item 4): answering and newest
first, dials that may hang bounded by those that hung lately, everything not
asked counted by reason."""

from __future__ import annotations

from pathlib import Path

from tpu_info.commands.exporter_targets import TargetChooser
from tpu_info.contract.discovery_record import DiscoveredProcess


def _proc(pid: int, port: int, start: float) -> DiscoveredProcess:
    return DiscoveredProcess(pid=pid, port=port, host="127.0.0.1", argv=("x.py",),
                             engine="jax", versions={}, start_time=start,
                             path=Path(f"/nonexistent/{pid}.json"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_new_targets_newest_first_and_hung_dials_spend_the_budget() -> None:
    clock = Clock()
    chooser = TargetChooser(max_targets=256, dial_budget=8, window_s=20.0, clock=clock)
    dead = [_proc(100 + i, 5000 + i, start=float(i)) for i in range(50)]
    real = _proc(7, 6000, start=100.0)  # low pid, started last
    listening = {p.port: {0} for p in [*dead, real]}
    asked, skipped = chooser.choose([*dead, real], listening)
    assert asked[0] == real and len(asked) == 8
    assert skipped == {"dial_budget": 43}
    for p in asked:
        chooser.answered(p, p is real, hung=p is not real)
    clock.now += 2.5
    before = {p.pid for p in asked}
    asked, skipped = chooser.choose([*dead, real], listening)
    # 7 dials hung in the last 20 s: one dial left, for the newest never asked.
    assert asked[0] == real and len(asked) == 2 and asked[1].pid not in before
    assert skipped == {"dial_budget": 42, "not_answering": 7}
    clock.now += 25.0  # after the window: new ones first, those that hung last
    asked, skipped = chooser.choose([*dead, real], listening)
    assert asked[0] == real and len(asked) == 9
    assert not {p.pid for p in asked[1:]} & before
    assert skipped == {"dial_budget": 34, "not_answering": 8}


def test_many_answering_programs_are_all_asked_within_two_polls() -> None:
    clock = Clock()
    chooser = TargetChooser(max_targets=256, dial_budget=64, clock=clock)
    procs = [_proc(10 + i, 7000 + i, start=float(i)) for i in range(100)]
    first, skipped = chooser.choose(procs, None)
    assert len(first) == 64 and skipped == {"dial_budget": 36}
    for p in first:
        chooser.answered(p, True)
    clock.now += 1
    second, skipped = chooser.choose(procs, None)
    assert len(second) == 100 and not skipped  # answering ones never wait on the budget


def test_closed_ports_and_max_targets_are_counted() -> None:
    chooser = TargetChooser(max_targets=3, dial_budget=64, clock=Clock())
    procs = [_proc(10 + i, 7000 + i, start=float(i)) for i in range(6)]
    asked, skipped = chooser.choose(procs, {7000: {0}, 7001: {0}, 7002: {0}, 7003: {0}})
    assert [p.pid for p in asked] == [13, 12, 11]
    assert skipped == {"port_closed": 2, "max_targets": 1}


def test_a_program_that_greets_is_asked_whatever_the_hung_records_and_they_back_off() -> None:
    from tpu_info.commands.exporter_targets import MAX_BACKOFF_POLLS

    clock = Clock()
    real = _proc(7, 6000, start=1.0)  # the oldest record
    hung = [_proc(100 + i, 5000 + i, start=10.0 + i) for i in range(500)]
    watched = {p.target: [] for p in [*hung[:3], *hung[-3:]]}  # polls each was looked at
    looked: list[int] = []
    poll = [0]

    def greet(targets: list[str]) -> set[str]:
        looked.append(len(targets))
        for t in targets:
            if t in watched:
                watched[t].append(poll[0])
        return {real.target} & set(targets)

    chooser = TargetChooser(max_targets=256, dial_budget=64, window_s=20.0, clock=clock,
                            greet=greet)
    for poll[0] in range(1, 60):
        asked, skipped = chooser.choose([*hung, real], None)
        assert asked[0] == real  # asked first, every poll
        assert len(asked) + sum(skipped.values()) == 501
        for p in asked:
            chooser.answered(p, p is real, hung=p is not real)
        clock.now += 5.0
    # Backed off: hung records are looked at in a few polls of the 59, not in each.
    assert looked[0] == 501 and sum(looked) < 500 * 59 / 4, looked
    for polls in watched.values():  # oldest and newest alike have their turn, never starved
        assert polls[0] == 1 and max(b - a for a, b in zip(polls, [*polls[1:], 60])) \
            <= MAX_BACKOFF_POLLS, polls


def test_targets_skipped_while_they_do_not_answer_are_named_as_down() -> None:
    """A target backed off after failing is not asked, and still down (the
    exporter keeps its tpu_info_target_up 0); an answering one is not."""
    clock = Clock()
    real, silent = _proc(7, 6000, start=1.0), _proc(8, 6001, start=2.0)
    chooser = TargetChooser(max_targets=256, dial_budget=64, clock=clock,
                            greet=lambda targets: set())
    asked, _ = chooser.choose([real, silent], None)
    assert chooser.not_answering([real, silent]) == []  # not tried yet
    for _ in range(2):  # silent twice in a row: its next turn is two polls on
        assert asked == [real, silent] or asked == [silent, real]
        for p in asked:
            chooser.answered(p, p is real, hung=p is silent)
        asked, skipped = chooser.choose([real, silent], None)
    assert asked == [real] and skipped == {"not_answering": 1}
    assert chooser.not_answering([real, silent]) == [silent]
