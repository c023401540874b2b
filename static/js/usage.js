/* Usage page: GPU-hours per day, stacked by tenant; borrowed (opportunistic) hours hatched. */
(function () {
  "use strict";
  var C = window.Colony;
  var chart = document.getElementById("usage-chart");
  if (!chart) { return; }
  // Not the overview's blue/orange, which mean guaranteed/borrowed there.
  var COLORS = ["#2a9d62", "#8a4fc4", "#1f9bb4", "#c23b5d", "#a0782c", "#5b6477", "#d4a017", "#3b7dd8"];

  function draw(report) {
    var tenants = [], days = [];
    report.rows.forEach(function (r) {
      if (tenants.indexOf(r.tenant) < 0) { tenants.push(r.tenant); }
      if (days.indexOf(r.day) < 0) { days.push(r.day); }
    });
    var traces = [];
    tenants.forEach(function (tenant, i) {
      var rows = report.rows.filter(function (r) { return r.tenant === tenant; });
      var color = COLORS[i % COLORS.length];
      traces.push({type: "bar", name: tenant + " guaranteed", legendgroup: tenant, x: rows.map(function (r) { return r.day; }),
                   y: rows.map(function (r) { return r.guaranteed_gpu_hours; }), marker: {color: color},
                   hovertemplate: "%{y:.1f} GPU-h<extra>" + C.esc(tenant) + " guaranteed</extra>"});
      traces.push({type: "bar", name: tenant + " borrowed", legendgroup: tenant, x: rows.map(function (r) { return r.day; }),
                   y: rows.map(function (r) { return r.opportunistic_gpu_hours; }),
                   marker: {color: "#ffffff", line: {color: color, width: 1}, pattern: {shape: "/", fgcolor: color, size: 6}},
                   hovertemplate: "%{y:.1f} GPU-h<extra>" + C.esc(tenant) + " borrowed</extra>"});
    });
    Plotly.react(chart, traces, {
      barmode: "stack", height: 320, margin: {l: 56, r: 16, t: 10, b: 40},
      yaxis: {title: {text: "GPU-hours"}, gridcolor: "#eef0f4", rangemode: "tozero"},
      xaxis: {type: "date", tickformat: "%b %d", dtick: 86400000},
      legend: {orientation: "h", y: 1.15}
    }, C.plotConfig);
  }

  C.poll(function () { return C.getJSON(chart.dataset.api).then(draw); }, 60000);
})();
