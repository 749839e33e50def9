"""Redis ACL users of a crawl, and how a node names a command Redis refuses.

``deploy/users.acl`` is the template of the roles (node, seeder, operator, and
KEDA's trigger when ``CRAWL_KEDA_PASSWORD`` is set; see docs/deploy.md, "Redis
users (ACL)"). Redis' ACL file takes no comments, so
:func:`render` turns the template into a file Redis loads::

    CRAWL_NODE_PASSWORD=... CRAWL_SEEDER_PASSWORD=... CRAWL_OPERATOR_PASSWORD=... \\
    python -m crawlproject.acl shop news > users.acl     # Redis 7
    ... python -m crawlproject.acl --redis-version 6.2 shop news > users.acl

When Redis refuses a call for lack of a permission (``NOPERM``),
:func:`refusal` says what was refused. Redis 6.2 does not name a command
refused inside a Lua script; the only command the scripts call without a key
is ``TIME``, and :func:`probe_script_refusal` asks for it outside a script,
where Redis names it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from redis.exceptions import NoPermissionError, ResponseError

TEMPLATE = Path(__file__).resolve().parents[1] / "deploy" / "users.acl"
ROLES = ("NODE", "SEEDER", "OPERATOR")
#: Roles whose users are written only when their password is given.
OPTIONAL_ROLES = ("KEDA",)
#: Environment variables holding the roles' passwords (hashed into the file).
PASSWORD_ENV = {role: f"CRAWL_{role}_PASSWORD" for role in ROLES + OPTIONAL_ROLES}
ADMIN_PASSWORD_ENV = "CRAWL_ADMIN_PASSWORD"
#: The only command the Lua scripts call with no key (server_now in frontier/lua/lib/clock.lua).
SCRIPT_KEYLESS_COMMANDS = ("time",)
# a name that is a whole ACL key pattern: no glob character, no space, no brace
_SPIDER_NAME = re.compile(r"[A-Za-z0-9_.-]+")

# What Redis says (6.2 and 7.x, top level and inside a script).
_NAMED = re.compile(r"permissions to run the '([^']+)' command")
_KEY = re.compile(r"permissions to access|access at least one of the keys|No permissions to "
                  r"access a key", re.IGNORECASE)
_SCRIPT_COMMAND = "can't run this command"
#: :func:`refusal` of a command refused inside a script, unnamed (Redis 6.2).
SCRIPT_COMMAND_REFUSED = "a command of a Lua script (Redis 6.2 does not say which: ACL LOG does)"


#: The template's Redis 7 rules and what stands for them on Redis 6.2, which has
#: no functions: nodes call the operator's ``SCRIPT LOAD``-ed scripts by SHA.
REDIS_6_RULES = ((" +fcall +fcall_ro ", " +evalsha "),
                 (" -function +function|load", " +script|load"))
#: What Redis 7.2 adds for the node: WAITAOF, with which the frontier's mover
#: waits for its commit to be in the AOF before acting on MongoDB (older Redis
#: has no such command, and an ACL naming it does not load: the mover waits
#: FRONTIER_BACKLOG_SETTLE there instead).
REDIS_72_RULES = ((" +time ", " +time +waitaof "),)


def render(spiders: list[str], passwords: dict[str, str], admin_password: str | None = None,
           template: str | None = None, redis_version: tuple[int, ...] = (7,)) -> str:
    """The ACL file for *spiders*: the template's user lines once per spider,
    passwords (by role: ``NODE``, ``SEEDER``, ``OPERATOR``; ``KEDA``, whose
    user is left out without a password) as SHA-256, and the
    ``default`` user: ``off`` without *admin_password* (a file that leaves it
    out gives it every right and no password). The template is for Redis 7;
    *redis_version* ``(6, 2)`` renders it for Redis 6.2 (:data:`REDIS_6_RULES`),
    ``(7, 2)`` and later add the node's ``WAITAOF`` (:data:`REDIS_72_RULES`)."""
    text = TEMPLATE.read_text() if template is None else template
    lines = [line + " " for line in text.splitlines() if line.startswith("user ")]
    if tuple(redis_version) < (7,):
        for new, old in REDIS_6_RULES:
            lines = [line.replace(new, old) for line in lines]
    if tuple(redis_version) >= (7, 2):
        for old, new in REDIS_72_RULES:   # (the node's line only)
            lines = [line.replace(old, new, 1) if line.startswith("user crawl-node-") else line
                     for line in lines]
    lines = [line.rstrip() for line in lines]
    for role in ROLES:
        if not passwords.get(role):
            raise ValueError(f"no password for the {role.lower()} role ({PASSWORD_ENV[role]})")
    roles = ROLES + tuple(role for role in OPTIONAL_ROLES if passwords.get(role))
    left_out = [f"{role}_PASSWORD_SHA256" for role in OPTIONAL_ROLES if role not in roles]
    lines = [line for line in lines if not any(marker in line for marker in left_out)]
    out = [f"user default on #{_sha256(admin_password)} ~* &* +@all" if admin_password
           else "user default off resetkeys -@all"]
    for spider in spiders:
        if not _SPIDER_NAME.fullmatch(spider):
            raise ValueError(f"spider name {spider!r}: only letters, digits, _ . - in an ACL")
        for line in lines:
            for role in roles:
                line = line.replace(f"{role}_PASSWORD_SHA256", _sha256(passwords[role]))
            out.append(line.replace("SPIDER", spider))
    return "\n".join(out) + "\n"


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def refusal(exc: BaseException) -> str | None:
    """What Redis refused for lack of an ACL permission (``"the 'time'
    command"``, ``"a key"``, :data:`SCRIPT_COMMAND_REFUSED`), or None when
    *exc* is no ACL refusal."""
    if not isinstance(exc, ResponseError):
        return None
    text = str(exc)
    named = _NAMED.search(text)
    if named:
        return f"the {named.group(1).lower()!r} command"
    if _KEY.search(text):
        return "a key"
    if _SCRIPT_COMMAND in text or isinstance(exc, NoPermissionError) or "NOPERM" in text:
        return SCRIPT_COMMAND_REFUSED
    return None


