"""``colony submit``: its flags, the job (or array) body they make, the upload of the code it
runs, and the answer in words. Packing lives in ``pack``; nothing here talks HTTP but through
``Client``.

Where the job starts: by default the current directory (or ``--code DIR``) is packed, uploaded
once per distinct content, and unpacked for the job on its node; ``--workdir PATH`` names a
directory already on the nodes (a shared filesystem) and uploads nothing; ``--no-code`` starts the
job in an empty folder, as Colony did before code uploads.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from agents import units
from cluster_ui.cli import pack, script
from cluster_ui.cli.client import ApiError, Client, Usage

# Programs that run the program named after them: a job is better named for what they run.
LAUNCHERS = {"python", "python3", "torchrun", "accelerate", "deepspeed", "bash", "sh", "uv", "srun",
             "mpirun", "horovodrun", "nohup"}
NAMES_SHOWN = 3  # of skipped links, in the upload line
# As the API takes them (jobs/api/serializers.py: ENV_NAME_RE, stop_signal); the API checks the
# rest (names Colony sets itself, how many), and its refusal names the field.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")


def add_arguments(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("--gpus", type=int, default=None, help="GPUs, all granted at once (default 1)")
    submit.add_argument("--gpu-fraction", metavar="F", help="a share of one GPU, e.g. 0.25 or 1/4")
    submit.add_argument("--memory", metavar="SIZE", help="GPU memory needed per GPU, e.g. 20GiB")
    submit.add_argument("--cpus", metavar="N",
                        help="CPU cores for the whole job, e.g. 8 (default: the cluster's per-GPU default)")
    submit.add_argument("--host-memory", metavar="SIZE", help="host memory (RAM) for the whole job, e.g. 64GiB")
    submit.add_argument("--gpu-model", action="append", metavar="MODEL", help="allowed GPU model (repeatable)")
    submit.add_argument("--mig-profile", metavar="PROFILE",
                        help="run alone on a MIG instance of this profile, e.g. 1g.10gb (one GPU)")
    submit.add_argument("--no-unfenced", dest="accepts_unfenced", action="store_false", default=None,
                        help="never share a GPU that enforces no memory limits (default: your tenant's setting)")
    submit.add_argument("--tenant", help="tenant to charge (needed if you belong to several)")
    submit.add_argument("--name", help="job name (default: the program)")
    submit.add_argument("--priority", type=int, help="-10..10, order within your tenant")
    submit.add_argument("--opportunistic", action="store_true", help="run only on spare capacity (preemptible)")
    submit.add_argument("--shareable", action="store_true", help="let other jobs share your GPUs")
    submit.add_argument("--max-runtime", "--time", metavar="DURATION", help="stop after e.g. 90m, 4h, 2d")
    submit.add_argument("--max-nodes", type=int, help="spread a multi-GPU job over at most N nodes")
    submit.add_argument("--profile-key", help="place from the recorded profile of runs with this key")

    code = submit.add_argument_group("code (default: upload the current directory, minus what "
                                     ".gitignore and .colonyignore exclude)")
    where = code.add_mutually_exclusive_group()
    where.add_argument("--code", metavar="DIR", help="upload this directory instead of the current one")
    where.add_argument("--workdir", metavar="PATH", help="start in this directory on the node (shared "
                                                         "filesystem); uploads nothing")
    where.add_argument("--no-code", action="store_true", help="upload nothing; start in an empty folder")

    environment = submit.add_argument_group("environment")
    environment.add_argument("--image", help="container image, run by the node's container runtime")
    python = environment.add_mutually_exclusive_group()
    python.add_argument("--venv", metavar="PATH", help="activate this virtualenv (a path on the node)")
    python.add_argument("--conda", metavar="PATH", help="activate this conda environment (a path on the node)")
    environment.add_argument("--env", action="append", metavar="NAME=VALUE",
                             help="set this environment variable for the job (repeatable)")

    preemption = submit.add_argument_group("preemption")
    preemption.add_argument("--preempt-grace", "--grace", metavar="DURATION",
                            help="warning before a preemption stops the job (the stop signal, and the deadline "
                                 "in the file COLONY_PREEMPT_FILE names), e.g. 90s, 5m")
    preemption.add_argument("--stop-signal", choices=STOP_SIGNALS, metavar="SIGNAL",
                            help=f"sent first when the job is stopped or preempted: {', '.join(STOP_SIGNALS)} "
                                 "(default SIGTERM)")
    preemption.add_argument("--checkpoints", action="store_true",
                            help="the job saves checkpoints, so preempting it loses little")

    batch = submit.add_argument_group("arrays and dependencies")
    batch.add_argument("--array", metavar="SPEC",
                       help="one job per index, e.g. 0-99%%8 (at most 8 at once), 1,3,5-7; index in COLONY_ARRAY_INDEX")
    batch.add_argument("--after-ok", action="append", metavar="ID",
                       help="start after these jobs succeed (repeatable or 41,42); cancelled if one fails")
    batch.add_argument("--after-any", action="append", metavar="ID",
                       help="start after these jobs end, however they end (repeatable or 41,42)")
    submit.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def prepare(args) -> None:
    """Settle the parsed flags before anything is sent: the command after ``--``, a batch
    script's ``#COLONY`` lines and the command that runs it, the GPU count's default."""
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    args.script = None
    code_dir = args.code or os.curdir
    found = script.is_script(args.command[0], code_dir) if args.command else None
    if found is not None:
        batch = script.read(found)
        uploaded = not (args.workdir or args.no_code) and script.inside(found, code_dir)
        if uploaded:
            script.apply(args, batch, add_arguments, _check_line, code_dir)
            args.script = args.command[len(batch.interpreter)]
        elif batch.directives:  # a script meant for Colony that the job would not get
            why = (f"{'--workdir' if args.workdir else '--no-code'} uploads nothing" if args.workdir or args.no_code
                   else f"it is outside the directory being uploaded ({code_dir})")
            raise Usage(f"{args.command[0]} has #COLONY lines, but {why}, so the job would not get it: run it from "
                        "the directory it is in, or give --code DIR with a directory that holds it")
        # else: a program on the nodes (a launcher by its full path, a script on a shared
        # filesystem), run as given, as before batch scripts
    args.gpus_given = args.gpus is not None
    args.gpus = 1 if args.gpus is None else args.gpus


def _check_line(args) -> None:
    """One #COLONY line's values, checked as the command line's are."""
    args.gpus_given = args.gpus is not None
    args.gpus = 1 if args.gpus is None else args.gpus
    job_body(args)


