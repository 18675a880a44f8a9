"""The hot-path journal: every record folded exactly once, in order, whole,
while other threads append and flush."""

from __future__ import annotations

import threading

from metrics.recording.journal import Journal


def test_records_from_many_threads_are_folded_once_in_order_and_whole():
    folded: list[object] = []
    journal = Journal(folded.extend, fold_at=64)  # a small batch: many folds race appends
    q = journal.queue
    n_threads, per_thread = 6, 20_000
    start = threading.Barrier(n_threads + 1)

    def append(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            q.extend((t, i, -i))  # one record as its fields, as the hot paths write it
            if len(q) >= journal.fold_at:
                journal.flush()

    def flush_often() -> None:
        start.wait()
        while any(th.is_alive() for th in appenders):
            journal.flush()

    appenders = [threading.Thread(target=append, args=(t,)) for t in range(n_threads)]
    reader = threading.Thread(target=flush_often)
    for th in (*appenders, reader):
        th.start()
    for th in (*appenders, reader):
        th.join()
    journal.flush()
    assert len(folded) == 3 * n_threads * per_thread
    seen: dict[int, int] = {}
    for k in range(0, len(folded), 3):
        t, i, neg = folded[k:k + 3]
        assert neg == -i  # never torn: a record's fields stay together
        assert i == seen.get(t, -1) + 1  # each thread's records in its order, none lost
        seen[t] = i
    assert seen == {t: per_thread - 1 for t in range(n_threads)}


def test_single_values_none_included_and_clear():
    folded: list[object] = []
    journal = Journal(folded.extend)
    for v in (1, None, 2):
        journal.append(v)
    journal.flush()
    journal.flush()  # nothing waiting: no fold
    assert folded == [1, None, 2]
    journal.append(3)
    journal.clear()
    journal.flush()
    assert folded == [1, None, 2]


def test_every_deferral_is_a_journal_folded_by_the_one_policy():
    """What the hot path defers (steps, samples, graph executions, engine
    journals) waits in journals only; each folds on the appending thread at
    its threshold and before anything reads what it folds into."""
    from metrics.recording import journal
    from metrics.recording.recorder import Recorder

    rec = Recorder()
    dist = rec.registry.distribution("D")
    deferrals = {"samples": dist._samples, "executions": rec.ledger._executions,
                 "steps": rec._steps}
    assert all(type(j) is journal.Journal for j in deferrals.values())
    assert {j.fold_at for j in deferrals.values()} <= {journal.FOLD_AT, journal.SAMPLES_FOLD_AT}
    # Policy 2: a read sees everything appended before it.
    dist.observe(1.0)
    rec.ledger.compiled("h", "f", "jax", 0.1)
    rec.ledger.executed("h", "f", "jax", n=3)
    rec.mark_step()
    rec.mark_step()
    assert [len(j) for j in deferrals.values()] == [1, 1, 2]
    _, dists = rec.registry.snapshot()
    assert [d.count for d in dists if d.name == "D"] == [1]
    assert rec.ledger.snapshot()[0].executions == 3
    assert rec.registry.counter_value("MarkStep") == 2
    assert [len(j) for j in deferrals.values()] == [0, 0, 0]
    # Policy 1: the appending thread folds at the threshold, nothing waits beyond it.
    for i in range(journal.SAMPLES_FOLD_AT):
        dist.observe(float(i))
    for _ in range(journal.FOLD_AT):
        rec.ledger.executed("h", "f", "jax")
        rec.mark_step()
    assert [len(j) for j in deferrals.values()] == [0, 0, 0]
    # A compile reads the entry: the executions before it are folded first.
    rec.ledger.executed("h", "f", "jax")
    rec.ledger.compiled("h", "f", "jax", 0.1)
    assert len(deferrals["executions"]) == 0
