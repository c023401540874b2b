"""Which local account a job runs under, and the environment it starts with.

The operator configures the agent with a default account (``--run-as``) and/or one account per
tenant (``--run-as-tenant vision=colony-vision``). :class:`RunAsPolicy` resolves a launch to an
:class:`Account`; the runner hands its uid, gid and supplementary groups to ``subprocess.Popen``
(``user=``, ``group=``, ``extra_groups=``), so the child drops privileges between fork and exec.

The rule that matters: a job never runs as root by accident. An agent running as root with no
account for a launch refuses it (:class:`NoAccount`) unless it was started with
``--allow-root-jobs`` (meant for a local demo only). An agent that is not root cannot switch
users, so its jobs run as itself and a policy naming anyone else is rejected when it is built.

No process handling and no Redis here; this module only reads the user and group databases.
"""

from __future__ import annotations

import fnmatch
import grp
import os
import pwd
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Variables a job inherits from the agent's environment when the operator adds nothing:
# enough to find programs, CUDA libraries and the locale, and nothing that could hold a secret.
DEFAULT_PASS_ENV = ("PATH", "LANG", "LANGUAGE", "LC_*", "TZ", "TERM", "LD_LIBRARY_PATH")

# Set for every job unless its spec says otherwise: a Python job's output reaches its log (and
# the tail the user reads) as it is printed, and is not lost in a buffer when the job is killed.
JOB_DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}

# Never handed to a job, whatever --pass-env says: the Redis URL (often with a password) would let
# a job forge commands for any node.
AGENT_ONLY_ENV = ("COLONY_REDIS_URL", "REDIS_URL")


class NoAccount(RuntimeError):
    """No account may run this launch; the message says why, for the user and the operator."""


@dataclass(frozen=True)
class Account:
    """A local account: what ``Popen(user=, group=, extra_groups=)`` needs, plus its home."""

    name: str
    uid: int
    gid: int
    #: Supplementary groups, always set explicitly: ``extra_groups=None`` would let the job keep
    #: the agent's own supplementary groups.
    groups: tuple[int, ...]
    home: str

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def lookup_account(spec: str) -> Account:
    """``user`` or ``user:group`` (names or numeric ids) -> Account; ValueError says what is wrong.

    Without a group, the account's primary group. Supplementary groups are the user's groups in
    the group database (as ``login`` would set them), plus the chosen group.
    """
    user, _, group = spec.partition(":")
    if not user:
        raise ValueError(f"{spec!r}: expected USER or USER:GROUP")
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise ValueError(f"no such user {user!r}") from None
    gid = entry.pw_gid
    if group:
        try:
            gid = grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
        except (KeyError, OverflowError):
            raise ValueError(f"no such group {group!r}") from None
    groups = sorted({*os.getgrouplist(entry.pw_name, entry.pw_gid), gid})
    return Account(name=entry.pw_name, uid=entry.pw_uid, gid=gid, groups=tuple(groups), home=entry.pw_dir)


def parse_tenant_accounts(values: Iterable[str]) -> dict[str, str]:
    """``["vision=colony-vision,nlp=colony-nlp:gpu"]`` -> ``{"vision": "colony-vision", ...}``."""
    mapping: dict[str, str] = {}
    for value in values:
        for item in filter(None, (part.strip() for part in value.split(","))):
            tenant, sep, account = item.partition("=")
            tenant, account = tenant.strip(), account.strip()
            if not sep or not tenant or not account:
                raise ValueError(f"{item!r}: expected TENANT=USER or TENANT=USER:GROUP")
            if mapping.get(tenant, account) != account:
                raise ValueError(f"tenant {tenant!r} is mapped twice ({mapping[tenant]!r} and {account!r})")
            mapping[tenant] = account
    return mapping


