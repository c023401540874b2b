"""``/jobs/<id>/notebook/``, the job page's "Open notebook": hands the browser a short-lived
ticket (:func:`jobs.services.notebooks.ticket_for`: its owner only, while it runs) and sends it
on to the notebook proxy, which trades the ticket for a cookie of its own. A job the user may
not see is a 404, as on every job page; one they may see but not open says why."""

from __future__ import annotations

from urllib.parse import quote

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect

from agents import tunnel_protocol
from cluster_ui.api.pages import page
from jobs.models import Job
from jobs.services import notebooks


@page(rows=Job.objects.select_related("owner"))
def open_notebook(request, pk: int, rows):
    job = get_object_or_404(rows, pk=pk)
    try:
        ticket = notebooks.ticket_for(request.user, job)
    except notebooks.NotebookUnavailable as exc:
        messages.error(request, f"No notebook to open: {exc}")
        return redirect("jobs:detail", pk=job.pk)
    url = (f"{notebooks.proxy_url(request)}{tunnel_protocol.notebook_base_url(job.pk)}"
           f"?{notebooks.TICKET_PARAM}={quote(ticket)}")
    response = HttpResponseRedirect(url)
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    return response
