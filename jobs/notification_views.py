"""The "Notifications" page: a user's own opt-in (email, webhook, which events; for operators,
which cluster alerts), a test button, and the last messages about jobs sent (or not) with why.

Only ever the signed-in user's settings and messages: nothing here takes a user or settings id.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import redirect, render

from cluster_ui.api.pages import page
from jobs.models import Notification, NotificationSettings
from jobs.services import notifications

RECENT = 10


class NotificationSettingsForm(forms.ModelForm):
    events = forms.MultipleChoiceField(choices=notifications.EVENT_CHOICES, required=False,
                                       widget=forms.CheckboxSelectMultiple, label="Tell me when")
    # A text field: the stylesheet styles text inputs, and check_webhook_url judges the URL.
    webhook_url = forms.CharField(
        required=False, max_length=500, label="Webhook URL",
        help_text="A Slack (or compatible) incoming webhook; Colony POSTs JSON to it.",
        widget=forms.TextInput(attrs={"class": "mono", "inputmode": "url",
                                      "placeholder": "https://hooks.slack.com/services/…"}))
    long_wait_minutes = forms.IntegerField(min_value=1, max_value=notifications.MAX_LONG_WAIT_MINUTES,
                                           label="Long wait means more than (minutes)")

    class Meta:
        model = NotificationSettings
        fields = ["email", "webhook_url", "events", "long_wait_minutes"]
        labels = {"email": "Email me"}

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        stored = self.initial.get("events") or []
        self.initial["events"] = [event for event in stored if not event.startswith(notifications.ALERT_PREFIX)]
        # Only operators get the field: alerts name nodes and every tenant's jobs. Anyone else
        # posting an alert kind as an event gets the events field's "not one of the choices".
        if notifications.is_operator(user):
            self.fields["alerts"] = forms.MultipleChoiceField(
                choices=notifications.ALERT_EVENT_CHOICES, required=False, widget=forms.CheckboxSelectMultiple,
                label="Tell me about cluster alerts", initial=[e for e in stored if e in notifications.ALERT_EVENTS],
                help_text="One message when an alert opens and one when it is resolved.")

    def clean_email(self):
        problem = notifications.email_problem(self.user, self.cleaned_data["email"])
        if problem:
            raise forms.ValidationError(problem)
        return self.cleaned_data["email"]

    def clean_webhook_url(self):
        try:
            return notifications.checked_webhook_url(self.cleaned_data["webhook_url"])
        except notifications.WebhookRefused as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_events(self):
        chosen = set(self.cleaned_data["events"])
        return [event for event, _ in notifications.EVENT_CHOICES if event in chosen]

    def clean(self):
        cleaned = super().clean()
        if "events" in cleaned:
            alerts = set(cleaned.get("alerts") or [])
            cleaned["events"] = cleaned["events"] + [e for e in notifications.ALERT_EVENTS if e in alerts]
        return cleaned


@page(own_things_only=True)
def notification_settings(request):
    prefs = NotificationSettings.objects.filter(user=request.user).first() or NotificationSettings(user=request.user)
    form = NotificationSettingsForm(request.POST or None, instance=prefs, user=request.user)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Notification settings saved.")
        if request.POST.get("action") == "test":
            _send_test(request)
        return redirect("jobs:notifications")
    recent = list(Notification.objects.filter(user=request.user).select_related("job")[:RECENT])
    for note in recent:
        note.words = notifications.event_words(note.event)
    return render(request, "jobs/notifications.html", {"form": form, "recent": recent})


def _send_test(request) -> None:
    if not notifications.may_send_test(request.user):
        messages.error(request, f"One test every {notifications.TEST_EVERY_S} seconds; try again in a moment.")
        return
    for ok, text in notifications.send_test(request.user):
        (messages.success if ok else messages.error)(request, text)
