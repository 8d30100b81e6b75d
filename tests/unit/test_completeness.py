"""The audit's arithmetic and verdicts, on batch records built by hand."""

from __future__ import annotations

from airflow_provider_logbus.completeness import build_report, data_losses, judge, newly_complete_hours, offset_gaps
from airflow_provider_logbus.plan import Range
from airflow_provider_logbus.targets.base import BatchRecord

H = 3_600_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00Z


def record(batch_id: str, ranges: list[tuple[int, int, int]], counts: dict[int, int],
           rejected: dict[int, int] | None = None) -> BatchRecord:
    return BatchRecord(
        table="tbl", batch_id=batch_id, interval_start="", interval_end=batch_id, run_id="r",
        ranges=[Range("t", p, s, e) for p, s, e in ranges],
        counts=[{"topic": "t", "window_start": w, "count": n} for w, n in counts.items()],
        row_count=sum(counts.values()),
        rejected=[{"topic": "t", "window_start": w, "count": n} for w, n in (rejected or {}).items()],
        rejected_count=sum((rejected or {}).values()))


def report(batches, produced: dict[int, int], threshold=0.999):
    return build_report("tbl", "t", T0, T0 + 2 * H, {("t", w): n for w, n in produced.items()}, batches, threshold)


def test_produced_equals_loaded_plus_rejected_plus_missing_per_hour():
    r = report([record("b1", [(0, 0, 100)], {T0: 90, T0 + H: 40}, rejected={T0: 5})], {T0: 100, T0 + H: 40})
    first = r["hours"][0]
    assert (first["produced"], first["loaded"], first["rejected"], first["missing"]) == (100, 90, 5, 5)
    assert (r["produced"], r["loaded"], r["rejected"], r["missing"], r["duplicated"]) == (140, 130, 5, 5, 0)


def test_a_batch_recorded_twice_fails_the_audit_naming_both_batches_and_the_range():
    once = record("b1", [(0, 0, 100)], {T0: 10})
    twice = record("b1-copy", [(0, 0, 100)], {T0: 10})
    r = judge(report([once, twice], {T0: 10}), now_ms=T0, grace_ms=10 * H)
    assert r["status"] == "failed" and r["duplicated"] == 10
    assert "bytes [0, 100) loaded by both batch b1 and batch b1-copy" in r["reasons"][0]


def test_overlapping_ranges_fail_the_audit_even_when_counts_balance():
    a = record("a", [(0, 0, 100)], {T0: 5})
    b = record("b", [(0, 50, 150)], {T0: 5})
    r = judge(report([a, b], {T0: 10}), now_ms=T0, grace_ms=0)
    assert r["duplicated"] == 0 and r["status"] == "failed"
    assert r["overlaps"] == [{"partition": 0, "kind": "overlap", "start": 50, "end": 100, "after": "a", "before": "b"}]


def test_gaps_are_measured_against_the_furthest_end_seen():
    wide, inside, after = (record("w", [(0, 0, 300)], {}), record("i", [(0, 100, 200)], {}),
                           record("x", [(0, 250, 400)], {}))
    kinds = [(g["kind"], g["start"], g["end"]) for g in offset_gaps([wide, inside, after], "t")]
    assert kinds == [("overlap", 100, 200), ("overlap", 250, 300)]


def test_missing_rows_are_pending_before_the_grace_and_failed_after():
    batches = [record("b1", [(0, 0, 100)], {T0: 90})]
    assert judge(report(batches, {T0: 100}), now_ms=T0 + 2 * H, grace_ms=H)["status"] == "pending"
    assert judge(report(batches, {T0: 100}), now_ms=T0 + 3 * H, grace_ms=H)["status"] == "failed"


def test_complete_hours_are_announced_once_and_in_order():
    batches = [record("b1", [(0, 0, 100)], {T0: 10, T0 + H: 3})]
    r = judge(report(batches, {T0: 10, T0 + H: 5}), now_ms=T0 + 5 * H, grace_ms=0)
    assert [h["status"] for h in r["hours"]] == ["complete", "incomplete"]
    assert [h["hour_ms"] for h in newly_complete_hours(r, None)] == [T0]
    assert newly_complete_hours(r, T0 + H) == []  # hour 1 is incomplete: nothing to announce


