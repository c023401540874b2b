"""Telling researchers about their jobs (and operators about cluster alerts): email and
Slack-compatible webhooks, per user opt-in.

Three halves, in this order below:

- *Deciding* (:func:`job_event`, :func:`notify_long_waits`): called from the job lifecycle inside the
  transaction that changes a job's state, or from beat. They only write :class:`Notification` rows
  (one per job, attempt, event and channel, however often the trigger fires) and enqueue the send
  after commit. They never raise into the caller and never touch the network: a notification must
  not slow down or break a scheduling cycle.
- *Checking webhook addresses* (:func:`check_webhook_url`): a user-supplied URL must not reach
  Colony's own services (loopback, private, link-local: Redis, the database, a cloud metadata
  endpoint). Checked when saved and again when sent, and the POST goes to the address that was
  checked, so a name re-pointed in between reaches nothing new.
- *Delivering* (:func:`deliver`, :func:`send_test`): one message per call, from a Celery task that
  retries with backoff (``jobs.tasks.send_notification``). :func:`send_on_channel` is the part
  that operators' alert messages (:mod:`jobs.services.alerts`) share.

Alert kinds are opted in to in the same ``events`` list (``alert:<kind>``), by operators only:
an alert names nodes and other tenants' jobs (:func:`refused_events`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import certifi
import urllib3
from django.conf import settings
from django.core.cache import cache
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from jobs.choices import JobEventKind, JobState
from jobs.models import Job, JobDependency, JobEvent, Notification, NotificationSettings
from jobs.services.bulk_rows import ids_in
from jobs.services.enqueue import enqueue
from monitoring.choices import AlertKind
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

SUCCEEDED, FAILED, PREEMPTED, TIMEOUT, CANCELLED, LONG_WAIT = (
    "succeeded", "failed", "preempted", "timeout", "cancelled", "long_wait")
# What a user opts in to, for each event the lifecycle reports: a time-out is a failure to them.
# Cancelled is missing on purpose: the user asked for it, there is nothing to tell.
OPT_IN = {SUCCEEDED: SUCCEEDED, FAILED: FAILED, TIMEOUT: FAILED, PREEMPTED: PREEMPTED, LONG_WAIT: LONG_WAIT}
# The steps of a tenant's idle-GPU policy (jobs/services/idle_reclaim.py), one opt-in for all; each
# step is its own message (see _record's dedupe key).
IDLE = "idle"
IDLE_WARNED, IDLE_DEMOTED, IDLE_SUSPENDED, IDLE_REQUEUED = (
    "idle_warned", "idle_demoted", "idle_suspended", "idle_requeued")
IDLE_EVENTS = (IDLE_WARNED, IDLE_DEMOTED, IDLE_SUSPENDED, IDLE_REQUEUED)
OPT_IN |= dict.fromkeys(IDLE_EVENTS, IDLE)
# The jobs an ending cancels down its after_ok chain are failures to their owner, but one message
# tells of them all, naming the job that ended and counting them (a chain of 1,115 sent 1,115).
CHAIN_CANCELLED = "chain_cancelled"
# How the lifecycle words a dependant's error when it cuts the chain (_cancel_after_ok_chain):
# the job it names is the one above it, whose own error leads on up to the chain's root.
CHAIN_ERROR_RE = re.compile(r"^Cancelled: job (\d+), which it ran after \(after_ok\)")
EVENT_CHOICES = [
    (SUCCEEDED, "Job succeeded"),
    (FAILED, "Job failed or timed out"),
    (PREEMPTED, "Job preempted (stopped and put back in the queue)"),
    (LONG_WAIT, "Job waiting longer than my limit"),
    (IDLE, "Job's GPUs idle (warned, made opportunistic, suspended or requeued by the tenant's policy)"),
]


def event_words(event: str) -> str:
    """What the notifications page calls an event: the words of the user's own settings, not the
    stored key (``chain_cancelled``, ``alert:node_lost``)."""
    if event.startswith(ALERT_PREFIX):
        return dict(ALERT_EVENT_CHOICES).get(event, event[len(ALERT_PREFIX):].replace("_", " "))
    return EVENT_WORDS.get(event, event.replace("_", " "))


# Operators only. Dead letters are no Alert row (those need a node); jobs.services.alerts watches them.
ALERT_PREFIX = "alert:"
DEAD_LETTERS = f"{ALERT_PREFIX}dead_letters"
ALERT_EVENT_CHOICES = [(f"{ALERT_PREFIX}{kind}", label) for kind, label in AlertKind.choices] + [
    (DEAD_LETTERS, "Messages dead-lettered (agents or readers sent what could not be applied)")]
ALERT_EVENTS = [event for event, _ in ALERT_EVENT_CHOICES]
EVENT_WORDS = {
    SUCCEEDED: "succeeded", FAILED: "failed", TIMEOUT: "timed out", PREEMPTED: "preempted",
    LONG_WAIT: "long wait", IDLE_WARNED: "idle GPUs: warned", IDLE_DEMOTED: "idle GPUs: made opportunistic",
    IDLE_SUSPENDED: "idle GPUs: suspended", IDLE_REQUEUED: "idle GPUs: put back in the queue",
    CHAIN_CANCELLED: "ended; the jobs after it cancelled",
}
EMAIL, WEBHOOK = "email", "webhook"
MAX_LONG_WAIT_MINUTES = 7 * 24 * 60

MAX_TRIES = 5
WEBHOOK_TIMEOUT_S = 5.0
# A resolver that does not answer in this long is treated as "host not found": a user saving the
# form waits no longer, and a send is retried later.
DNS_TIMEOUT_S = 2.0
# Per beat tick and per distinct long-wait limit: a backlog is worked off over a few ticks.
LONG_WAIT_BATCH = 200
# A notification still untried this long after it was made lost its task (broker down at commit).
STUCK_AFTER = timedelta(minutes=5)
REDELIVER_BATCH = 100
# Output goes into a message only when this short: a chat channel is no place for a log.
OUTPUT_LINES, OUTPUT_MAX_CHARS = 10, 1500

ERRORS_KEY = "colony:notifications:errors"


class TryAgain(Exception):
    """A failure that may pass (timeout, 5xx, SMTP trouble): the task retries it with backoff."""


class Refused(Exception):
    """A failure that will not pass by retrying (unsafe address, 4xx, no email address)."""


class WebhookRefused(Refused, ValueError):
    """A webhook URL Colony will not call; the message says why, in words for the user."""


class HostNotFound(WebhookRefused):
    """The webhook's host does not resolve: refused when saved, retried when sending."""