def cmd_submit(client: Client, args) -> tuple[object, str]:
    if not args.command:
        raise Usage("give the command after --, e.g. colony submit --gpus 1 -- python train.py, "
                    "or a batch script: colony submit job.sh")
    body = job_body(args)
    if not (args.workdir or args.no_code):
        body["code"] = upload_code(client, args.code or os.curdir, args.tenant, getattr(args, "script", None))
    answer = client.post("api/v1/jobs/", body)
    if isinstance(answer, dict) and "array" in answer:
        return answer, array_submitted(answer)
    return answer, f"Submitted job {answer['id']} ({answer['name']}) to {answer['tenant']}: {answer['state'].lower()}."


def job_body(args) -> dict:
    """The ``POST /api/v1/jobs/`` body the flags ask for; a bad flag value is a ``Usage``."""
    body: dict = {"command": args.command, "gpus": args.gpus, "name": args.name or default_name(args.command)}
    try:
        if args.gpu_fraction is not None:
            body["gpu_milli"] = units.parse_gpu_share(args.gpu_fraction)
            if args.gpus_given and args.gpus != 1:
                raise Usage("--gpu-fraction is a share of one GPU; leave out --gpus (or say --gpus 1)")
            body["gpus"] = 1
        if args.memory:
            body["gpu_memory_mib"] = units.parse_size(args.memory)
        if args.cpus:
            body["cpus"] = args.cpus
        if args.host_memory:
            body["host_memory_mib"] = units.parse_size(args.host_memory)
        if args.max_runtime:
            body["max_runtime_s"] = units.parse_duration(args.max_runtime)
        if args.preempt_grace:
            body["preempt_grace_s"] = units.parse_duration(args.preempt_grace)
    except ValueError as exc:
        raise Usage(str(exc)) from None
    if args.mig_profile is not None and (args.gpu_fraction is not None or (args.gpus_given and args.gpus != 1)):
        raise Usage("--mig-profile runs the job on one MIG instance, whole; leave out --gpus and --gpu-fraction")
    for field in ("tenant", "priority", "max_nodes", "profile_key", "image", "venv", "conda", "array", "mig_profile",
                  "accepts_unfenced"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    if args.workdir is not None:
        if not os.path.isabs(args.workdir):
            raise Usage(f"--workdir is a path on the node, so give it in full (e.g. /shared/{args.workdir}); "
                        "to upload a local directory use --code DIR")
        body["workdir"] = args.workdir
    if args.gpu_model:
        body["gpu_models"] = args.gpu_model
    if args.env:
        body["env"] = env_vars(args.env)
    if args.stop_signal is not None:
        body["stop_signal"] = args.stop_signal
    for flag, field in (("opportunistic", "opportunistic_only"), ("shareable", "shareable"),
                        ("checkpoints", "checkpoints")):
        if getattr(args, flag):
            body[field] = True
    for flag, field in (("--after-ok", "after_ok"), ("--after-any", "after_any")):
        ids = job_ids(getattr(args, field), flag)
        if ids:
            body[field] = ids
    return body


def env_vars(values: list[str]) -> dict[str, str]:
    """``["EPOCHS=3", "OPTS=-v"]`` -> ``{"EPOCHS": "3", "OPTS": "-v"}``; the value may be empty or hold ``=``."""
    env: dict[str, str] = {}
    for value in values:
        name, equals, text = value.partition("=")
        if not equals:
            raise Usage(f"--env takes NAME=VALUE, e.g. --env EPOCHS=3 (got {value!r})")
        if not ENV_NAME_RE.match(name):
            raise Usage(f"--env: not a variable name: {name!r} (letters, digits and _, not starting with a digit)")
        if name in env:
            raise Usage(f"--env {name} is given twice")
        env[name] = text
    return env


def job_ids(values: list[str] | None, flag: str) -> list[int]:
    """``["41", "42,43"]`` -> ``[41, 42, 43]``: the flag may repeat or take a comma list."""
    ids: list[int] = []
    for value in values or []:
        for part in value.split(","):
            part = part.strip()
            if not part.isdigit():
                raise Usage(f"{flag} takes job ids, e.g. {flag} 41 or {flag} 41,42 (got {value!r})")
            if int(part) not in ids:
                ids.append(int(part))
    return ids


def upload_code(client: Client, directory: str, tenant: str | None, needed: str | None = None) -> str:
    """Pack ``directory``, upload it, say so on stderr (stdout is the answer, for scripts), and
    return the sha256 the server knows the code by. ``needed``: a file the job runs (a batch
    script), refused before anything is sent when the archive would not hold it."""
    try:
        archive = pack.pack(directory)
    except pack.PackError as exc:
        raise Usage(str(exc)) from None
    if needed is not None and needed not in archive.file_names:
        raise Usage(f"{needed} would not be uploaded (a .gitignore or .colonyignore rule leaves it out, or it is "
                    f"a symbolic link), so the job could not run it")
    try:
        status, stored = client.send("POST", "api/v1/code/", archive.data, "application/gzip", {"tenant": tenant})
    except ApiError as exc:
        if exc.status in (404, 405):
            raise ApiError("this Colony server does not take code uploads; give --workdir PATH (code on a "
                           "shared filesystem) or --no-code", status=exc.status, body=exc.body) from None
        raise
    sha256 = (stored or {}).get("sha256") or archive.sha256
    verb = "Uploaded code" if status == 201 else "Code already uploaded"
    line = (f"{verb}: {archive.files:,} file{'s' if archive.files != 1 else ''}, "
            f"{units.format_bytes(len(archive.data))} (sha256 {sha256[:12]}…)")
    line += _skipped(archive.skipped_links, "symbolic link") + _skipped(archive.skipped_special, "special file")
    print(line, file=sys.stderr, flush=True)
    return sha256


def _skipped(names: tuple[str, ...], what: str) -> str:
    if not names:
        return ""
    shown = ", ".join(names[:NAMES_SHOWN]) + (", …" if len(names) > NAMES_SHOWN else "")
    return f"; skipped {len(names)} {what}{'s' if len(names) != 1 else ''} ({shown})"


def array_submitted(answer: dict) -> str:
    array, jobs = answer["array"], answer["jobs"]
    text = f"Submitted array {array['id']}: {len(jobs)} job{'s' if len(jobs) != 1 else ''} ({id_ranges(jobs)})"
    if array.get("max_running"):
        text += f", at most {array['max_running']} at once"
    return text + "."


def id_ranges(ids: list[int]) -> str:
    """``[101, 102, 103, 107]`` -> ``"101-103, 107"``."""
    spans: list[list[int]] = []
    for job_id in sorted(ids):
        if spans and job_id == spans[-1][1] + 1:
            spans[-1][1] = job_id
        else:
            spans.append([job_id, job_id])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)


def default_name(argv: list[str]) -> str:
    """What a person would call the job: ``python train.py`` is "train.py", ``python -m
    pkg.train`` is "pkg.train", ``torchrun --nproc_per_node 8 train.py`` is "train.py"."""
    words = list(argv)
    while words and os.path.basename(words[0]).rstrip("0123456789.") in LAUNCHERS and len(words) > 1:
        words = words[1:]
        while words and words[0].startswith("-"):
            flag = words.pop(0)
            if flag == "-m" and words:
                return words[0][:200]
            if "=" not in flag and words and not words[0].startswith("-") and not _looks_like_program(words[0]):
                words.pop(0)  # the flag's value
    return (os.path.basename(words[0]) if words else os.path.basename(argv[0]))[:200] or "job"


def _looks_like_program(word: str) -> bool:
    return word.endswith((".py", ".sh")) or os.path.basename(word).rstrip("0123456789.") in LAUNCHERS