def test_an_incomplete_hour_blocks_later_complete_hours():
    batches = [record("b1", [(0, 0, 100)], {T0: 5, T0 + H: 5})]
    r = judge(report(batches, {T0: 10, T0 + H: 5}), now_ms=T0 + 5 * H, grace_ms=0)
    assert newly_complete_hours(r, None) == []


def test_hours_are_announced_once_whatever_order_the_audits_run_in(tmp_path):
    from airflow_provider_logbus.completeness import announce_complete_hours
    from airflow_provider_logbus.targets.directory import DirectoryTarget

    target = DirectoryTarget(tmp_path, "tbl")
    batches = [record("b1", [(0, 0, 100)], {T0: 10, T0 + H: 10, T0 + 2 * H: 10})]
    produced = {("t", T0): 10, ("t", T0 + H): 10, ("t", T0 + 2 * H): 10}

    def audit(until_ms: int, run_id: str) -> list[str]:
        hours = announce_complete_hours(target, "t", produced, batches, 0.999, T0 + 10 * H, 0, until_ms, run_id)
        return [h["hour"] for h in hours]

    assert audit(T0 + 2 * H, "run-for-hour-1") == ["2024-01-01T00:00Z", "2024-01-01T01:00Z"]
    assert audit(T0 + H, "run-for-hour-0") == []  # already announced by the later run
    assert audit(T0 + 3 * H, "run-for-hour-2") == ["2024-01-01T02:00Z"]
    assert target.complete_through() == T0 + 3 * H


def test_a_stale_announcement_loses_the_compare_and_swap(tmp_path):
    from airflow_provider_logbus.targets.directory import DirectoryTarget

    target = DirectoryTarget(tmp_path, "tbl")
    first = {"complete_through_ms": T0 + H, "run_id": "a", "hours": ["h0"]}
    assert target.announce(None, first)
    assert not target.announce(None, {"complete_through_ms": T0 + H, "run_id": "b", "hours": ["h0"]})
    assert target.announcement() == first


def test_empty_hours_are_passed_over_not_announced():
    batches = [record("b1", [(0, 0, 100)], {T0: 10, T0 + 2 * H: 10})]
    r = judge(build_report("tbl", "t", T0, T0 + 3 * H, {("t", T0): 10, ("t", T0 + 2 * H): 10}, batches, 0.999),
              now_ms=T0 + 9 * H, grace_ms=0)
    assert [h["hour_ms"] for h in newly_complete_hours(r, None)] == [T0, T0 + 2 * H]


def test_bytes_lost_to_retention_are_reported_per_batch_and_are_not_a_hole():
    lossy = BatchRecord(table="tbl", batch_id="b2", interval_start="", interval_end="b2", run_id="r",
                        ranges=[Range("t", 0, 300, 400, lost_start=100, lost_end=300)], counts=[], row_count=0)
    batches = [record("b1", [(0, 0, 100)], {}), lossy]
    assert data_losses(batches, "t") == [{"batch_id": "b2", "partition": 0, "lost_start": 100, "lost_end": 300,
                                         "bytes": 200}]
    assert offset_gaps(batches, "t") == []
    assert data_losses(batches, "other") == []


def test_a_hole_between_batches_is_reported_with_both_batch_ids():
    gaps = offset_gaps([record("a", [(0, 0, 100)], {}), record("b", [(0, 150, 200)], {})], "t")
    assert gaps == [{"partition": 0, "kind": "hole", "start": 100, "end": 150, "after": "a", "before": "b"}]