def is_operator(user) -> bool:
    """Who may hear about cluster alerts: the one place that says so (with :func:`operators`)."""
    return bool(user.is_active and user.is_staff)


def operators(prefix: str = "") -> Q:
    """:func:`is_operator` as a filter, on the user at ``prefix`` (``"user__"`` from settings)."""
    return Q(**{f"{prefix}is_active": True, f"{prefix}is_staff": True})


# ---------------------------------------------------------------- the rules of a user's settings
# One place for them: the API (jobs/api/notifications.py) and the page (jobs/notification_views.py)
# both judge with these, so they refuse the same things in the same words.

# One test send per user this often: the button makes the server call out (mail, webhook).
TEST_EVERY_S = 10


def email_problem(user, wanted: bool) -> str | None:
    """Why ``user`` cannot have email, when they ask for it; None when they can."""
    if wanted and not user.email:
        return "Your account has no email address; ask an operator to add one."
    return None


def checked_webhook_url(url: str) -> str:
    """The URL as stored (stripped), after :func:`check_webhook_url`; raises :class:`WebhookRefused`."""
    url = url.strip()
    if url:
        check_webhook_url(url)
    return url


def may_send_test(user) -> bool:
    """Whether ``user`` may send a test now (and, if so, counts it): one per ``TEST_EVERY_S``."""
    return cache.add(f"colony:notification-test:{user.pk}", 1, TEST_EVERY_S)


