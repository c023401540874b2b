"""Which Colony account an identity at the provider is."""

from django.conf import settings
from django.db import models


class OidcIdentity(models.Model):
    """An account signed in through OpenID Connect, known by the provider's (issuer, subject).

    The subject is the one claim a provider promises never to reuse or change; an email address
    can be edited at the IdP or handed to the next person, so it never picks the account. Its
    memberships and staff flag follow the IdP's groups at every sign-in.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    # As the last sign-in sent them: what an operator looks at when a mapping surprises someone.
    groups = models.JSONField(default=list, blank=True)
    # The POSIX account name the provider gives (COLONY_OIDC_POSIX_CLAIM), refreshed at each
    # sign-in: the account the user's jobs run as on the nodes. Blank: their Colony name is looked up.
    posix_name = models.CharField(max_length=32, blank=True, default="")
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "OpenID Connect identity"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique_subject")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
