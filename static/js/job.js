/* Job page: follows the job through /api/v1/jobs/{id}/ (state, reason, timeline, GPUs, output) and
   draws its GPU memory and utilisation from /api/v1/jobs/{id}/metrics/ with plotly. */
(function () {
  "use strict";
  var C = window.Colony;
  var root = document.getElementById("job");
  if (!root) { return; }
  var $ = function (id) { return document.getElementById(id); };
  var TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"];
  var finished = false;

  function nodeUrl(name) { return root.dataset.nodeUrl.replace("NODE", encodeURIComponent(name)); }
  function clock(iso) { return iso ? new Date(iso).toISOString().substr(11, 8) : ""; }

  // One step per event, a header opening each attempt (placed, started, stopped and why, back in the
  // queue, finished), each with the time since the step before. Older jobs have no events: their
  // timestamps stand in.
  function timelineSteps(job) {
    if (job.events && job.events.length) {
      var steps = [], attempt = 0;
      job.events.forEach(function (e) {
        if (e.attempt !== attempt) { attempt = e.attempt; steps.push({attempt: attempt}); }
        steps.push({label: EVENT_LABELS[e.kind] || e.kind, at: e.at, message: e.message, kind: e.kind});
      });
      return steps;
    }
    return [["submitted_at", "Submitted"], ["placed_at", "Placed on GPUs"], ["started_at", "Started"],
            ["finished_at", "Finished"]].filter(function (s) { return job[s[0]]; })
      .map(function (s) { return {label: s[1], at: job[s[0]]}; });
  }

  var EVENT_LABELS = {submitted: "Submitted", placed: "Placed", started: "Started", stopping: "Stopping",
                      requeued: "Back in the queue", finished: "Finished"};

  function renderTimeline(job) {
    var html = "", previous = null;
    timelineSteps(job).forEach(function (step) {
      if (step.attempt) { html += '<li class="attempt">Attempt ' + step.attempt + "</li>"; return; }
      html += '<li class="step-' + C.esc(step.kind || "") + '"><span class="what">' + C.esc(step.label) +
        '</span><span class="when">' + C.stamp(step.at) + "</span>" +
        (previous ? '<span class="gap">+' + C.duration(C.since(previous, step.at)) + "</span>" : "") +
        (step.message ? '<div class="why">' + C.esc(step.message) + "</div>" : "") + "</li>";
      previous = step.at;
    });
    if (!job.finished_at && previous) {
      html += '<li class="open"><span class="what">Now</span><span class="when"></span><span class="gap">for ' +
        C.duration(C.since(previous)) + "</span></li>";
    }
    $("timeline").innerHTML = html;
  }

  function renderAllocations(job) {
    // The current attempt's GPUs first, then each earlier attempt's.
    var rows = job.allocations.slice().sort(function (a, b) {
      return b.attempt - a.attempt || (a.released_at ? 1 : 0) - (b.released_at ? 1 : 0) || a.rank - b.rank ||
        a.node.localeCompare(b.node) || a.gpu_index - b.gpu_index;
    }).map(function (a) {
      var duty = a.released_at ? "—" : a.duty_cycle.toFixed(2) +
        (a.duty_cycle <= 0 ? ' <span class="cls cls-opportunistic">suspended</span>'
          : a.duty_cycle < 1 ? ' <span class="cls cls-opportunistic">throttled</span>' : "");
      return '<tr class="' + (a.released_at ? "released" : "") + '"><td class="num">' + (a.attempt || "—") +
        '</td><td><a href="' + nodeUrl(a.node) + '">' +
        C.esc(a.node) + '</a></td><td class="num">' + a.gpu_index + "</td><td>" + C.esc(a.gpu_model) +
        "</td><td>" + C.share(a.gpu_milli) + "</td><td>" + C.mib(a.memory_limit_mib) + "</td><td>" + duty +
        '</td><td class="num">' + a.rank + "</td><td>" + clock(a.created_at) + " – " +
        (a.released_at ? clock(a.released_at) : "now") + "</td></tr>";
    });
    $("allocations").tBodies[0].innerHTML = rows.join("");
    $("allocations").hidden = rows.length === 0;
    $("allocations-empty").hidden = rows.length !== 0;
  }

  function renderJob(job) {
    var state = $("job-state");
    state.textContent = C.STATE_LABELS[job.state];
    state.className = "state state-" + job.state.toLowerCase();
    $("pending-box").hidden = !job.pending_reason;
    if (job.pending_reason) { $("pending-message").textContent = job.pending_reason.message; }
    $("cancel-form").hidden = ["PENDING", "PLACED", "RUNNING"].indexOf(job.state) < 0;
    $("job-exit").textContent = job.exit_code == null ? "—" : job.exit_code;
    $("job-peak").textContent = C.mib(job.peak_gpu_memory_mib);
    if (job.run_class) {
      $("job-class").innerHTML = '<span class="cls cls-' + job.run_class + '">' +
        (job.run_class === "guaranteed" ? "Guaranteed" : "Opportunistic") + "</span>" +
        (job.shareable ? " · shares its GPUs" : "");
    }
    $("job-output").textContent = job.output_tail || "";
    $("job-output-empty").hidden = !!job.output_tail;
    renderTimeline(job);
    renderAllocations(job);
    finished = TERMINAL.indexOf(job.state) >= 0;
    renderNotebook(job);
  }

  // A notebook opens only while its job runs (the page may have loaded before it started, and stay
  // open after it ends); the link is there for its owner only, the "only they may" line for others.
  function renderNotebook(job) {
    if (!$("notebook-open")) { return; }
    var running = job.state === "RUNNING", whose = $("notebook-link") || $("notebook-theirs");
    whose.hidden = !running;
    $("notebook-later").hidden = running || finished;
    $("notebook-ended").hidden = !finished;
  }

  function renderChart(series) {
    var chart = $("job-chart");
    var has = series.points.length > 0;
    $("job-chart-empty").hidden = has;
    chart.hidden = !has;
    if (!has) { return; }
    var t = series.points.map(function (p) { return p.t; });
    var traces = [
      {x: t, y: series.points.map(function (p) { return p.mem_max_mib == null ? null : p.mem_max_mib / 1024; }),
       name: "GPU memory (GiB, most on any GPU)", type: "scatter", mode: "lines", line: {color: "#2f6fde", width: 2},
       fill: "tozeroy", fillcolor: "rgba(47,111,222,0.08)", hovertemplate: "%{y:.1f} GiB<extra>memory</extra>"},
      {x: t, y: series.points.map(function (p) { return p.util; }), name: "SM utilisation (%)", yaxis: "y2",
       type: "scatter", mode: "lines", line: {color: "#e07b39", width: 2}, hovertemplate: "%{y:.0f}%<extra>utilisation</extra>"}
    ];
    var shapes = [], notes = [];
    if (series.gpu_memory_mib) {
      var asked = series.gpu_memory_mib / 1024;
      shapes.push({type: "line", xref: "paper", x0: 0, x1: 1, y0: asked, y1: asked,
                   line: {color: "#a12622", dash: "dot", width: 1}});
      notes.push({xref: "paper", x: 0, y: asked, yanchor: "bottom", xanchor: "left", showarrow: false,
                  text: "requested " + C.mib(series.gpu_memory_mib), font: {size: 11, color: "#a12622"}});
    }
    Plotly.react(chart, traces, {
      margin: {l: 56, r: 56, t: 10, b: 40}, height: 300, hovermode: "x unified",
      legend: {orientation: "h", y: 1.12}, shapes: shapes, annotations: notes,
      yaxis: {title: {text: "GiB"}, rangemode: "tozero", gridcolor: "#eef0f4"},
      yaxis2: {title: {text: "%"}, overlaying: "y", side: "right", range: [0, 105], showgrid: false,
               tickvals: [0, 25, 50, 75, 100]},
      xaxis: {type: "date", gridcolor: "#eef0f4"}
    }, C.plotConfig);
  }

  var lastChart = 0, finalChart = false;
  function refresh() {
    return C.getJSON(root.dataset.api).then(function (job) {
      renderJob(job);
      C.updated($("job-updated"));
      if (finalChart) { return; }
      if (job.started_at && (Date.now() - lastChart > 9000 || finished)) {
        lastChart = Date.now();
        finalChart = finished;
        return C.getJSON(root.dataset.metrics).then(renderChart);
      }
    });
  }

  // Live tail: /api/v1/jobs/{id}/logs/ with one cursor per node (?node=&after=), a box per node,
  // while the job runs and a little after it ends (its last output lands moments after its exit).
  var live = $("job-live"), liveCursors = {}, liveBoxes = {}, livePolls = 0, LIVE_CHARS = 256 * 1024;
  var GAP = "[colony: output skipped here: the job wrote faster than it is shown live]\n";
  function liveBox(node, several) {
    if (!liveBoxes[node]) {
      var wrap = document.createElement("div");
      wrap.innerHTML = '<h3 class="live-node"></h3><pre class="output"></pre>';
      wrap.firstChild.textContent = node;
      $("job-live-nodes").appendChild(wrap);
      liveBoxes[node] = {wrap: wrap, pre: wrap.lastChild};
    }
    liveBoxes[node].wrap.firstChild.hidden = !several;
    return liveBoxes[node].pre;
  }
  function appendLive(answer) {
    var several = answer.nodes.length > 1;
    answer.chunks.forEach(function (chunk) {
      var pre = liveBox(chunk.node, several), atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      var text = pre.textContent + (chunk.gap ? GAP : "") + chunk.data;
      pre.textContent = text.length > LIVE_CHARS ? text.slice(text.length - LIVE_CHARS) : text;
      if (atBottom) { pre.scrollTop = pre.scrollHeight; }
      liveCursors[chunk.node] = chunk.id;
    });
    answer.nodes.forEach(function (node) {  // a node seen for the first time: all of its output next
      if (!(node in liveCursors)) { liveCursors[node] = ""; }
    });
    if (answer.chunks.length) { live.hidden = false; }
    return answer;
  }
  function pollLive() {
    if (finished && livePolls > 2) { return Promise.resolve(); }
    if (finished) { livePolls += 1; }
    var url = live.dataset.logs, nodes = Object.keys(liveCursors);
    if (!nodes.length) { return C.getJSON(url).then(appendLive); }  // every node's kept output
    return Promise.all(nodes.map(function (node) {
      var q = "?node=" + encodeURIComponent(node) + (liveCursors[node] ? "&after=" + encodeURIComponent(liveCursors[node]) : "");
      return C.getJSON(url + q).then(appendLive);
    }));
  }
  if (live) { C.poll(pollLive, 2000, function () {}); }

  C.getJSON(root.dataset.metrics).then(renderChart, function () {});
  C.poll(refresh, 3000, function (err) { C.stale($("job-updated"), err); });
})();