@dataclass(frozen=True)
class RunAsPolicy:
    """Who runs a launch. Build it with :meth:`configure` (which checks it against the agent's
    own identity); the bare constructor is for tests that supply accounts directly.

    ``default`` and ``tenants`` are only used when the agent is root; an agent that is not root
    runs every job as itself (``account_for`` returns None).
    """

    default: Account | None = None
    tenants: Mapping[str, Account] = field(default_factory=dict)
    allow_root: bool = False
    #: The agent's effective uid (a parameter so tests can play root or not).
    agent_uid: int = field(default_factory=os.geteuid)

    @classmethod
    def configure(
        cls,
        run_as: str | None = None,
        tenant_accounts: Mapping[str, str] | None = None,
        *,
        allow_root: bool = False,
        agent_uid: int | None = None,
    ) -> RunAsPolicy:
        """Resolve the account names now, so a typo stops the agent at start, not each launch.

        Raises ValueError for unknown users or groups, for root accounts without ``allow_root``,
        and, when the agent is not root, for any account other than the agent's own user.
        """
        agent_uid = os.geteuid() if agent_uid is None else agent_uid
        specs = {None: run_as} if run_as else {}
        specs.update(tenant_accounts or {})
        accounts: dict[str | None, Account] = {}
        for tenant, spec in specs.items():
            where = "--run-as" if tenant is None else f"--run-as-tenant {tenant}"
            try:
                account = lookup_account(spec)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if account.is_root and not allow_root:
                raise ValueError(f"{where}: refusing to run jobs as root; pass --allow-root-jobs if you mean it")
            if agent_uid != 0 and (account.uid != agent_uid or account.gid != os.getegid()):
                raise ValueError(
                    f"{where}: the agent runs as uid {agent_uid}, not root, so it cannot run jobs as "
                    f"{spec!r}; jobs run as the agent's own user (start the agent as root to switch users)"
                )
            accounts[tenant] = account
        default = accounts.pop(None, None)
        return cls(default=default, tenants=accounts, allow_root=allow_root, agent_uid=agent_uid)

    @property
    def switches_users(self) -> bool:
        return self.agent_uid == 0

    def account_for(self, tenant: str | None) -> Account | None:
        """The account to drop to, or None to run as the agent itself; raises :class:`NoAccount`."""
        if not self.switches_users:
            return None
        account = self.tenants.get(tenant) if tenant is not None else None
        account = account or self.default
        if account is not None and not account.is_root:
            return account
        if self.allow_root:
            return None  # the agent is root and was told that root jobs are fine
        whom = f"tenant {tenant!r}" if tenant else "this job"
        raise NoAccount(
            f"the agent runs as root and has no unprivileged account for {whom}; "
            "configure --run-as or --run-as-tenant (or --allow-root-jobs, for a local demo only)"
        )

    def describe(self) -> str:
        """One line for the agent's start-up log."""
        if not self.switches_users:
            return "jobs run as the agent's own user"
        parts = [f"default {self.default.name}"] if self.default else []
        parts += [f"{tenant}={account.name}" for tenant, account in sorted(self.tenants.items())]
        if self.allow_root:
            parts.append("root allowed (--allow-root-jobs)")
        elif not parts:
            return "no run-as account configured: every launch is refused while the agent runs as root"
        return "jobs run as " + ", ".join(parts)


def identity_environment(account: Account | None, work_dir: str) -> dict[str, str]:
    """``HOME``, ``USER`` and ``LOGNAME`` of the account a job runs as (the agent's own user when
    ``account`` is None). ``HOME`` falls back to the job's working directory when the account's
    home does not exist (system accounts often have ``/nonexistent``)."""
    if account is not None:
        name, home = account.name, account.home
    else:
        try:
            entry = pwd.getpwuid(os.geteuid())
            name, home = entry.pw_name, entry.pw_dir
        except KeyError:  # a uid without a passwd entry (containers)
            name, home = None, ""
    env = {"HOME": home if home and os.path.isdir(home) else work_dir}
    if name:
        env.update(USER=name, LOGNAME=name)
    return env


def job_environment(
    agent_env: Mapping[str, str],
    spec_env: Mapping[str, str],
    identity: Mapping[str, str],
    pass_env: Iterable[str] = DEFAULT_PASS_ENV,
) -> dict[str, str]:
    """A job's starting environment, before the runner adds Colony's own variables.

    The agent's variables named by ``pass_env`` (exact names or shell patterns like ``NCCL_*``),
    never the agent's secrets; then :data:`JOB_DEFAULT_ENV` and the account's identity
    (:func:`identity_environment`); then the job spec's variables (a job may point ``HOME`` at
    its own cache, say).
    """
    patterns = tuple(pass_env)
    env = {
        name: value
        for name, value in agent_env.items()
        if name not in AGENT_ONLY_ENV and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    }
    env.update(JOB_DEFAULT_ENV)
    env.update(identity)
    env.update(spec_env)
    return env