def describe(exc: BaseException, user: str) -> str:
    """*exc*'s type, and for an ACL refusal what was refused and to which
    user (for a log line: never the password)."""
    found = refusal(exc)
    if found is None:
        return type(exc).__name__
    return (f"{type(exc).__name__}: Redis refuses {found} to Redis user {user!r} (NOPERM; "
            "see deploy/users.acl)")


async def probe_script_refusal(client) -> str | None:
    """After Redis 6.2 refused "a command of a Lua script": run the scripts'
    keyless commands outside a script, where a refusal names the command.
    Returns what was refused, or None when those commands are allowed."""
    for command in SCRIPT_KEYLESS_COMMANDS:
        try:
            await client.execute_command(command.upper())
        except ResponseError as exc:
            found = refusal(exc)
            if found:
                return found
        except Exception:  # unreachable now: the next failure tells
            return None
    return None


def redis_user(url: str, params: dict | None = None) -> str:
    """The Redis user a client of *url* (and ``REDIS_PARAMS`` *params*) logs in
    as: the URL's user name, ``username`` of the params, or ``default``."""
    try:
        name = urlsplit(url).username
    except ValueError:
        name = None
    return unquote(name) if name else (params or {}).get("username") or "default"


def main(argv: list[str] | None = None) -> int:
    """``python -m crawlproject.acl [--redis-version 6.2] SPIDER [SPIDER ...]``:
    print the ACL file (for Redis 7 unless told)."""
    spiders = list(sys.argv[1:] if argv is None else argv)
    version = (7,)
    if spiders[:1] == ["--redis-version"] and len(spiders) > 1:
        try:
            version = tuple(int(x) for x in spiders[1].split("."))
        except ValueError:
            spiders = ["-"]
        spiders = spiders[2:]
    if not spiders or any(s.startswith("-") for s in spiders):
        print(__doc__, file=sys.stderr)
        return 2
    passwords = {role: os.environ.get(env, "") for role, env in PASSWORD_ENV.items()}
    try:
        sys.stdout.write(render(spiders, passwords, os.environ.get(ADMIN_PASSWORD_ENV),
                                redis_version=version))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
