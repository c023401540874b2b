/* Node page: live GPU readings from /api/v1/nodes/{name}/ (jobs per GPU are rendered by the server;
   the heatmap below is heatmap.js). */
(function () {
  "use strict";
  var C = window.Colony;
  var table = document.getElementById("node-gpus");
  if (!table) { return; }
  C.poll(function () {
    return C.getJSON(table.dataset.api).then(function (node) {
      node.gpus.forEach(function (gpu) {
        var row = table.querySelector('tr[data-index="' + gpu.index + '"]');
        if (!row) { return; }
        var live = gpu.live;
        row.querySelector(".util").innerHTML = live && live.util_sm != null ?
          '<div class="meter"><span style="width:' + live.util_sm + '%"></span></div> ' + Math.round(live.util_sm) + "%" :
          '<span class="muted">no samples</span>';
        row.querySelector(".mem").textContent = live ? C.mib(live.mem_used_mib) + " of " + C.mib(live.mem_total_mib) : "—";
        row.querySelector(".temp").textContent = live && live.temperature_c != null ? Math.round(live.temperature_c) + " °C" : "—";
        row.querySelector(".power").textContent = live && live.power_w != null ? Math.round(live.power_w) + " W" : "—";
      });
    });
  }, 5000);
})();