def refused_events(user, events) -> list[str]:
    """The alert events in ``events`` that ``user`` may not subscribe to (all of them unless an operator)."""
    return [] if is_operator(user) else [event for event in events if event.startswith(ALERT_PREFIX)]


# ---------------------------------------------------------------- deciding


def job_event(job_id: int, event: str) -> None:
    """The job's owner is told about ``event`` on the channels they opted in to.

    Called by :mod:`jobs.services.lifecycle` in the transaction that changes the state. Costs one
    query (in a savepoint) for a user without settings; never raises, never sends anything itself.
    """
    _notify(job_id, event)


def _notify(job_id: int, event: str) -> int:
    try:
        with transaction.atomic():  # a savepoint: a failure here must not poison the caller's transaction
            created = _record(job_id, event)
        if created:
            transaction.on_commit(lambda: _enqueue(created))  # at once when there is no transaction
        return len(created)
    except Exception:
        log.exception("notifications for job %s (%s) were not recorded", job_id, event)
        count_error()
        return 0


def _record(job_id: int, event: str) -> list[int]:
    opt_in = OPT_IN.get(event)
    if opt_in is None:
        if event != CANCELLED:
            log.warning("unknown job event %r for job %s: nobody told", event, job_id)
        return []
    prefix = "owner__notification_settings__"
    row = (Job.objects.filter(pk=job_id, owner__notification_settings__isnull=False)
           .values("attempt", "owner_id", "state", "error", f"{prefix}email", f"{prefix}webhook_url",
                   f"{prefix}events").first())
    if row is None or opt_in not in (row[f"{prefix}events"] or []):
        return []
    channels = [channel for channel, on in ((EMAIL, row[f"{prefix}email"]), (WEBHOOK, row[f"{prefix}webhook_url"]))
                if on]
    if event == FAILED and row["state"] == JobState.CANCELLED:
        root = _chain_root(row["error"])
        if root is not None:
            return _record_chain(root, row["owner_id"], channels)
    created = []
    for channel in channels:
        # Keyed on the opt-in, not the event: a failed-then-timed-out attempt is one message.
        notification, made = Notification.objects.get_or_create(
            dedupe_key=f"{job_id}:{row['attempt']}:{event if opt_in == IDLE else opt_in}:{channel}",
            defaults={"user_id": row["owner_id"], "job_id": job_id, "event": event, "channel": channel},
        )
        if made:
            created.append(notification.pk)
    return created


def _chain_root(error: str) -> tuple[int, int] | None:
    """(id, attempt) of the job whose ending cut the after_ok chain that a dependant with this
    error was cancelled in; None when the error is not a chain's. One query per level above it."""
    match = CHAIN_ERROR_RE.match(error or "")
    above = None
    while match:
        above = Job.objects.filter(pk=int(match[1])).values_list("pk", "attempt", "error").first()
        if above is None:
            return None
        match = CHAIN_ERROR_RE.match(above[2] or "")
    return None if above is None else (above[0], above[1])


def _record_chain(root: tuple[int, int], owner_id: int, channels: list[str]) -> list[int]:
    """One message per channel to ``owner_id`` about the chain below ``root``, made when its first
    dependant is told of; the rest of the chain finds it made. It counts the chain when it is
    sent, after the transaction that cut the chain has committed."""
    root_id, attempt = root
    created = []
    for channel in channels:
        notification, made = Notification.objects.get_or_create(
            dedupe_key=f"{root_id}:{attempt}:{CHAIN_CANCELLED}:{owner_id}:{channel}",
            defaults={"user_id": owner_id, "job_id": root_id, "event": CHAIN_CANCELLED, "channel": channel})
        if made:
            created.append(notification.pk)
    return created


