/* Helpers every page script uses: JSON fetching, polling, and the same wording as the
   server-side template filters (cluster_ui/templatetags/colony.py). No framework, no CDN. */
(function () {
  "use strict";

  function esc(value) {
    return String(value == null ? "" : value).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }

  function getJSON(url) {
    return fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}}).then(function (r) {
      if (!r.ok) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          var message = body && body.error ? body.error.message : r.statusText;
          var error = new Error(message || ("HTTP " + r.status));
          error.status = r.status;
          throw error;
        });
      }
      return r.json();
    });
  }

  /* Run fn() now and every `ms` while the tab is visible; fn returns a promise. After a failure the
     interval doubles (up to a minute) so a down server is not hammered. */
  function poll(fn, ms, onError) {
    var delay = ms, timer = null;
    function tick() {
      timer = null;
      if (document.hidden) { return; }
      Promise.resolve().then(fn).then(function () { delay = ms; }, function (err) {
        delay = Math.min(delay * 2, 60000);
        if (onError) { onError(err); }
      }).then(function () { timer = setTimeout(tick, delay); });
    }
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && timer === null) { tick(); }
    });
    tick();
  }

  function duration(seconds) {
    if (seconds == null || isNaN(seconds)) { return ""; }
    var s = Math.max(0, Math.round(seconds));
    if (s < 60) { return s + " s"; }
    var m = Math.floor(s / 60); s = s % 60;
    if (m < 60) { return m + " min " + (s < 10 ? "0" : "") + s + " s"; }
    var h = Math.floor(m / 60); m = m % 60;
    if (h < 48) { return h + " h " + (m < 10 ? "0" : "") + m + " min"; }
    return Math.floor(h / 24) + " d " + (h % 24) + " h";
  }

  function since(iso, until) {
    if (!iso) { return null; }
    var end = until ? Date.parse(until) : Date.now();
    return (end - Date.parse(iso)) / 1000;
  }

  function mib(value) {
    if (value == null) { return "—"; }
    if (value >= 1024) {
      var g = value / 1024;
      return (g >= 100 || g === Math.round(g) ? g.toFixed(0) : g.toFixed(1)) + " GiB";
    }
    return Math.round(value) + " MiB";
  }

  function share(milli) {
    if (!milli || milli >= 1000) { return "whole"; }
    var fractions = {500: "1/2", 250: "1/4", 125: "1/8", 200: "1/5", 100: "1/10"};
    return fractions[milli] || String(milli / 1000);
  }

  function gpuRequest(job) {
    var text = job.gpu_milli && job.gpu_milli < 1000 ? share(job.gpu_milli) + " GPU"
      : job.gpus + (job.gpus === 1 ? " GPU" : " GPUs");
    if (job.gpu_memory_mib) { text += " × " + mib(job.gpu_memory_mib); }
    return text;
  }

  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  /* Same shape as the templates' "M j, H:i:s", in UTC like the server renders. */
  function stamp(iso) {
    if (!iso) { return "—"; }
    var d = new Date(iso);
    return MONTHS[d.getUTCMonth()] + " " + d.getUTCDate() + ", " + pad(d.getUTCHours()) + ":" +
      pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
  }

  function csrfToken() {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function updated(el) {
    if (el) { el.textContent = "Live · updated " + new Date().toLocaleTimeString(); el.classList.remove("stale"); }
  }

  function stale(el, err) {
    if (el) { el.textContent = "Not updating: " + (err && err.message ? err.message : "server unreachable"); el.classList.add("stale"); }
  }

  var STATE_LABELS = {PENDING: "Pending", PLACED: "Placed", RUNNING: "Running", CANCELLING: "Cancelling",
                      PREEMPTING: "Preempting", SUCCEEDED: "Succeeded", FAILED: "Failed", CANCELLED: "Cancelled",
                      TIMEOUT: "Timed out"};

  var plotConfig = {displaylogo: false, responsive: true,
                    modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d", "toggleSpikelines"]};

  window.Colony = {esc: esc, getJSON: getJSON, poll: poll, duration: duration, since: since, mib: mib,
                   share: share, gpuRequest: gpuRequest, stamp: stamp, csrfToken: csrfToken,
                   updated: updated, stale: stale, STATE_LABELS: STATE_LABELS, plotConfig: plotConfig};
})();
