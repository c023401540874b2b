/* Overview page: everything comes from /api/v1/cluster/, redrawn every few seconds. */
(function () {
  "use strict";
  var C = window.Colony;
  var root = document.getElementById("overview");
  if (!root) { return; }
  var $ = function (id) { return document.getElementById(id); };
  function num(v) { return (Math.round(v * 100) / 100).toString(); }

  function tiles(data) {
    var g = data.gpus, q = data.queue, live = data.live;
    $("t-busy").textContent = g.busy + " / " + g.total;
    $("t-busy-sub").textContent = (g.total ? Math.round(100 * g.busy / g.total) + "% of GPUs held by jobs" : "no GPUs registered") +
      (g.mig_instances ? " · " + g.mig_instances_busy + " of " + g.mig_instances + " MIG instances" : "");
    $("t-shared").textContent = g.shared;
    $("t-idle").textContent = g.idle;
    $("t-idle-sub").textContent = g.cordoned_idle ? g.cordoned_idle + " of them on cordoned nodes" : "free for new jobs";
    $("t-lost").textContent = g.lost;
    $("t-lost").parentNode.classList.toggle("bad", g.lost > 0);
    $("t-util").textContent = live.util_mean == null ? "–" : Math.round(live.util_mean) + "%";
    $("t-util-sub").textContent = live.mem_total_mib ? "SM · memory " + Math.round(100 * live.mem_used_mib / live.mem_total_mib) +
      "% (" + C.mib(live.mem_used_mib) + " of " + C.mib(live.mem_total_mib) + ")" : "no live samples";
    $("t-queue").innerHTML = '<a href="' + root.dataset.queueUrl + '?state=pending">' + q.pending + " pending</a>";
    $("t-queue-sub").textContent = q.running + " running · median wait " +
      (q.median_wait_s == null ? "–" : C.duration(q.median_wait_s)) +
      (q.oldest_pending_s ? " · oldest " + C.duration(q.oldest_pending_s) : "");
  }

  function bars(tenants) {
    var scale = Math.max.apply(null, tenants.map(function (t) {
      return Math.max(t.max_gpus, t.usage.gpus_used, 1);
    }).concat([1]));
    var pct = function (v) { return (100 * v / scale).toFixed(2) + "%"; };
    $("tenant-bars").innerHTML = tenants.map(function (t) {
      var u = t.usage;
      var label = num(u.gpus_used) + (u.gpus_used === 1 ? " GPU" : " GPUs") + " in use · " + num(u.guaranteed_gpus_used) + " of " + t.guaranteed_gpus +
        " guaranteed" + (u.opportunistic_gpus_used ? " · " + num(u.opportunistic_gpus_used) + " borrowed" : "") +
        " · ceiling " + t.max_gpus;
      var jobs = u.running_jobs + " running, " + u.pending_jobs + " pending";
      return '<div class="tenant' + (t.member ? " mine" : "") + '">' +
        '<div class="tenant-name">' + C.esc(t.slug) + (t.member ? ' <span class="tag">yours</span>' : "") +
        '<span class="tenant-jobs">' + jobs + "</span></div>" +
        '<div class="bar" title="' + C.esc(label) + '">' +
          '<div class="ceiling" style="width:' + pct(t.max_gpus) + '"></div>' +
          '<div class="used guaranteed" style="width:' + pct(u.guaranteed_gpus_used) + '"></div>' +
          '<div class="used borrowed" style="left:' + pct(u.guaranteed_gpus_used) + ";width:" + pct(u.opportunistic_gpus_used) + '"></div>' +
          '<div class="quota" style="left:' + pct(t.guaranteed_gpus) + '"></div>' +
        "</div>" +
        '<div class="tenant-label">' + C.esc(label) + "</div></div>";
    }).join("") || '<p class="empty">No tenants yet: operators create them in the admin.</p>';
  }

  function alerts(list) {
    $("alerts").innerHTML = list.map(function (a) {
      var job = a.job_id ? ' · <a href="' + root.dataset.jobUrl.replace(/0\/$/, a.job_id + "/") + '">job #' + a.job_id + "</a>" : "";
      return '<li class="alert alert-' + a.kind + '"><span class="kind">' + C.esc(a.kind_label) + "</span> " +
        C.esc(a.message) + '<div class="meta"><a href="' + root.dataset.nodeUrl.replace("NODE", encodeURIComponent(a.node)) +
        '">' + C.esc(a.node) + "</a>" + job + " · since " + C.stamp(a.opened_at) + "</div></li>";
    }).join("");
    $("alerts-empty").hidden = list.length > 0;
  }

  C.poll(function () {
    return C.getJSON(root.dataset.api).then(function (data) {
      tiles(data); bars(data.tenants); alerts(data.alerts);
      C.updated($("overview-updated"));
    });
  }, 5000, function (err) { C.stale($("overview-updated"), err); });
})();
