"""``{% sso_sign_in %}``: the login page's "Sign in with <provider>" link, when single sign-on is on."""

from django import template
from django.conf import settings

register = template.Library()


@register.inclusion_tag("sso/sign_in_link.html", takes_context=True)
def sso_sign_in(context):
    return {"enabled": settings.COLONY_OIDC_ENABLED, "provider_name": settings.COLONY_OIDC_PROVIDER_NAME,
            "next": context.get("next", "")}