def test_each_hour_says_why_it_is_not_complete():
    ok, short, doubled = (record("b1", [(0, 0, 100)], {T0: 10, T0 + H: 8}),
                          record("b2", [(0, 100, 200)], {T0 + 2 * H: 10}), record("b3", [(1, 0, 50)], {T0 + 2 * H: 2}))
    r = judge(build_report("tbl", "t", T0, T0 + 3 * H, {("t", T0): 10, ("t", T0 + H): 10, ("t", T0 + 2 * H): 10},
                           [ok, short, doubled], 0.999), now_ms=T0 + 9 * H, grace_ms=0)
    assert [h["reasons"] for h in r["hours"]] == [
        [], ["completeness 80.0000% under the threshold 99.9000% (2 missing at the table tier (2))"],
        ["2 duplicated row(s) at the table tier (2)"]]
    pending = judge(build_report("tbl", "t", T0, T0 + H, {("t", T0): 10}, [record("b", [(0, 0, 9)], {T0: 9})], 0.999),
                    now_ms=T0 + H, grace_ms=H)
    assert pending["hours"][0]["reasons"] == [
        "completeness 90.0000% under the threshold 99.9000% (1 missing at the table tier (1)); late data may still "
        "come until its grace has passed"]


def announced_table(tmp_path, batches, produced):
    """A directory target whose hours of `batches` are announced complete, as audits do."""
    from airflow_provider_logbus.completeness import announce_complete_hours
    from airflow_provider_logbus.targets.directory import DirectoryTarget

    target = DirectoryTarget(tmp_path, "tbl")
    announce_complete_hours(target, "t", produced, batches, 0.999, T0 + 10 * H, 0, T0 + 3 * H, "announcing-run")
    assert target.complete_through() == T0 + 3 * H
    return target


def test_an_announced_hour_that_is_no_longer_complete_is_withdrawn_and_the_watermark_falls_back(tmp_path):
    from airflow_provider_logbus.completeness import withdraw_hours, withdrawn_hours

    produced = {("t", T0): 10, ("t", T0 + H): 10, ("t", T0 + 2 * H): 10}
    batches = [record("b1", [(0, 0, 100)], {T0: 10, T0 + H: 10, T0 + 2 * H: 10})]
    target = announced_table(tmp_path, batches, produced)
    copied = record("copied-by-hand", [(0, 0, 100)], {T0 + H: 10})  # hour 1's rows a second time
    now = judge(build_report("tbl", "t", T0, T0 + 3 * H, produced, batches + [copied], 0.999), T0 + 10 * H, 0)
    assert [h["hour"] for h in withdrawn_hours(now, T0 + 3 * H)] == ["2024-01-01T01:00Z"]
    withdrawn = withdraw_hours(target, now, "auditing-run")
    assert [(h["hour"], h["status"]) for h in withdrawn] == [("2024-01-01T01:00Z", "duplicated")]
    assert target.complete_through() == T0 + H
    assert target.announcement() == {"complete_through_ms": T0 + H, "run_id": "auditing-run", "hours": [],
                                     "withdrawn": ["2024-01-01T01:00Z"], "withdrawn_from_ms": T0 + 3 * H}
    assert withdraw_hours(target, now, "again") == []  # nothing before the watermark is wrong any more


def test_a_pending_hour_is_not_withdrawn():
    """An audit with a longer grace than the one that announced an hour finds it pending:
    not a change of the table, so nothing to withdraw."""
    from airflow_provider_logbus.completeness import withdrawn_hours

    batches = [record("b1", [(0, 0, 100)], {T0: 9})]
    r = judge(build_report("tbl", "t", T0, T0 + H, {("t", T0): 10}, batches, 0.999), now_ms=T0 + H, grace_ms=2 * H)
    assert r["hours"][0]["status"] == "pending" and withdrawn_hours(r, T0 + H) == []


def test_once_the_withdrawn_hour_is_complete_again_it_and_the_hours_after_it_are_announced_again(tmp_path):
    from airflow_provider_logbus.completeness import announce_complete_hours, withdraw_hours

    produced = {("t", T0): 10, ("t", T0 + H): 10, ("t", T0 + 2 * H): 10}
    batches = [record("b1", [(0, 0, 100)], {T0: 10, T0 + H: 10, T0 + 2 * H: 10})]
    target = announced_table(tmp_path, batches, produced)
    broken = batches + [record("copied-by-hand", [(0, 0, 100)], {T0 + H: 10})]
    withdraw_hours(target, judge(build_report("tbl", "t", T0, T0 + 3 * H, produced, broken, 0.999), T0 + 10 * H, 0),
                   "auditing-run")

    def announce(table_batches) -> list[str]:
        return [h["hour"] for h in announce_complete_hours(target, "t", produced, table_batches, 0.999, T0 + 10 * H,
                                                           0, T0 + 3 * H, "later-run")]

    assert announce(broken) == [] and target.complete_through() == T0 + H  # the broken hour holds the rest back
    assert announce(batches) == ["2024-01-01T01:00Z"]  # the copy removed: hour 2 still held, no second event
    assert target.complete_through() == T0 + 3 * H
    assert "withdrawn" not in target.announcement()  # back where it was: the withdrawal is over


