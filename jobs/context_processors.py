"""What every page's navigation needs from ``jobs``: the tenants the user leads (for "Members")."""

from django.utils.functional import SimpleLazyObject

from jobs.choices import Role
from jobs.models import Membership


def led_tenants(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"led_tenants": []}
    return {"led_tenants": SimpleLazyObject(lambda: list(
        Membership.objects.filter(user=user, role=Role.LEAD).order_by("tenant__slug")
        .values_list("tenant__slug", flat=True)))}
