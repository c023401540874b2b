"""The browser's job submission form.

It does no validation of its own beyond turning what a person types ("python train.py --lr 3e-4",
"20 GiB", "4h") into the API's payload: ``clean()`` runs ``JobSubmitSerializer``, the single source
of submission rules, and puts each of its messages on the matching form field. A job submitted here
is refused for exactly the reasons, and in exactly the words, that the REST API would use.
"""

from __future__ import annotations

import re
import shlex

from django import forms

from agents import units
from jobs.api.serializers import JobSubmitSerializer
from jobs.services import code
from jobs.services.submission import tenants_of
from monitoring.services.registry import cluster_inventory

GPU_SHARES = [
    ("1000", "Whole GPUs"),
    ("500", "1/2 of one GPU"),
    ("250", "1/4 of one GPU"),
    ("125", "1/8 of one GPU"),
]
UNFENCED = [
    ("", "As my tenant says"),
    ("yes", "Yes: may share them"),
    ("no", "No: only GPUs that enforce limits"),
]
RUN_AS = [
    ("auto", "Auto: guaranteed within quota, borrow beyond"),
    ("opportunistic", "Spare capacity only (preemptible)"),
]
# Serializer field -> form field, where the form asks in friendlier units.
FIELD_OF = {"gpu_memory_mib": "gpu_memory", "host_memory_mib": "host_memory", "max_runtime_s": "max_runtime",
            "opportunistic_only": "run_as",
            "preempt_grace_s": "preempt_grace", "code": "code_archive", "archive": "code_archive"}
