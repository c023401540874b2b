/* Submit page: keeps the GPU count at 1 when a fraction is chosen, and shows the same request as a
   `colony submit` command line. Validation is the server's (the API's rules and messages). */
(function () {
  "use strict";
  var form = document.getElementById("submit-form");
  var out = document.getElementById("cli-equivalent");
  if (!form) { return; }
  var field = function (name) { return form.elements[name]; };

  function quote(word) { return /^[\w@%+=:,.\/-]+$/.test(word) ? word : "'" + word.replace(/'/g, "'\\''") + "'"; }

  function render() {
    var share = field("gpu_milli").value;
    if (share !== "1000") { field("gpus").value = "1"; }
    field("gpus").readOnly = share !== "1000";
    var args = ["colony", "submit"];
    if (share !== "1000") { args.push("--gpu-fraction", String(Number(share) / 1000)); }
    else { args.push("--gpus", field("gpus").value || "1"); }
    var text = function (name, flag) { var v = field(name) && field(name).value.trim(); if (v) { args.push(flag, quote(v)); } };
    text("gpu_memory", "--memory"); text("name", "--name"); text("max_runtime", "--max-runtime");
    text("max_nodes", "--max-nodes"); text("profile_key", "--profile-key");
    if (field("tenant") && field("tenant").value && field("tenant").type !== "hidden") { args.push("--tenant", field("tenant").value); }
    if (field("priority").value && field("priority").value !== "0") { args.push("--priority", field("priority").value); }
    if (field("run_as").value === "opportunistic") { args.push("--opportunistic"); }
    if (field("shareable").checked) { args.push("--shareable"); }
    if (field("mig_profile") && field("mig_profile").value) { args.push("--mig-profile", quote(field("mig_profile").value)); }
    if (field("accepts_unfenced") && field("accepts_unfenced").value === "no") { args.push("--no-unfenced"); }
    form.querySelectorAll("input[name=gpu_models]:checked").forEach(function (box) { args.push("--gpu-model", box.value); });
    text("cpus", "--cpus"); text("host_memory", "--host-memory");
    text("workdir", "--workdir"); text("image", "--image"); text("venv", "--venv"); text("conda", "--conda");
    // One --env a line, NAME=VALUE as typed (the value keeps its spaces and any further "=").
    (field("env") ? field("env").value.split(/\r?\n/) : []).forEach(function (line) {
      if (!line.trim()) { return; }
      var eq = line.indexOf("=");
      args.push("--env", quote(eq < 0 ? line.trim() : line.slice(0, eq).trim() + "=" + line.slice(eq + 1)));
    });
    text("array", "--array");
    ["after_ok", "after_any"].forEach(function (name) {
      var ids = field(name) ? field(name).value.split(/[\s,]+/).filter(Boolean) : [];
      if (ids.length) { args.push("--" + name.replace("_", "-"), quote(ids.join(","))); }
    });
    text("preempt_grace", "--grace");
    if (field("stop_signal") && field("stop_signal").value && field("stop_signal").value !== "SIGTERM") {
      args.push("--stop-signal", field("stop_signal").value);
    }
    if (field("checkpoints") && field("checkpoints").checked) { args.push("--checkpoints"); }
    args.push("--", field("command").value.trim() || "python train.py");
    out.textContent = args.join(" ");
  }

  form.addEventListener("input", render);
  form.addEventListener("change", render);
  render();
})();
