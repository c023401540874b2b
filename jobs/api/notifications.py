"""REST API v1 /me/notifications/: the signed-in user's notification settings, and a test send.

The URL names no user: the object is always ``request.user``'s, so nobody can read or change
another user's settings however the request is built. Until a user saves, GET answers the
defaults (nothing is sent). Operators may also list alert kinds (``alert:node_lost`` ...) in
``events``; anyone else asking for one gets a 400: alerts name other tenants' jobs.
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.exceptions import Throttled
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import NotificationSettings
from jobs.services import notifications

EVENT_NAMES = [event for event, _ in notifications.EVENT_CHOICES] + notifications.ALERT_EVENTS


class NotificationSettingsSerializer(serializers.ModelSerializer):
    email_address = serializers.CharField(source="user.email", read_only=True,
                                          help_text="Where email goes (set by an operator); empty: nowhere yet.")
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EVENT_NAMES), required=False, allow_empty=True,
        help_text=("Any of succeeded, failed (time-outs included), preempted, long_wait; operators also "
                   f"cluster alerts: {', '.join(notifications.ALERT_EVENTS)}."))
    long_wait_minutes = serializers.IntegerField(min_value=1, max_value=notifications.MAX_LONG_WAIT_MINUTES,
                                                 required=False,
                                                 help_text="A pending job waiting longer than this is a long wait.")

    class Meta:
        model = NotificationSettings
        fields = ["email", "email_address", "webhook_url", "events", "long_wait_minutes"]

    def validate_email(self, value: bool) -> bool:
        problem = notifications.email_problem(self.context["request"].user, value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_webhook_url(self, value: str) -> str:
        try:
            return notifications.checked_webhook_url(value)
        except notifications.WebhookRefused as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_events(self, value: list[str]) -> list[str]:
        refused = notifications.refused_events(self.context["request"].user, value)
        if refused:
            raise serializers.ValidationError(f"Only operators can subscribe to cluster alerts ({', '.join(refused)}).")
        return [event for event in EVENT_NAMES if event in set(value)]


class MyNotificationSettingsView(generics.RetrieveUpdateAPIView):
    """Your notification settings: which of your jobs' events reach you, by email and/or webhook."""

    serializer_class = NotificationSettingsSerializer

    def get_object(self) -> NotificationSettings:
        user = self.request.user
        return NotificationSettings.objects.filter(user=user).first() or NotificationSettings(user=user)


TestResultSerializer = inline_serializer("NotificationTestResult", {
    "results": serializers.ListField(child=inline_serializer("NotificationTestChannel", {
        "ok": serializers.BooleanField(), "message": serializers.CharField()})),
})


class SendTestView(APIView):
    """Send a sample message now on each channel you set up, and say how each went."""

    @extend_schema(request=None, responses=TestResultSerializer)
    def post(self, request):
        if not notifications.may_send_test(request.user):
            every = notifications.TEST_EVERY_S
            raise Throttled(wait=every, detail=f"One test every {every} seconds.")
        results = notifications.send_test(request.user)
        return Response({"results": [{"ok": ok, "message": message} for ok, message in results]})


urlpatterns = [
    path("me/notifications/", MyNotificationSettingsView.as_view(), name="api-my-notifications"),
    path("me/notifications/test/", SendTestView.as_view(), name="api-my-notifications-test"),
]