STOP_SIGNALS = [(name, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")]



def _read(text: str, parse) -> tuple[int | None, str | None]:
    """A size or duration as :mod:`agents.units` reads it for the command line too ('20 GiB', a
    bare 20 is GiB; '90m', '1h30m', a bare number refused): (value, None) or (None, the reason)."""
    try:
        return parse(text), None
    except ValueError as exc:
        reason = str(exc)
        return None, f"{reason[:1].upper()}{reason[1:]}."


def _env_lines(text: str) -> tuple[dict[str, str] | None, str | None]:
    """``"EPOCHS=3\nOPTS=-v --x=1"`` -> ({"EPOCHS": "3", "OPTS": "-v --x=1"}, None), or (None, the
    reason). Blank lines are skipped; a value keeps everything after the first ``=`` (spaces too).
    Which names may be set is the serializer's to say, in the API's words."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, equals, value = line.partition("=")
        name = name.strip()
        if not equals or not name:
            return None, f"Line {number}: give NAME=VALUE, e.g. EPOCHS=3 (got {line.strip()!r})."
        if name in env:
            return None, f"Line {number}: {name} is given twice."
        env[name] = value
    return env, None


class LooseMultipleChoiceField(forms.MultipleChoiceField):
    """Checkboxes whose values the serializer judges (so an unknown model reads as the API says)."""

    def valid_value(self, value) -> bool:
        return True


class LooseChoiceField(forms.ChoiceField):
    """A select whose value the serializer judges (a MIG profile gone since the page was drawn reads
    as the API says)."""

    def valid_value(self, value) -> bool:
        return True


class SubmitForm(forms.Form):
    tenant = forms.ChoiceField(required=False, help_text="The tenant whose quota the job uses.")
    name = forms.CharField(required=False, max_length=400,
                           widget=forms.TextInput(attrs={"placeholder": "defaults to the program name"}))
    command = forms.CharField(
        widget=forms.TextInput(attrs={"placeholder": "python train.py --epochs 3", "class": "mono",
                                      "autocomplete": "off", "spellcheck": "false"}),
        help_text="Run without a shell: split into words like a shell would, but no pipes, globs or $VARS.",
    )
    gpus = forms.CharField(initial="1", label="GPUs", widget=forms.NumberInput(attrs={"min": 1}),
                           help_text="All granted at once (a gang).")
    gpu_milli = forms.ChoiceField(choices=GPU_SHARES, initial="1000", label="GPU share",
                                  help_text="A fraction shares one GPU with other jobs.")
    gpu_memory = forms.CharField(required=False, label="GPU memory per GPU",
                                 widget=forms.TextInput(attrs={"placeholder": "e.g. 20 GiB"}))
    cpus = forms.CharField(required=False, label="CPU cores", widget=forms.TextInput(attrs={"placeholder": "default"}),
                           help_text="For the whole job, e.g. 8 or 0.5.")
    host_memory = forms.CharField(required=False, label="Host memory",
                                  widget=forms.TextInput(attrs={"placeholder": "e.g. 64 GiB"}),
                                  help_text="RAM for the whole job.")
    gpu_models = LooseMultipleChoiceField(required=False, label="GPU models", widget=forms.CheckboxSelectMultiple,
                                          help_text="None ticked: any model.")
    mig_profile = LooseChoiceField(required=False, label="MIG instance",
                                    help_text="Run alone on a MIG instance of this profile (1 GPU, whole).")
    accepts_unfenced = forms.ChoiceField(
        choices=UNFENCED, required=False, label="Share unfenced GPUs",
        help_text="GPUs that enforce no memory limits: a neighbour there can make a job run out of memory.")
    run_as = forms.ChoiceField(choices=RUN_AS, initial="auto", label="Class")
    shareable = forms.BooleanField(required=False, label="Let other jobs share my GPUs")
    priority = forms.CharField(initial="0", required=False, widget=forms.NumberInput(attrs={"min": -10, "max": 10}),
                               help_text="-10 to 10; orders jobs within your tenant.")
    max_runtime = forms.CharField(required=False, label="Max runtime",
                                  widget=forms.TextInput(attrs={"placeholder": "e.g. 90m, 4h, 2d"}))
    max_nodes = forms.CharField(required=False, label="Spread over at most",
                                widget=forms.NumberInput(attrs={"min": 1, "placeholder": "any"}),
                                help_text="nodes (1 keeps the gang on one node).")
    profile_key = forms.CharField(required=False, max_length=400,
                                  widget=forms.TextInput(attrs={"placeholder": "e.g. resnet50-bs256"}),
                                  help_text="Runs sharing a key are placed from the recorded profile.")
    code_archive = forms.FileField(required=False, label="Code (.tar.gz)",
                                   help_text="Starts in an unpacked copy; colony submit packs your directory for you.")
    workdir = forms.CharField(required=False, max_length=1024, label="Or start in",
                              widget=forms.TextInput(attrs={"placeholder": "/shared/me/project", "class": "mono"}),
                              help_text="A directory on the node (a shared filesystem).")
    env = forms.CharField(
        required=False, label="Environment variables",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "EPOCHS=3\nWANDB_MODE=offline", "class": "mono",
                                     "spellcheck": "false"}),
        help_text="One NAME=VALUE a line, as colony submit --env takes them.")
    image = forms.CharField(required=False, max_length=255, label="Container image",
                            widget=forms.TextInput(attrs={"placeholder": "pytorch/pytorch:2.4.0-cuda12.1",
                                                          "class": "mono"}))
    venv = forms.CharField(required=False, max_length=1024, label="Virtualenv",
                           widget=forms.TextInput(attrs={"placeholder": "/shared/venvs/torch", "class": "mono"}))
    conda = forms.CharField(required=False, max_length=1024, label="Conda env",
                            widget=forms.TextInput(attrs={"placeholder": "/opt/conda/envs/torch", "class": "mono"}))
    array = forms.CharField(required=False, max_length=200, label="Array",
                            widget=forms.TextInput(attrs={"placeholder": "e.g. 0-99%8"}),
                            help_text="One job per index (COLONY_ARRAY_INDEX); %8: at most 8 at once.")
    after_ok = forms.CharField(required=False, max_length=400, label="After these succeed",
                               widget=forms.TextInput(attrs={"placeholder": "job ids, e.g. 41, 42"}))
    after_any = forms.CharField(required=False, max_length=400, label="After these end",
                                widget=forms.TextInput(attrs={"placeholder": "job ids"}))
    preempt_grace = forms.CharField(required=False, label="Preemption notice",
                                    widget=forms.TextInput(attrs={"placeholder": "e.g. 2m"}),
                                    help_text="Time between the stop signal and SIGKILL, to checkpoint.")
    stop_signal = forms.ChoiceField(choices=STOP_SIGNALS, initial="SIGTERM", label="Stop signal", required=False)
    checkpoints = forms.BooleanField(required=False, label="It checkpoints when told to stop")

    def __init__(self, *args, request, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = request
        mine = list(tenants_of(request.user).order_by("slug").values_list("slug", "name"))
        self.fields["tenant"].choices = [(slug, f"{slug} ({name})") for slug, name in mine]
        if len(mine) == 1:
            self.fields["tenant"].initial = mine[0][0]
        inventory = cluster_inventory()
        self.fields["gpu_models"].choices = [(m, m) for m in sorted(inventory.models)]
        profiles = [(name, f"{name} ({mib // 1024} GiB)") for name, mib in inventory.mig_profiles]
        self.fields["mig_profile"].choices = [("", "None: a whole GPU or a share")] + profiles if profiles else []
        self.validated: dict | None = None

    def payload(self) -> dict:
        """What the API would receive, built from the raw form input."""
        data, payload = self.cleaned_data, {}
        try:
            payload["command"] = shlex.split(data.get("command", ""))
        except ValueError as exc:  # unbalanced quotes
            self.add_error("command", f"Could not split the command into words: {exc}.")
        for name in ("name", "tenant", "profile_key"):
            if data.get(name):
                payload[name] = data[name]
        for name in ("gpus", "priority", "max_nodes"):
            if data.get(name, "").strip():
                payload[name] = data[name].strip()
        payload["gpu_milli"] = data.get("gpu_milli") or "1000"
        if data.get("gpu_memory", "").strip():
            value, problem = _read(data["gpu_memory"], units.parse_size)
            if problem:
                self.add_error("gpu_memory", problem)
            else:
                payload["gpu_memory_mib"] = value
        if data.get("cpus", "").strip():
            payload["cpus"] = data["cpus"].strip()
        if data.get("host_memory", "").strip():
            value, problem = _read(data["host_memory"], units.parse_size)
            if problem:
                self.add_error("host_memory", problem)
            else:
                payload["host_memory_mib"] = value
        if data.get("max_runtime", "").strip():
            value, problem = _read(data["max_runtime"], units.parse_duration)
            if problem:
                self.add_error("max_runtime", problem)
            else:
                payload["max_runtime_s"] = value
        if data.get("gpu_models"):
            payload["gpu_models"] = list(data["gpu_models"])
        if data.get("mig_profile"):
            payload["mig_profile"] = data["mig_profile"]
        if data.get("env", "").strip():
            env, problem = _env_lines(data["env"])
            if problem:
                self.add_error("env", problem)
            else:
                payload["env"] = env
        if data.get("accepts_unfenced") in ("yes", "no"):
            payload["accepts_unfenced"] = data["accepts_unfenced"] == "yes"
        payload["opportunistic_only"] = data.get("run_as") == "opportunistic"
        payload["shareable"] = bool(data.get("shareable"))
        for name in ("workdir", "image", "venv", "conda", "array"):
            if data.get(name, "").strip():
                payload[name] = data[name].strip()
        for name in ("after_ok", "after_any"):
            ids = [word for word in re.split(r"[\s,]+", data.get(name, "")) if word]
            if any(not word.isdigit() for word in ids):
                self.add_error(name, "Give job ids separated by commas, e.g. 41, 42.")
            elif ids:
                payload[name] = [int(word) for word in ids]
        if data.get("preempt_grace", "").strip():
            value, problem = _read(data["preempt_grace"], units.parse_duration)
            if problem:
                self.add_error("preempt_grace", problem)
            else:
                payload["preempt_grace_s"] = value
        payload["stop_signal"] = data.get("stop_signal") or "SIGTERM"
        payload["checkpoints"] = bool(data.get("checkpoints"))
        upload = data.get("code_archive")
        if upload is not None and not self.errors:
            self._store_code(upload, payload)
        return payload

    def _store_code(self, upload, payload: dict) -> None:
        """An archive chosen in the form is stored as the API's upload would be, then named."""
        mine = tenants_of(self.request.user)
        slug = payload.get("tenant")
        candidates = list(mine.filter(slug=slug)[:1] if slug else mine[:2])
        if len(candidates) != 1:
            return  # the serializer says what is wrong with the tenant
        tenant = candidates[0]
        if upload.size > code.MAX_BYTES:
            self.add_error("code_archive",
                           f"The archive has {upload.size} bytes; the most is {code.MAX_BYTES >> 20} MiB.")
            return
        try:
            archive, _ = code.store(tenant, self.request.user, upload.read())
        except code.BadArchive as exc:
            self.add_error("code_archive", str(exc))
            return
        payload["code"] = archive.sha256

    def clean(self):
        super().clean()
        payload = self.payload()
        if self.errors:
            return self.cleaned_data
        serializer = JobSubmitSerializer(data=payload, context={"request": self.request})
        if serializer.is_valid():
            self.validated = serializer.validated_data
        else:
            for field, messages in serializer.errors.items():
                target = FIELD_OF.get(field, field)
                for message in _flatten(messages):
                    self.add_error(target if target in self.fields else None, message)
        return self.cleaned_data


def _flatten(errors) -> list[str]:
    if isinstance(errors, dict):
        return [f"Word {int(key) + 1}: {m}" if str(key).isdigit() else m
                for key, value in errors.items() for m in _flatten(value)]
    if isinstance(errors, list):
        return [m for item in errors for m in _flatten(item)]
    return [str(errors)]
