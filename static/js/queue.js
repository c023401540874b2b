/* Queue page: re-reads /api/v1/queue/ with the page's own filters every few seconds and redraws
   the rows (same columns as templates/jobs/queue.html). */
(function () {
  "use strict";
  var C = window.Colony;
  var table = document.getElementById("queue");
  var empty = document.getElementById("queue-empty");
  var status = document.getElementById("queue-updated");
  var form = document.getElementById("queue-filters");
  if (!table) { return; }

  form.querySelectorAll("select").forEach(function (select) {
    select.addEventListener("change", function () { form.submit(); });
  });

  function jobUrl(id) { return table.dataset.jobUrl.replace(/0\/$/, id + "/"); }
  function nodeUrl(name) { return table.dataset.nodeUrl.replace("NODE", encodeURIComponent(name)); }
  var dash = '<span class="muted">—</span>';

  function row(job) {
    var state = '<span class="state state-' + job.state.toLowerCase() + '">' + C.STATE_LABELS[job.state] + "</span>";
    if (job.pending_reason) {
      var why = C.esc(job.pending_reason.message);
      state += '<div class="reason" title="' + why + '">' + why + "</div>";
    }
    var cls = job.run_class ? '<span class="cls cls-' + job.run_class + '">' +
        (job.run_class === "guaranteed" ? "Guaranteed" : "Opportunistic") + "</span>"
      : job.opportunistic_only ? '<span class="cls cls-opportunistic">Spare only</span>' : dash;
    var queue = dash;
    if (job.queue_position) {
      queue = "<strong>" + job.queue_position + "</strong> of " + job.queue_length + " in " + C.esc(job.tenant);
      if (job.eta_s != null) { queue += '<div class="reason">starts in ~' + C.duration(job.eta_s) + "</div>"; }
    }
    var nodes = job.nodes.length ? job.nodes.map(function (n) {
      return '<a href="' + nodeUrl(n) + '">' + C.esc(n) + "</a>";
    }).join(" ") : dash;
    var time = dash;
    if (job.finished_at && job.started_at) { time = "ran " + C.duration(C.since(job.started_at, job.finished_at)); }
    else if (job.started_at) { time = "running " + C.duration(C.since(job.started_at)); }
    else if (job.state === "PENDING") { time = "waiting " + C.duration(C.since(job.submitted_at)); }
    var link = jobUrl(job.id);
    return '<tr data-job-id="' + job.id + '">' +
      '<td class="num"><a href="' + link + '">' + job.id + "</a></td>" +
      '<td class="name"><a href="' + link + '">' + C.esc(job.name) +
      (job.array_id ? '<span class="muted">[' + C.esc(String(job.array_index)) + "]</span>" : "") + "</a></td>" +
      "<td>" + C.esc(job.tenant) + "</td><td>" + C.esc(job.owner) + "</td>" +
      "<td>" + state + "</td><td>" + cls + "</td><td>" + C.gpuRequest(job) + "</td>" +
      "<td>" + queue + "</td><td>" + nodes + "</td>" +
      '<td title="' + job.submitted_at + '">' + C.stamp(job.submitted_at) + "</td>" +
      "<td>" + time + '</td><td class="num">' + (job.exit_code == null ? "" : job.exit_code) + "</td></tr>";
  }

  function refresh() {
    return C.getJSON(table.dataset.api + window.location.search).then(function (page) {
      table.tBodies[0].innerHTML = page.results.map(row).join("");
      table.hidden = page.results.length === 0;
      empty.hidden = page.results.length !== 0;
      C.updated(status);
    });
  }

  C.poll(refresh, 4000, function (err) { C.stale(status, err); });
})();
