/* Nodes page: live utilisation and memory per node from /api/v1/nodes/. */
(function () {
  "use strict";
  var C = window.Colony;
  var table = document.getElementById("nodes");
  if (!table) { return; }
  C.poll(function () {
    return C.getJSON(table.dataset.api).then(function (nodes) {
      nodes.forEach(function (node) {
        var row = table.querySelector('tr[data-node="' + CSS.escape(node.name) + '"]');
        if (!row) { return; }
        var live = node.gpus.map(function (g) { return g.live; }).filter(Boolean);
        var utils = live.map(function (l) { return l.util_sm; }).filter(function (u) { return u != null; });
        var used = live.reduce(function (s, l) { return s + (l.mem_used_mib || 0); }, 0);
        var total = live.reduce(function (s, l) { return s + (l.mem_total_mib || 0); }, 0);
        row.querySelector(".live-util").textContent = utils.length ?
          Math.round(utils.reduce(function (a, b) { return a + b; }, 0) / utils.length) + "% mean of " + utils.length + " GPUs" : "no samples";
        row.querySelector(".live-mem").textContent = total ? C.mib(used) + " of " + C.mib(total) : "—";
      });
      C.updated(document.getElementById("nodes-updated"));
    });
  }, 5000, function (err) { C.stale(document.getElementById("nodes-updated"), err); });
})();
