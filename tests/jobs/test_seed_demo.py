from django.contrib.auth import authenticate
from django.core.management import call_command

from jobs.models import Membership, Tenant


def test_seed_demo_twice_gives_the_same_demo(db):
    call_command("seed_demo", password="pw-1")
    call_command("seed_demo", password="pw-2")
    assert set(Tenant.objects.values_list("slug", flat=True)) == {"vision", "nlp"}
    assert Membership.objects.count() == 2
    assert authenticate(username="alice", password="pw-2")
    operator = authenticate(username="operator", password="pw-2")
    assert operator.is_staff
