/* GPU x time heatmap (cluster page and node pages). The matrix comes from /api/v1/metrics/heatmap/,
   the jobs that held each GPU from /api/v1/metrics/occupancy/ (other tenants' jobs come unnamed).
   Hover names the job(s) in a cell; click opens the job when you may see it. */
(function () {
  "use strict";
  var C = window.Colony;
  var box = document.getElementById("heatmap-box");
  if (!box) { return; }
  var $ = function (id) { return document.getElementById(id); };
  var chart = $("heatmap"), info = $("cell-info");
  var state = {range: box.dataset.range, metric: box.dataset.metric};
  var cells = null;  // [row][col] -> list of occupants
  var SCALES = {
    util: [[0, "#f4f8fd"], [0.15, "#d2e3f6"], [0.4, "#7fb0e3"], [0.7, "#2f6fde"], [1, "#0b2a6b"]],
    mem: [[0, "#fbf6fd"], [0.15, "#eadaf3"], [0.4, "#c39ddf"], [0.7, "#8a4fc4"], [1, "#3f1473"]]
  };
  var LABEL = {util: "SM utilisation", mem: "memory used"};

  function query() {
    var q = "?range=" + state.range + "&metric=" + state.metric;
    if (box.dataset.node) { q += "&node=" + encodeURIComponent(box.dataset.node); }
    return q;
  }

  function syncButtons() {
    box.querySelectorAll("[data-range]").forEach(function (b) {
      if (b !== box) { b.classList.toggle("on", b.dataset.range === state.range); }
    });
    box.querySelectorAll("button[data-metric]").forEach(function (b) { b.classList.toggle("on", b.dataset.metric === state.metric); });
  }

  function occupantsByCell(map, occupancy) {
    var starts = map.columns.map(function (c) { return Date.parse(c); });
    var width = map.column_s * 1000, now = Date.now();
    return map.rows.map(function (row) {
      var held = (occupancy.gpus[row.gpu_id] || []).map(function (o) {
        return {o: o, from: Date.parse(o.start), to: o.end ? Date.parse(o.end) : now};
      });
      return starts.map(function (s) {
        var e = s + width, here = [];
        for (var i = 0; i < held.length; i++) {
          if (held[i].from < e && held[i].to > s) { here.push(held[i].o); }
        }
        return here;
      });
    });
  }

  function describe(list) {
    if (!list.length) { return "idle (no job)"; }
    return list.map(function (o) { return C.esc(o.label) + (o.gpu_milli < 1000 ? " · " + C.share(o.gpu_milli) + " GPU" : ""); }).join("<br>");
  }

  function draw(map, occupancy) {
    var empty = map.rows.length === 0;
    $("heatmap-empty").hidden = !empty;
    chart.hidden = empty;
    info.hidden = empty;
    if (empty) { return; }
    cells = occupantsByCell(map, occupancy);
    var rowNames = map.rows.map(function (r) {
      return C.esc(r.node) + " · " + (r.mig_profile ? "MIG " + r.mig_profile + " of GPU " + r.parent_index + " (device " + r.index + ")"
        : "GPU " + r.index) + " (" + r.model + ")";
    });
    var hover = cells.map(function (row, i) {
      return row.map(function (list) { return rowNames[i] + "<br>" + describe(list); });
    });
    var groups = map.groups;
    var note = function (g) { return g.state === "LOST" ? " (lost)" : g.cordoned ? " (cordoned)" : ""; };
    var ticks, tickText;
    if (map.rows.length <= 40) {  // small cluster: name every GPU
      ticks = map.rows.map(function (_, i) { return i; });
      tickText = map.rows.map(function (r, i) {
        var group = groups.filter(function (g) { return g.node === r.node; })[0];
        return (group && group.first_row === i ? r.node + note(group) + " · " : "") +
          (r.mig_profile ? "GPU " + r.parent_index + " · " + r.mig_profile : "GPU " + r.index);
      });
    } else {  // one label per node
      ticks = groups.map(function (g) { return g.first_row + (g.rows - 1) / 2; });
      tickText = groups.map(function (g) { return g.node + (g.rack ? " · " + g.rack : "") + note(g); });
    }
    var shapes = groups.slice(1).map(function (g) {
      return {type: "line", xref: "paper", x0: 0, x1: 1, y0: g.first_row - 0.5, y1: g.first_row - 0.5,
              line: {color: "#ffffff", width: 3}};
    });
    // A cluster that started reporting within the range: show from its first sample, not a grey field.
    var firstData = map.columns.length;
    map.values.forEach(function (row) {
      for (var c = 0; c < firstData; c++) { if (row[c] !== null) { firstData = c; break; } }
    });
    firstData = firstData >= map.columns.length ? 0 : Math.max(0, firstData - Math.ceil(map.columns.length / 50));
    var height = Math.max(260, Math.min(1400, map.rows.length * 16 + 90));
    Plotly.react(chart, [{
      type: "heatmap", z: map.values, x: map.columns, y: map.rows.map(function (_, i) { return i; }),
      text: hover, hovertemplate: "%{text}<br>%{x}<br>" + LABEL[map.metric] + ": %{z:.0f}%<extra></extra>",
      colorscale: SCALES[map.metric], zmin: 0, zmax: 100, xgap: 0, ygap: 1, hoverongaps: false,
      colorbar: {title: {text: map.metric === "util" ? "SM %" : "mem %"}, thickness: 12, len: 0.9}
    }], {
      height: height, margin: {l: 170, r: 20, t: 8, b: 40}, plot_bgcolor: "#eef0f3",
      yaxis: {tickvals: ticks, ticktext: tickText, autorange: "reversed", showgrid: false, zeroline: false,
              fixedrange: true},
      xaxis: {type: "date", showgrid: false, range: [firstData > 0 ? map.columns[firstData] : map.start, map.end]},
      shapes: shapes
    }, C.plotConfig);
    // totals.label counts a GPU split into MIG instances once: "16 GPUs (4 split into 12 MIG instances)".
    var nodes = groups.length;
    $("heatmap-caption").textContent = map.totals.label + " on " + nodes + " node" +
      (nodes === 1 ? "" : "s") + " · " + map.columns.length + " columns of " + C.duration(map.column_s) +
      (firstData > 0 ? " · samples since " + C.stamp(map.columns[firstData]).split(", ")[1] : "");
    if (!chart.dataset.bound) {
      chart.dataset.bound = "1";
      chart.on("plotly_hover", function (ev) { showCell(ev.points[0], false); });
      chart.on("plotly_click", function (ev) { showCell(ev.points[0], true); });
    }
  }

  function showCell(point, open) {
    var row = point.pointIndex[0], col = point.pointIndex[1];
    var list = cells && cells[row] ? cells[row][col] : [];
    var mine = list.filter(function (o) { return o.job != null; });
    if (open && mine.length === 1) {
      window.location.href = box.dataset.jobUrl.replace(/0\/$/, mine[0].job + "/");
      return;
    }
    var text = list.length ? list.map(function (o) {
      return o.job != null ? '<a href="' + box.dataset.jobUrl.replace(/0\/$/, o.job + "/") + '">' + C.esc(o.label) + "</a>"
        : C.esc(o.label);
    }).join(" · ") : "idle (no job)";
    info.innerHTML = "<strong>" + C.esc(point.text.split("<br>")[0]) + "</strong> · " + C.esc(point.x) + " · " + text;
  }

  function refresh() {
    return Promise.all([
      C.getJSON(box.dataset.api + query()),
      C.getJSON(box.dataset.occupancy + query())
    ]).then(function (both) {
      draw(both[0], both[1]);
      C.updated($("heatmap-updated"));
    });
  }

  box.addEventListener("click", function (ev) {
    var b = ev.target.closest("button");
    if (!b) { return; }
    if (b.dataset.range) { state.range = b.dataset.range; }
    if (b.dataset.metric) { state.metric = b.dataset.metric; }
    syncButtons();
    if (!box.dataset.node && window.history.replaceState) {
      window.history.replaceState(null, "", "?range=" + state.range + "&metric=" + state.metric);
    }
    refresh().catch(function (err) { C.stale($("heatmap-updated"), err); });
  });

  syncButtons();
  C.poll(refresh, state.range === "1h" ? 10000 : 30000, function (err) { C.stale($("heatmap-updated"), err); });
})();