def chain_dependants(root_id: int, owner_id: int | None = None) -> list[int]:
    """The jobs (of ``owner_id``, if given) that the ending of ``root_id`` cancelled down its
    after_ok chain, in id order: one query per level."""
    seen: set[int] = set()
    frontier = [root_id]
    while frontier:
        frontier = [pk for pk in Job.objects.filter(
            state=JobState.CANCELLED, error__contains=", which it ran after (after_ok)",
            dependencies__kind=JobDependency.Kind.OK, dependencies__on_id__in=ids_in(frontier),
        ).order_by().values_list("pk", flat=True).distinct() if pk not in seen]
        seen.update(frontier)
    if owner_id is not None and seen:
        seen = set(Job.objects.filter(pk__in=ids_in(sorted(seen)), owner_id=owner_id).values_list("pk", flat=True))
    return sorted(seen)


def _enqueue(notification_ids) -> None:
    for notification_id in notification_ids:
        try:
            # No publish retries: with the broker down this would stall the committing caller.
            # The row stays pending and redeliver_stuck() sends it later.
            enqueue("send_notification", notification_id, retry=False)
        except Exception as exc:
            log.warning("could not enqueue notification %s: %s", notification_id, exc)
            count_error()


def count_error() -> None:
    try:
        get_redis().incr(ERRORS_KEY)
    except Exception:
        pass  # a counter, not a reason to fail anything


def notify_long_waits(now: datetime | None = None) -> int:
    """Pending jobs that have waited longer than their owner's limit (since they were submitted,
    or last put back in the queue) get one ``long_wait`` notification per wait. Returns how many
    notifications were made."""
    now = now or timezone.now()
    users_by_limit: dict[int, list[int]] = defaultdict(list)
    for user_id, minutes, events in (NotificationSettings.objects.filter(Q(email=True) | ~Q(webhook_url=""))
                                     .values_list("user_id", "long_wait_minutes", "events")):
        if LONG_WAIT in (events or []):
            users_by_limit[minutes].append(user_id)
    made = 0
    for minutes, user_ids in users_by_limit.items():
        cutoff = now - timedelta(minutes=minutes)
        for job_id in _waiting_since_before(cutoff, user_ids):
            made += _notify(job_id, LONG_WAIT)
    return made


def _waiting_since_before(cutoff: datetime, user_ids: list[int]) -> list[int]:
    requeued_at = Subquery(JobEvent.objects.filter(job=OuterRef("pk"), kind=JobEventKind.REQUEUED)
                           .order_by("-at").values("at")[:1])
    told = Notification.objects.filter(job=OuterRef("pk"), event=LONG_WAIT, created_at__gte=OuterRef("waiting_since"))
    # submitted_at first: it never comes after the wait began, and (state, submitted_at) is indexed.
    return list(Job.objects.filter(state=JobState.PENDING, owner_id__in=user_ids, submitted_at__lt=cutoff)
                .annotate(waiting_since=Coalesce(requeued_at, F("submitted_at")))
                .filter(waiting_since__lt=cutoff).exclude(Exists(told))
                .order_by("submitted_at").values_list("pk", flat=True)[:LONG_WAIT_BATCH])


def redeliver_stuck(now: datetime | None = None) -> int:
    """Enqueue again the notifications whose task never ran (the broker was down after commit)."""
    cutoff = (now or timezone.now()) - STUCK_AFTER
    stuck = list(Notification.objects.filter(state=Notification.State.PENDING, attempts=0, created_at__lt=cutoff)
                 .order_by("created_at").values_list("pk", flat=True)[:REDELIVER_BATCH])
    _enqueue(stuck)
    return len(stuck)


# ---------------------------------------------------------------- checking webhook addresses


@dataclass(frozen=True)
class WebhookTarget:
    """A checked webhook: where to connect (``address``) and what to ask for there."""

    scheme: str
    host: str
    port: int
    path: str
    address: str

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"


