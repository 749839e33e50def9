"""crawlctl deploy / schedule / jobs on many scrapyd nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from crawlproject.ops.common import UsageError


# -- scrapyd nodes -------------------------------------------------------------------------
def _targets(args) -> list:
    from crawlproject.scrapyd import targets_from_cfg, targets_from_file

    known = (targets_from_file(args.targets_file, args.project or "crawlproject")
             if args.targets_file
             else targets_from_cfg(args.config))
    if args.project:
        for target in known.values():
            target.project = args.project
    names = args.targets or list(known)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        where = args.targets_file or args.config
        raise UsageError(f"unknown target(s) {', '.join(unknown)} (known in {where}: "
                         f"{', '.join(known) or 'none'})" if unknown else f"no target in {where}")
    return [known[n] for n in names]


def _each_target(targets, action) -> int:
    """Run *action(target)* on every target; name each that failed; 1 if any did."""
    from crawlproject.scrapyd import ScrapydError

    failed = []
    for target in targets:
        try:
            print(action(target))
        except ScrapydError as exc:
            failed.append(target.name)
            print(f"FAILED {exc}", file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} of {len(targets)} target(s) failed: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


def cmd_deploy(args) -> int:
    """Build the egg once, upload it to every target."""
    from crawlproject.scrapyd import build_egg, default_version, upload

    targets = _targets(args)
    version = args.version or default_version()
    egg = Path(args.egg) if args.egg else build_egg(Path(args.config).resolve().parent)
    print(f"egg {egg.name} ({egg.stat().st_size // 1024} KiB), version {version}")

    def one(target):
        data = upload(target, egg, version)
        return f"ok {target.where}: project {data.get('project')} version {version}, " \
               f"spiders {data.get('spiders')}"

    return _each_target(targets, one)


def cmd_schedule(args) -> int:
    """Start SPIDER on every target (one job each)."""
    from crawlproject.scrapyd import schedule

    settings = dict(_pairs(args.set, "-s"))
    spider_args = dict(_pairs(args.arg, "-a"))
    return _each_target(_targets(args), lambda t: (
        f"ok {t.where}: job {schedule(t, args.spider, settings, spider_args)}"))


def cmd_jobs(args) -> int:
    """Pending, running and finished jobs of every target."""
    from crawlproject.scrapyd import jobs

    def one(target):
        data = jobs(target)
        if args.json:
            return json.dumps({"target": target.name, **{k: data.get(k, []) for k in
                                                        ("pending", "running", "finished")}})
        lines = [f"{target.where}: {len(data.get('pending', []))} pending, "
                 f"{len(data.get('running', []))} running, {len(data.get('finished', []))} finished"]
        for state in ("pending", "running", "finished"):
            for job in data.get(state, []):
                lines.append(f"  {state:8} {job.get('spider')} {job.get('id')} "
                             f"{job.get('start_time') or ''} {job.get('end_time') or ''}".rstrip())
        return "\n".join(lines)

    return _each_target(_targets(args), one)


def _pairs(items, flag: str):
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} expects NAME=VALUE, got {item!r}")
        yield name, value


def _add_target_options(p) -> None:
    p.add_argument("targets", nargs="*", help="target names (default: every target)")
    p.add_argument("--config", default="scrapy.cfg",
                   help="scrapy.cfg whose [deploy:NAME] sections are the targets")
    p.add_argument("--targets-file", help="'NAME URL' lines instead of scrapy.cfg")
    p.add_argument("--project", help="scrapyd project name (default: the target's, "
                                     "else crawlproject)")
