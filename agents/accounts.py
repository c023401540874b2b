"""Which local account a job runs under, and the environment it starts with.

A job runs as its researcher, as Slurm runs a job as its submitter's uid: the launch names the
submitter (``LaunchJob.user``, and ``posix_user`` where the control plane knows their POSIX name
from the identity provider) and :class:`RunAsPolicy` maps them to a local account: an explicit map
file first (``--account-map``, lines ``colony_user posix_account``), else the same name through
NSS (``/etc/passwd``, LDAP, SSSD), accepted only at or above ``--min-user-uid`` so that a Colony
user called ``postgres`` never becomes the database's account. The operator may also configure a
default account (``--run-as``) and one per tenant (``--run-as-tenant vision=colony-vision``), used
only for submitters with no account of their own (or for every job, ``--user-accounts off``).
The runner hands the account's uid, gid and supplementary groups to ``subprocess.Popen``
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

# Variables a job inherits from the agent's environment when the operator adds nothing: CUDA
# libraries and the locale, and nothing that could hold a secret. Not PATH: the agent's (root's)
# PATH names its own tools (``/root/.cargo/bin``); a job gets :data:`JOB_PATH` instead.
DEFAULT_PASS_ENV = ("LANG", "LANGUAGE", "LC_*", "TZ", "TERM", "LD_LIBRARY_PATH")

# Every job's PATH: the system's directories, after those the operator adds (``--job-path``, say
# a CUDA toolkit's bin). Not the agent's own, which may lead into its account's home.
JOB_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

# How researchers map to accounts (``--user-accounts``): ``nss``, the map file then the same name
# through NSS; ``map``, the map file only; ``off``, only --run-as / --run-as-tenant (one account per tenant).
USER_ACCOUNT_MODES = ("nss", "map", "off")
# The lowest uid a name found through NSS may run a job as (login.defs' UID_MIN): below it are
# system accounts (daemons, databases), never a researcher. The map file may name any but root.
DEFAULT_MIN_USER_UID = 1000

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


def lookup_user(name: str) -> Account | None:
    """The account called ``name`` in the user database (NSS: files, LDAP, SSSD), or None. Only
    by name: a Colony user called ``0`` is no uid."""
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, ValueError):  # ValueError: a NUL in the name
        return None
    groups = sorted({*os.getgrouplist(entry.pw_name, entry.pw_gid), entry.pw_gid})
    return Account(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, groups=tuple(groups), home=entry.pw_dir)


def parse_account_map(text: str, source: str = "account map") -> dict[str, str]:
    """Lines ``colony_user posix_account[:group]`` (``#`` comments, blank lines) -> a dict;
    ValueError names the line at fault."""
    mapping: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ValueError(f"{source}, line {number}: expected COLONY_USER POSIX_ACCOUNT, got {line.strip()!r}")
        user, account = fields
        if mapping.get(user, account) != account:
            raise ValueError(f"{source}, line {number}: user {user!r} is mapped twice "
                             f"({mapping[user]!r} and {account!r})")
        mapping[user] = account
    return mapping


def read_account_map(path: str | os.PathLike) -> dict[str, str]:
    """The map file at ``path`` (:func:`parse_account_map`); ValueError when unreadable."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the account map {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_account_map(text, str(path))


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
    own identity); the bare constructor is for tests that supply accounts directly (it maps no
    researchers unless given ``user_accounts``).

    Accounts are only used when the agent is root; an agent that is not root runs every job as
    itself (``account_for`` returns None).
    """

    default: Account | None = None
    tenants: Mapping[str, Account] = field(default_factory=dict)
    allow_root: bool = False
    #: The agent's effective uid (a parameter so tests can play root or not).
    agent_uid: int = field(default_factory=os.geteuid)
    #: How a launch's submitter maps to an account (:data:`USER_ACCOUNT_MODES`).
    user_accounts: str = "off"
    #: The operator's map file: Colony user -> ``account[:group]``.
    user_map: Mapping[str, str] = field(default_factory=dict)
    min_user_uid: int = DEFAULT_MIN_USER_UID

    @classmethod
    def configure(
        cls,
        run_as: str | None = None,
        tenant_accounts: Mapping[str, str] | None = None,
        *,
        allow_root: bool = False,
        agent_uid: int | None = None,
        user_accounts: str = "nss",
        user_map: Mapping[str, str] | None = None,
        min_user_uid: int = DEFAULT_MIN_USER_UID,
    ) -> RunAsPolicy:
        """Resolve the account names now, so a typo stops the agent at start, not each launch.

        Raises ValueError for unknown users or groups, for root accounts without ``allow_root``,
        and, when the agent is not root, for any account other than the agent's own user. The
        map file's accounts are looked up at each launch (an LDAP directory gains accounts while
        the agent runs), but one naming root is refused now.
        """
        agent_uid = os.geteuid() if agent_uid is None else agent_uid
        if user_accounts not in USER_ACCOUNT_MODES:
            raise ValueError(f"--user-accounts: expected one of {', '.join(USER_ACCOUNT_MODES)}, got {user_accounts!r}")
        if user_map and user_accounts == "off":
            raise ValueError("--account-map is given but --user-accounts is off, so it would never be read")
        if user_accounts == "map" and not user_map:
            raise ValueError("--user-accounts map needs --account-map FILE")
        for user, spec in (user_map or {}).items():
            name = spec.partition(":")[0]
            if name == "root" or name == "0":
                raise ValueError(f"--account-map: user {user!r} is mapped to root; "
                                 "jobs never run as root through the map")
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
        return cls(default=default, tenants=accounts, allow_root=allow_root, agent_uid=agent_uid,
                   user_accounts=user_accounts, user_map=dict(user_map or {}), min_user_uid=min_user_uid)

    @property
    def switches_users(self) -> bool:
        return self.agent_uid == 0

    @property
    def maps_users(self) -> bool:
        """Jobs run as their submitters' own accounts: any number of uids."""
        return self.switches_users and self.user_accounts != "off"

    def account_for(self, tenant: str | None, user: str | None = None,
                    posix_user: str | None = None) -> Account | None:
        """The account to drop to, or None to run as the agent itself; raises :class:`NoAccount`.

        ``user``: the submitter's Colony name; ``posix_user``: their POSIX name as the control
        plane knows it (an identity provider's claim), looked up instead of ``user`` through NSS.
        """
        if not self.switches_users:
            return None
        if user is not None and self.user_accounts != "off":
            account = self._researcher(user, posix_user)
            if account is not None:
                return account
        account = self.tenants.get(tenant) if tenant is not None else None
        account = account or self.default
        if account is not None and not account.is_root:
            return account
        if self.allow_root:
            return None  # the agent is root and was told that root jobs are fine
        if user is not None and self.user_accounts != "off":
            looked = posix_user or user
            how = ("the account map has no entry for it" if self.user_accounts == "map"
                   else f"no account {looked!r} in this node's user database, and the account map has no entry for it")
            raise NoAccount(
                f"no account on this node for user {user!r} ({how}); an operator must create the account "
                "(or list it in --account-map, or configure a fallback with --run-as / --run-as-tenant)"
            )
        whom = f"tenant {tenant!r}" if tenant else "this job"
        raise NoAccount(
            f"the agent runs as root and has no unprivileged account for {whom}; "
            "configure --run-as or --run-as-tenant (or --allow-root-jobs, for a local demo only)"
        )

    def _researcher(self, user: str, posix_user: str | None) -> Account | None:
        """The submitter's own account; None when they have none (the fallback decides)."""
        mapped = self.user_map.get(user)
        if mapped is not None:
            try:
                account = lookup_account(mapped)
            except ValueError as exc:
                raise NoAccount(f"the account map maps user {user!r} to {mapped!r}, but this node has {exc}") from None
            if account.is_root:
                raise NoAccount(f"the account map maps user {user!r} to root; jobs never run as root")
            return account
        if self.user_accounts != "nss":
            return None
        name = posix_user or user
        account = lookup_user(name)
        if account is None:
            return None
        if account.is_root or account.uid < self.min_user_uid:
            raise NoAccount(
                f"user {user!r} maps to {account.name!r} (uid {account.uid}), a system account below "
                f"--min-user-uid {self.min_user_uid}; jobs never run as one (an operator may map the "
                "user explicitly in --account-map)"
            )
        return account

    def describe(self) -> str:
        """One line for the agent's start-up log."""
        if not self.switches_users:
            return "jobs run as the agent's own user (it is not root, so it cannot run them as their researchers)"
        parts = []
        if self.user_accounts == "nss":
            parts.append(f"their researchers' accounts ({'the account map, then ' if self.user_map else ''}"
                         f"the same name through NSS, uid >= {self.min_user_uid})")
        elif self.user_accounts == "map":
            parts.append(f"their researchers' accounts (the account map's {len(self.user_map)} entries)")
        fallback = [f"default {self.default.name}"] if self.default else []
        fallback += [f"{tenant}={account.name}" for tenant, account in sorted(self.tenants.items())]
        if fallback:
            parts.append(("else " if parts else "") + ", ".join(fallback))
        if self.allow_root:
            parts.append("root allowed (--allow-root-jobs)")
        elif not parts:
            return "no run-as account configured: every launch is refused while the agent runs as root"
        return "jobs run as " + "; ".join(parts)


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
    path: Iterable[str] = (),
) -> dict[str, str]:
    """A job's starting environment, before the runner adds Colony's own variables.

    ``PATH``: the operator's ``path`` directories, then :data:`JOB_PATH`; the agent's variables
    named by ``pass_env`` (exact names or shell patterns like ``NCCL_*``; the agent's own PATH
    only if named), never the agent's secrets; then :data:`JOB_DEFAULT_ENV` and the account's
    identity (:func:`identity_environment`); then the job spec's variables (which the node has
    checked: :func:`agents.protocol.identity_env_names`).
    """
    patterns = tuple(pass_env)
    env = {"PATH": os.pathsep.join([*path, *JOB_PATH])}
    env.update({
        name: value
        for name, value in agent_env.items()
        if name not in AGENT_ONLY_ENV and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    })
    env.update(JOB_DEFAULT_ENV)
    env.update(identity)
    env.update(spec_env)
    return env