def test_a_re_announcement_cut_short_still_spares_the_hours_that_held(tmp_path):
    """Hours 1 and 3 withdrawn from a watermark at hour 4; hour 1 mended first: hour 1 is
    announced again, hour 2 is passed silently, and hour 3 waits — and gets its event
    once mended, while hour 2 never gets a second one."""
    from airflow_provider_logbus.completeness import announce_complete_hours, withdraw_hours
    from airflow_provider_logbus.targets.directory import DirectoryTarget

    hours = [T0 + i * H for i in range(4)]
    produced = {("t", h): 10 for h in hours}
    batches = [record("b1", [(0, 0, 100)], {h: 10 for h in hours})]
    target = DirectoryTarget(tmp_path, "tbl")
    announce_complete_hours(target, "t", produced, batches, 0.999, T0 + 10 * H, 0, T0 + 4 * H, "announcing-run")
    copies = [record("copy-1", [(0, 200, 300)], {T0 + H: 10}), record("copy-3", [(0, 300, 400)], {T0 + 3 * H: 10})]
    withdraw_hours(target, judge(build_report("tbl", "t", T0, T0 + 4 * H, produced, batches + copies, 0.999),
                                 T0 + 10 * H, 0), "auditing-run")
    assert target.complete_through() == T0 + H

    def announce(table_batches) -> list[str]:
        return [h["hour"] for h in announce_complete_hours(target, "t", produced, table_batches, 0.999, T0 + 10 * H,
                                                           0, T0 + 4 * H, "later-run")]

    assert announce(batches + copies[1:]) == ["2024-01-01T01:00Z"]  # hour 2 passed, hour 3 still duplicated
    assert target.complete_through() == T0 + 3 * H
    assert announce(batches) == ["2024-01-01T03:00Z"]
    assert target.complete_through() == T0 + 4 * H


# ------------------------------------------------------------------ the broker tier

def counted(windows: dict[int, int], upto: dict[int, int], began: int = 0, kept_from: int = 0):
    from broker.client.brokercounts import BrokerCounts

    return BrokerCounts({("t", w): n for w, n in windows.items()}, {("t", p): began for p in upto},
                        {("t", p): u for p, u in upto.items()}, {("t", p): kept_from for p in upto})


def broker_report(batches, produced, broker, start=T0, hours=1):
    return build_report("tbl", "t", start, start + hours * H, {("t", w): n for w, n in produced.items()}, batches,
                        0.999, broker=broker)


def test_a_topic_without_producer_events_is_audited_from_the_brokers_counts():
    r = judge(broker_report([record("b1", [(0, 0, 100)], {T0: 8, T0 + 600_000: 2})], {},
                            counted({T0: 8, T0 + 600_000: 2}, {0: 100})), now_ms=T0 + 5 * H, grace_ms=0)
    assert r["tiers"] == ["broker", "table"]
    assert [t["tier"] for t in r["hours"][0]["tiers"]] == ["broker", "table"]
    assert (r["produced"], r["counted"], r["loaded"], r["status"]) == (10, 10, 10, "ok")
    assert r["hours"][0]["status"] == "complete"


def test_records_the_brokers_committed_but_the_table_lacks_are_missing_at_the_table():
    r = judge(broker_report([record("b1", [(0, 0, 100)], {T0: 7})], {}, counted({T0: 10}, {0: 100})),
              now_ms=T0 + 5 * H, grace_ms=0)
    assert r["hours"][0]["missing_at"] == ["table"] and r["missing"] == 3 and r["status"] == "failed"


