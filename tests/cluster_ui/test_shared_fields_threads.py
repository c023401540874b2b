"""Serializers on shared fields stay correct when one is nested in another and requests check input
on several threads at once (the development server and a threaded WSGI server do): what one
request gives is never what another request's check looks at."""

import sys
import threading

from rest_framework import serializers

from cluster_ui.api.shared_fields import CheckedOnSharedFields


class Inner(CheckedOnSharedFields, serializers.Serializer):
    a = serializers.IntegerField(required=False)
    b = serializers.IntegerField(required=False, max_value=10)


class Outer(CheckedOnSharedFields, serializers.Serializer):
    inner = Inner()  # one instance, shared by every Outer: the case that must not mix requests


def test_a_nested_check_never_sees_another_threads_input():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    wrong = []

    def leaves_b_out():
        for _ in range(3000):
            Outer(data={"inner": {"a": 2}}).is_valid()

    def gives_b():
        for _ in range(3000):
            if Outer(data={"inner": {"a": 1, "b": 999}}).is_valid():
                wrong.append("b=999 accepted")
            valid = Outer(data={"inner": {"a": 1, "b": 5}})
            if not valid.is_valid() or valid.validated_data["inner"].get("b") != 5:
                wrong.append("b=5 dropped")

    try:
        threads = [threading.Thread(target=leaves_b_out), threading.Thread(target=gives_b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert wrong == []