def check_webhook_url(url: str) -> WebhookTarget:
    """The address to POST to, or :class:`WebhookRefused` saying why Colony will not call it."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise WebhookRefused("That is not a valid URL.") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookRefused("Use an http:// or https:// URL.")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookRefused("The URL has no host name.")
    if parts.username or parts.password:
        raise WebhookRefused("Put no user name or password in the URL; use the webhook's own token.")
    port = port or (443 if parts.scheme == "https" else 80)
    addresses = _resolve(host, port)
    if host.lower() not in {h.lower() for h in settings.COLONY_WEBHOOK_ALLOWED_HOSTS}:
        for address in addresses:
            if not _public(address):
                raise WebhookRefused(f"{host} is an internal address ({address}); webhooks may only call "
                                     "public hosts unless an operator allows this one.")
    path = parts.path or "/"
    return WebhookTarget(parts.scheme, host, port, f"{path}?{parts.query}" if parts.query else path, addresses[0])


def _resolve(host: str, port: int) -> list[str]:
    found: list[str] = []

    def lookup():
        try:
            found.extend(info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError):
            pass

    # getaddrinfo has no timeout of its own; a thread per lookup (not a pool) stays fork-safe.
    resolver = threading.Thread(target=lookup, name="webhook-dns", daemon=True)
    resolver.start()
    resolver.join(DNS_TIMEOUT_S)
    if resolver.is_alive() or not found:
        raise HostNotFound(f"Cannot find the host {host}.")
    return list(found)


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped:  # ::ffff:127.0.0.1 is loopback too
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


# ---------------------------------------------------------------- delivering


@dataclass(frozen=True)
class Message:
    title: str  # "job 41 train.py failed (exit 1)"
    url: str
    details: list[str]
    output: str

    @property
    def subject(self) -> str:
        return f"Colony: {self.title}"


def deliver(notification_id: int, try_number: int, last_try: bool) -> str:
    """Send one notification; returns ``sent``, ``failed`` or ``skipped``.

    ``try_number`` (0-based) claims the try: only the caller whose number matches the attempts
    so far sends, so a task enqueued twice sends once. Raises :class:`TryAgain` for a failure
    that may pass, unless ``last_try``: then the notification is marked as given up.
    """
    if not Notification.objects.filter(pk=notification_id, state=Notification.State.PENDING,
                                       attempts=try_number).update(attempts=try_number + 1):
        return "skipped"
    notification = Notification.objects.select_related("job__tenant", "user").get(pk=notification_id)
    try:
        _send(notification)
    except Refused as exc:
        return _give_up(notification, str(exc))
    except Exception as exc:
        if not isinstance(exc, TryAgain):  # a bug or a database hiccup: retried, then given up, never stuck
            log.exception("notification %s could not be sent", notification_id)
            exc = TryAgain(f"Internal error: {exc}")
        if last_try:
            return _give_up(notification, str(exc))
        Notification.objects.filter(pk=notification_id).update(last_error=str(exc)[:500])
        raise exc
    Notification.objects.filter(pk=notification_id).update(state=Notification.State.SENT, sent_at=timezone.now(),
                                                            last_error="")
    return "sent"


def _give_up(notification: Notification, why: str) -> str:
    log.warning("notification %s (%s by %s to user %s) gave up: %s", notification.pk, notification.event,
                notification.channel, notification.user_id, why)
    Notification.objects.filter(pk=notification.pk).update(state=Notification.State.FAILED, last_error=why[:500])
    count_error()
    return "failed"


def _send(notification: Notification) -> None:
    job = notification.job
    if notification.event == LONG_WAIT and job.state != JobState.PENDING:
        raise Refused("The job started before the message went out; not sent.")
    prefs = NotificationSettings.objects.filter(user_id=notification.user_id).first()
    send_on_channel(notification.user, prefs, notification.channel,
                    render(job, notification.event, since=notification.created_at, user_id=notification.user_id))


def send_on_channel(user, prefs: NotificationSettings | None, channel: str, message: Message) -> None:
    """``message`` to ``user`` on ``channel`` as their settings (``prefs``) are now, not as they were
    when it was decided; raises :class:`Refused` or :class:`TryAgain`."""
    if channel == EMAIL:
        if prefs is None or not prefs.email:
            raise Refused("Email was turned off before the message went out.")
        send_email(user, message)
    else:
        if prefs is None or not prefs.webhook_url:
            raise Refused("The webhook was removed before the message went out.")
        send_webhook(prefs.webhook_url, message)


def send_email(user, message: Message) -> None:
    if not user.email:
        raise Refused("Your account has no email address.")
    body = "\n".join([f"{message.title[:1].upper()}{message.title[1:]}.", "", message.url, "", *message.details]
                     + (["", "Last lines of output:", message.output] if message.output else [])
                     + ["", f"You get this because you asked for it: {public_url('jobs:notifications')}"])
    try:
        send_mail(message.subject, body, None, [user.email], fail_silently=False)
    except Exception as exc:  # smtplib's errors are OSErrors, but any backend may raise its own
        raise TryAgain(f"The mail server refused or failed: {exc}") from exc


def send_webhook(url: str, message: Message) -> None:
    try:
        target = check_webhook_url(url)
    except HostNotFound as exc:
        raise TryAgain(str(exc)) from exc  # DNS trouble passes; an internal address does not
    status, reply, location = _post(target, json.dumps(slack_payload(message)).encode())
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise Refused(f"The webhook answered {status}, a redirect to {location or '?'}; redirects are not followed.")
    if status in (408, 425, 429) or status >= 500:
        raise TryAgain(f"The webhook answered {status}: {reply}")
    raise Refused(f"The webhook answered {status}: {reply}")


def _post(target: WebhookTarget, body: bytes) -> tuple[int, str, str]:
    """POST to the checked address itself. requests (or urllib) would resolve the name again when
    connecting, and a name re-pointed at 127.0.0.1 in between would get through (DNS rebinding)."""
    options = {"timeout": urllib3.Timeout(total=WEBHOOK_TIMEOUT_S), "retries": False, "maxsize": 1}
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(target.address, target.port, server_hostname=target.host,
                                           assert_hostname=target.host, cert_reqs="CERT_REQUIRED",
                                           ca_certs=certifi.where(), **options)
    else:
        pool = urllib3.HTTPConnectionPool(target.address, target.port, **options)
    headers = {"Host": target.host_header, "Content-Type": "application/json", "User-Agent": "Colony-notifications"}
    try:
        response = pool.urlopen("POST", target.path, body=body, headers=headers, redirect=False,
                                preload_content=False)
        reply = response.read(300).decode("utf-8", "replace").strip()
        return response.status, reply, response.headers.get("Location", "")
    except urllib3.exceptions.HTTPError as exc:
        raise TryAgain(f"Could not reach the webhook: {_reason(exc)}") from exc
    finally:
        pool.close()


def _reason(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or exc)


def slack_payload(message: Message) -> dict:
    """Slack's incoming-webhook JSON: ``text`` for notifications and clients without blocks."""
    title = f"*<{message.url}|{_mrkdwn(message.title[:1].upper() + message.title[1:])}>*"
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": title}}]
    if message.details:
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": _mrkdwn("\n".join(message.details))[:2900]}})
    if message.output:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{_mrkdwn(message.output)}```"}})
    return {"text": f"{message.subject} {message.url}", "blocks": blocks}


def _mrkdwn(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(job: Job, event: str, since: datetime | None = None, user_id: int | None = None) -> Message:
    name = " ".join(job.name.split())[:80]  # no newline may reach a mail header
    if event == CHAIN_CANCELLED:
        return _render_chain(job, name, user_id)
    details = [f"State: {job.get_state_display()}", f"Tenant: {job.tenant.slug}, {job.gpus} GPU{'s' * (job.gpus > 1)}"]
    if job.exit_code is not None:
        details.append(f"Exit code: {job.exit_code}")
    if job.error:
        details.append(f"Error: {job.error[:300]}")
    if event in (LONG_WAIT, PREEMPTED, IDLE_REQUEUED) and job.pending_reason:
        details.append(f"Waiting because: {job.pending_reason.get('message', '')}")
    output = _short_output(job.output_tail) if event != LONG_WAIT else ""
    return Message(title=f"job {job.pk} {name} {_headline(job, event, since)}",
                   url=public_url("jobs:detail", job.pk), details=details, output=output)


# Dependants named in a chain's message; the rest are counted.
CHAIN_NAMED = 10


def _render_chain(root: Job, name: str, user_id: int | None) -> Message:
    """``job 12 train cancelled, and 1,115 jobs that depended on it``: the job whose ending cut the
    chain, and the dependants of ``user_id`` it cancelled."""
    dependants = chain_dependants(root.pk, user_id)
    many = len(dependants) != 1
    count = f"{len(dependants):,} job{'s' * many} that depended on it"
    if root.state == JobState.CANCELLED:
        title = f"job {root.pk} {name} cancelled, and {count}"
    else:
        ended = {JobState.FAILED: "failed", JobState.TIMEOUT: "timed out"}.get(root.state, root.state.lower())
        title = f"job {root.pk} {name} {ended}; {count} {'were' if many else 'was'} cancelled"
    named = ", ".join(str(pk) for pk in dependants[:CHAIN_NAMED])
    more = f" and {len(dependants) - CHAIN_NAMED:,} more" if len(dependants) > CHAIN_NAMED else ""
    details = [f"State: {root.get_state_display()}", f"Tenant: {root.tenant.slug}",
               f"Cancelled with it (they ran after it, after_ok): job{'s' * many} {named}{more}"]
    return Message(title=title, url=public_url("jobs:detail", root.pk), details=details, output="")


def _headline(job: Job, event: str, since: datetime | None) -> str:
    if event == SUCCEEDED:
        return "succeeded"
    if event == FAILED:
        return f"failed (exit {job.exit_code})" if job.exit_code is not None else "failed"
    if event == TIMEOUT:
        return f"timed out (limit {job.max_runtime_s} s)" if job.max_runtime_s else "timed out"
    if event == PREEMPTED:
        return "was preempted and is back in the queue"
    if event in IDLE_EVENTS:
        return {IDLE_WARNED: "has left its GPUs idle", IDLE_DEMOTED: "left its GPUs idle and is now opportunistic",
                IDLE_SUSPENDED: "left its GPUs idle and was suspended",
                IDLE_REQUEUED: "left its GPUs idle and was put back in the queue"}[event]
    waited = (since or timezone.now()) - _waiting_since(job)
    return f"has waited {max(1, int(waited.total_seconds() // 60))} min in the queue"


def _waiting_since(job: Job) -> datetime:
    requeued = (JobEvent.objects.filter(job=job, kind=JobEventKind.REQUEUED).order_by("-at")
                .values_list("at", flat=True).first())
    return requeued or job.submitted_at


def _short_output(tail: str) -> str:
    lines = "\n".join(tail.rstrip().splitlines()[-OUTPUT_LINES:])
    return lines if len(lines) <= OUTPUT_MAX_CHARS else ""


def public_url(name: str, *args) -> str:
    return f"{settings.COLONY_PUBLIC_URL.rstrip('/')}{reverse(name, args=args)}"


def send_test(user) -> list[tuple[bool, str]]:
    """Send a sample message on each channel the user set up, now; one (ok, what happened) each.

    Runs in the web request (the user waits for the answer): bounded by the webhook timeout.
    """
    prefs = NotificationSettings.objects.filter(user=user).first()
    if prefs is None or not (prefs.email or prefs.webhook_url):
        return [(False, "Nothing to test: turn on email or set a webhook URL first.")]
    message = Message(title="test message", url=public_url("jobs:notifications"),
                      details=["This is how Colony will tell you about your jobs."], output="")
    results = []
    for channel, on, send in ((EMAIL, prefs.email, lambda: send_email(user, message)),
                              (WEBHOOK, prefs.webhook_url, lambda: send_webhook(prefs.webhook_url, message))):
        if not on:
            continue
        try:
            send()
        except (Refused, TryAgain) as exc:
            results.append((False, f"{channel.capitalize()}: {exc}"))
        else:
            where = user.email if channel == EMAIL else "the webhook"
            results.append((True, f"{channel.capitalize()}: test message sent to {where}."))
    return results
