/* Helpers every page script uses: JSON fetching, polling, and the same wording as the
   server-side template filters (agents/units.py, through cluster_ui/templatetags/colony.py).
   No framework, no CDN. */
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

  /* The formatters of agents/units.py, word for word (tests/units/cases.json holds the cases both
     are tested on). Rounding is half up, Math.floor(x + 0.5), on both sides. */
  function halfUp(value) { return Math.floor(value + 0.5); }
  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function duration(seconds) {
    if (seconds == null || seconds === "" || isNaN(seconds)) { return ""; }
    var s = Math.max(0, halfUp(Number(seconds)));
    if (s < 60) { return s + " s"; }
    var m = Math.floor(s / 60); s = s % 60;
    if (m < 60) { return m + " min" + (s ? " " + pad(s) + " s" : ""); }
    var h = Math.floor(m / 60); m = m % 60;
    if (h < 48) { return h + " h" + (m ? " " + pad(m) + " min" : ""); }
    return Math.floor(h / 24) + " d" + (h % 24 ? " " + (h % 24) + " h" : "");
  }

  function since(iso, until) {
    if (!iso) { return null; }
    var end = until ? Date.parse(until) : Date.now();
    return (end - Date.parse(iso)) / 1000;
  }

  function scaled(value, names) {
    if (value == null || value === "") { return "—"; }
    var v = Math.max(0, Number(value)), step = 0;
    while (halfUp(v) >= 1024 && step < names.length - 1) { v /= 1024; step += 1; }
    if (step === 0 || v >= 100) { return halfUp(v) + " " + names[step]; }
    var tenths = halfUp(v * 10);
    return Math.floor(tenths / 10) + (tenths % 10 ? "." + (tenths % 10) : "") + " " + names[step];
  }

  function bytes(size) { return scaled(size, ["B", "KiB", "MiB", "GiB", "TiB"]); }
  function mib(value) { return scaled(value, ["MiB", "GiB", "TiB"]); }

  /* 1500 -> "1.5", exact: the digits of the thousandths, not of a float. */
  function thousandths(milli) {
    var whole = Math.floor(milli / 1000), rest = milli % 1000;
    return rest ? whole + "." + String(1000 + rest).slice(1).replace(/0+$/, "") : String(whole);
  }

  function cores(milli) {
    var text = thousandths(milli);
    return text + (text === "1" ? " CPU core" : " CPU cores");
  }

  function gcd(a, b) { return b ? gcd(b, a % b) : a; }

  function share(milli) {
    if (!milli || milli >= 1000) { return "whole"; }
    var divisor = gcd(milli, 1000);
    return divisor === milli ? "1/" + (1000 / divisor) : thousandths(milli);
  }

  function gpuRequest(job) {
    var text = job.gpu_milli && job.gpu_milli < 1000 ? share(job.gpu_milli) + " GPU"
      : job.gpus + (job.gpus === 1 ? " GPU" : " GPUs");
    if (job.gpu_memory_mib) { text += " × " + mib(job.gpu_memory_mib); }
    return text;
  }

  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
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

  window.Colony = {esc: esc, getJSON: getJSON, poll: poll, duration: duration, since: since, bytes: bytes,
                   mib: mib, cores: cores, share: share, gpuRequest: gpuRequest, stamp: stamp, csrfToken: csrfToken,
                   updated: updated, stale: stale, STATE_LABELS: STATE_LABELS, plotConfig: plotConfig};
})();
