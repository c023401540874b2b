"""Create the demo tenants and users (idempotent: running it again resets their passwords)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management.base import BaseCommand
from django.db import transaction

from jobs.models import Membership, Tenant

DEMO_TENANTS = [
    # slug, name, guaranteed, ceiling, weight
    ("vision", "Vision Lab", 8, 16, 1.0),
    ("nlp", "NLP Group", 8, 16, 1.0),
]
DEMO_USERS = [
    # username, tenant, staff
    ("alice", "vision", False),
    ("bob", "nlp", False),
    ("operator", None, True),
]


class Command(BaseCommand):
    help = "Create demo tenants (vision, nlp), researchers (alice, bob) and an operator."

    def add_arguments(self, parser):
        parser.add_argument("--password", default="colony-demo", help="Password for every demo user.")

    @transaction.atomic
    def handle(self, *args, password: str, **options):
        User = get_user_model()
        # Every demo user has the same password: hash it once with the configured (slow, strong)
        # hasher rather than once per user, which was most of the command's time.
        password_hash = make_password(password)
        tenants = {}
        for slug, name, guaranteed, ceiling, weight in DEMO_TENANTS:
            tenants[slug], _ = Tenant.objects.get_or_create(
                slug=slug, defaults={"name": name, "guaranteed_gpus": guaranteed, "max_gpus": ceiling, "weight": weight}
            )
        for username, tenant, staff in DEMO_USERS:
            user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@example.org"})
            user.is_staff = user.is_superuser = staff
            user.password = password_hash
            user.save()
            if tenant:
                Membership.objects.get_or_create(user=user, tenant=tenants[tenant])
        self.stdout.write(self.style.SUCCESS(
            "Demo ready: " + ", ".join(f"{u} ({t or 'operator'})" for u, t, _ in DEMO_USERS)
            + f" / password {password!r}"
        ))