def test_beside_producer_events_the_broker_tier_names_what_producers_sent_and_no_broker_committed():
    r = judge(broker_report([record("b1", [(0, 0, 100)], {T0: 9})], {T0: 10}, counted({T0: 9}, {0: 100})),
              now_ms=T0 + 5 * H, grace_ms=0)
    assert r["tiers"] == ["producer", "broker", "table"]
    assert r["hours"][0]["missing_at"] == ["broker"] and (r["produced"], r["counted"]) == (10, 9)


def test_a_table_ahead_of_the_brokers_counting_is_pending_not_duplicated():
    """The leaders count every few seconds: an audit right after a load finds the table
    holding records not counted yet. No verdict until the counts cover what it loaded."""
    batches = [record("b1", [(0, 0, 100)], {T0: 10})]
    r = judge(broker_report(batches, {}, counted({T0: 6}, {0: 60})), now_ms=T0 + 5 * H, grace_ms=0)
    assert (r["status"], r["hours"][0]["status"]) == ("pending", "pending")
    assert r["broker_behind"] == [{"partition": 0, "counted_to": 60, "loaded_to": 100}]
    assert "partition 0 counted to 60, loaded to 100" in r["hours"][0]["reasons"][0]
    caught_up = judge(broker_report(batches, {}, counted({T0: 10}, {0: 100})), now_ms=T0 + 5 * H, grace_ms=0)
    assert caught_up["status"] == "ok"


def test_a_topic_written_by_producers_with_and_without_events_is_complete_and_says_how_many_were_unreported():
    r = judge(broker_report([record("b1", [(0, 0, 100)], {T0: 8})], {T0: 5}, counted({T0: 8}, {0: 100})),
              now_ms=T0 + 5 * H, grace_ms=0)
    assert (r["status"], r["unreported"], r["produced"], r["duplicated"]) == ("ok", 3, 8, 0)
    short = judge(broker_report([record("b1", [(0, 0, 100)], {T0: 7})], {T0: 5}, counted({T0: 8}, {0: 100})),
                  now_ms=T0 + 5 * H, grace_ms=0)
    assert short["hours"][0]["missing_at"] == ["table"] and short["completeness"] == 7 / 8


def test_a_real_duplicate_fails_at_once_once_the_brokers_have_counted():
    batches = [record("b1", [(0, 0, 100)], {T0: 10}), record("b2", [(0, 100, 200)], {T0: 3})]
    r = judge(broker_report(batches, {}, counted({T0: 10}, {0: 200})), now_ms=T0, grace_ms=10 * H)
    assert r["status"] == "failed" and r["hours"][0]["duplicated_at"] == ["table"]


def test_hours_the_brokers_counted_only_in_part_are_audited_as_before_the_broker_tier():
    """Counting began after retention deleted offsets a batch loaded (an upgraded
    cluster), or the hour's windows were pruned: the broker tier is shown, not compared."""
    old = record("old", [(0, 0, 100)], {T0: 10})
    new = record("new", [(0, 100, 200)], {T0 + H: 5})
    r = judge(broker_report([old, new], {T0: 10}, counted({T0: 4, T0 + H: 5}, {0: 200}, began=50), hours=2),
              now_ms=T0 + 5 * H, grace_ms=0)
    first, second = r["hours"]
    assert [t["tier"] for t in first["tiers"]] == ["producer", "broker", "table"]
    assert first["tiers"][1] == {"tier": "broker", "count": 4, "partial": True}
    assert first["status"] == "complete" and second["status"] == "complete"
    assert (second["unreported"], second["produced"]) == (5, 5)  # committed by producers without events
    from dataclasses import replace

    skipped = replace(counted({T0: 4}, {0: 100}), skipped={("t", 0): [(30, 60)]})  # deleted before counted
    assert broker_report([old], {T0: 10}, skipped)["hours"][0]["tiers"][1]["partial"]
    pruned = judge(broker_report([old], {}, counted({}, {0: 100}, kept_from=T0 + H)), now_ms=T0 + 5 * H,
                   grace_ms=0)
    assert pruned["hours"][0]["tiers"][1]["partial"] and pruned["hours"][0]["duplicated_at"] == ["table"]
