"""Pending reasons read as a person would write them: totals are totals, one GPU is one GPU, and
times are times, not epoch floats."""

import pytest

from jobs.scheduling import reasons


def test_the_ceiling_reason_names_the_ceiling_and_what_the_job_needs():
    message = reasons.at_max_gpus("vision", max_milli=16000, need_milli=2000).message
    assert "is at its 16-GPU ceiling: what it runs now and this job's 2 would be more than that" in message


@pytest.mark.parametrize("needed, words", [(1, "the 1 spare GPU it needs is not free"),
                                           (4, "the 4 spare GPUs it needs are not free")])
def test_spare_capacity_reasons_agree_in_number(needed, words):
    assert words in reasons.no_spare_capacity(needed).message
    assert words in reasons.over_quota_cluster_full("vision", 4000, 0, needed).message


def test_a_reservation_says_until_when_as_a_time():
    details = reasons.holding_reservation(8, ("n1",), until=1_700_000_000.0, now=1_699_999_000.0).details
    assert details["held_until"] == "2023-11-14T22:13:20+00:00"
